"""SR-WDRO training: the lam rule, label noise, method parsing, one compile, resume, bad configs."""
from __future__ import annotations

import dataclasses
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import sr_wdro as experiment
from jaxlab.core import config as config_lib
from jaxlab.core import parallel
from jaxlab.methods.sr_wdro import data as data_lib
from jaxlab.methods.sr_wdro import training

ROOT = pathlib.Path(__file__).resolve().parents[3]
TINY = training.Settings(attack_steps=2, hidden=(8,), batch_size=8, epochs=4, eval_every=2,
                         eval_steps=2, lr_milestones=(3,), lam_period=2, weight_iterations=32)


def tiny_data(num_train=24, num_eval=16):
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 1, (num_train + num_eval, data_lib.NUM_FEATURES)).astype(np.float32)
  y = rng.integers(0, data_lib.NUM_CLASSES, num_train + num_eval).astype(np.int32)
  return x[:num_train], y[:num_train], x[num_train:], y[num_train:]


def tiny_inputs(names, y_train):
  specs = [training.parse_method(n) for n in names]
  return training.replica_inputs(specs, list(range(len(specs))), [y_train] * len(specs), TINY)


def lam_state(lam=1.0):
  return {"lam": jnp.float32(lam), "distance_sum": jnp.float32(0.0),
          "distance_count": jnp.int32(0), "iteration": jnp.int32(0)}


def run_lam_rule(distances, learn=True, period=3):
  state = lam_state()
  lams = []
  for distance in distances:
    state = {**state, **training.lam_rule(state, jnp.float32(distance), jnp.float32(0.1),
                                          jnp.asarray(learn), lr=0.02, period=period),
             "iteration": state["iteration"] + 1}
    lams.append(float(state["lam"]))
  return lams


def test_lam_rule_moves_every_period_by_the_mean_distance_since_the_last_move():
  # Iteration 0 moves on its own distance: 1 - 0.02 (0.1 - 0.05) = 0.999. Iteration 3 moves on
  # the mean of iterations 1-3, (0.2 + 0.4 + 0.0) / 3 = 0.2: 0.999 - 0.02 (0.1 - 0.2) = 1.001.
  lams = run_lam_rule([0.05, 0.2, 0.4, 0.0, 0.3])
  np.testing.assert_allclose(lams, [0.999, 0.999, 0.999, 1.001, 1.001], rtol=0, atol=1e-6)


def test_lam_stays_put_when_not_learned():
  assert run_lam_rule([0.05, 0.2, 0.4, 0.0], learn=False) == [1.0] * 4


def test_label_noise_flips_exactly_the_fraction_to_other_classes():
  labels = np.repeat(np.arange(10), 50)
  flipped = data_lib.flip_labels(labels, 0.2, seed=3)
  changed = flipped != labels
  assert changed.sum() == 100
  assert np.all((flipped >= 0) & (flipped < 10))
  np.testing.assert_array_equal(flipped, data_lib.flip_labels(labels, 0.2, seed=3))
  assert not np.array_equal(flipped, data_lib.flip_labels(labels, 0.2, seed=4))
  with pytest.raises(ValueError, match=r"\[0, 1\)"):
    data_lib.flip_labels(labels, 1.0, seed=0)


def test_noise_is_train_only_shared_by_methods_and_differs_by_seed():
  config = config_lib.load_config(ROOT / "configs" / "sr_wdro.py", "smoke")
  config = config_lib.override(config, {"settings": "noisy,clean", "num_seeds": 2})
  specs, settings_names, _ = experiment.options(config)
  y_train = np.repeat(np.arange(10), 50).astype(np.int32)
  rows, labels = experiment.replica_table(config, specs, settings_names, y_train)
  by_row = {(r[0], r[1].name, r[2]): l for r, l in zip(rows, labels)}
  seeds = sorted({r[2] for r in rows if r[0] == "noisy"})
  for seed in seeds:
    noisy = [by_row[("noisy", s.name, seed)] for s in specs]
    assert all(np.array_equal(noisy[0], other) for other in noisy[1:])
    assert (noisy[0] != y_train).sum() == round(config.data.label_noise * y_train.size)
  assert not np.array_equal(by_row[("noisy", "at", seeds[0])], by_row[("noisy", "at", seeds[1])])
  for spec in specs:
    np.testing.assert_array_equal(by_row[("clean", spec.name, config.seed)], y_train)
  # The test split is never touched: digit_arrays returns clean labels for both splits.
  _, y_digits_train, _, y_digits_test = data_lib.digit_arrays(1297)
  assert y_digits_train.size == 500 and y_digits_test.size == 1297


def test_method_names_parse_to_their_traced_numbers():
  assert training.parse_method("at") == training.MethodSpec("at", True, False, 0.0, False)
  assert training.parse_method("sr_wdro_r0.3").radius == pytest.approx(0.3)
  spec = training.parse_method("sr_trades_r1e-2")
  assert spec.trades and spec.learn_lam and spec.radius == pytest.approx(0.01)
  for bad in ("sgd", "sr_wdro_r0", "sr_wdro_r-0.1", "sr_wdro_"):
    with pytest.raises(ValueError, match="unknown method"):
      training.parse_method(bad)


@pytest.mark.parametrize("override, key", [
    ({"methods": "at,sr_wdro_r-0.1"}, "methods"),
    ({"methods": "at,fast_at"}, "methods"),
    ({"attack.epsilon": 0.0}, "attack.epsilon"),
    ({"data.label_noise": 1.0}, "data.label_noise"),
    ({"data.label_noise": -0.1}, "data.label_noise"),
])
def test_bad_config_fails_before_compiling_naming_the_key(override, key, tmp_path):
  config = config_lib.override(
      config_lib.load_config(ROOT / "configs" / "sr_wdro.py", "smoke"), override)
  compiled_before = training.chunk_function.cache_info().currsize
  with pytest.raises(config_lib.ConfigError, match=repr(key)):
    experiment.main(config, str(tmp_path))
  assert training.chunk_function.cache_info().currsize == compiled_before


def test_one_trace_for_every_method_across_chunks():
  x_train, y_train, eval_x, eval_y = tiny_data()
  names = ["erm", "at", "udr", "sr_wdro_r0.3"]
  inputs = tiny_inputs(names, y_train)
  steps_per_epoch = x_train.shape[0] // TINY.batch_size
  chex.clear_trace_counter()   # the counter is keyed by the code: other tests trace it too
  counted = chex.assert_max_traces(training.replica_chunk(TINY, steps_per_epoch), n=1)
  chunk = jax.jit(jax.vmap(counted, in_axes=(0, 0, None, None, None, None, None)))
  state = training.init_function(TINY, steps_per_epoch)(inputs.key)
  for start, stop in ((0, 2), (2, 4)):
    state, metrics = chunk(state, inputs, x_train, eval_x, eval_y, jnp.asarray(start),
                           jnp.asarray(stop))
  chex.clear_trace_counter()
  assert np.all(np.isfinite(metrics["train/loss"]))
  lam = np.asarray(state["lam"])
  # erm (eps 0) and at keep lam at 1; udr and sr_wdro learn it.
  assert lam[0] == 1.0 and lam[1] == 1.0 and lam[2] != 1.0 and lam[3] != 1.0
  # The evaluation ends each chunk; the best epoch is one of the evaluated ones.
  assert np.all((np.asarray(metrics["eval/robust"]) >= 0) & (np.asarray(metrics["eval/robust"]) <= 1))
  assert set(np.asarray(state["best_epoch"]).tolist()) <= {2, 4}
  # r = 0.3 puts more than uniform weight on its largest loss; the others weigh uniformly.
  max_weight = np.asarray(metrics["train/max_weight"])
  np.testing.assert_allclose(max_weight[:3], 1 / TINY.batch_size, rtol=1e-5)
  assert max_weight[3] > 1.2 / TINY.batch_size


def test_stale_weights_are_the_first_batch_weights_reused_by_position():
  x_train, y_train, eval_x, eval_y = tiny_data()
  inputs = tiny_inputs(["sr_wdro_r0.3", "sr_wdro_stale_r0.3"], y_train)
  assert training.parse_method("sr_wdro_stale_r0.3").stale_weights
  steps_per_epoch = x_train.shape[0] // TINY.batch_size
  chunk = jax.jit(jax.vmap(training.replica_chunk(TINY, steps_per_epoch),
                           in_axes=(0, 0, None, None, None, None, None)))
  state = training.init_function(TINY, steps_per_epoch)(inputs.key)
  state, metrics = chunk(state, inputs, x_train, eval_x, eval_y, jnp.asarray(0), jnp.asarray(1))
  first = np.asarray(state["first_batch_weights"])
  # Both replicas record their first batch's weights (non-uniform at r = 0.3), and the stale
  # replica's weight maximum over the epoch is that of the first batch.
  assert np.all(first.max(axis=1) > 1.2 / TINY.batch_size)
  np.testing.assert_allclose(first.sum(axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(metrics["train/max_weight"])[1], first[1].max(),
                             rtol=1e-6)
  state, _ = chunk(state, inputs, x_train, eval_x, eval_y, jnp.asarray(1), jnp.asarray(2))
  np.testing.assert_array_equal(np.asarray(state["first_batch_weights"]), first)


def test_zero_radius_trains_exactly_as_udr():
  x_train, y_train, eval_x, eval_y = tiny_data()
  udr = training.parse_method("udr")
  inputs = training.replica_inputs([udr, dataclasses.replace(udr, radius=0.0)], [0, 0],
                                   [y_train, y_train], TINY)
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  result = training.train(inputs, x_train, eval_x, eval_y, TINY, mesh=mesh, progress=False)
  first, second = jax.tree.map(lambda leaf: leaf[0], result.state), jax.tree.map(
      lambda leaf: leaf[1], result.state)
  chex.assert_trees_all_equal(first["params"], second["params"])


def test_a_run_resumed_with_more_epochs_ends_as_one_run_and_keeps_its_curves(tmp_path):
  x_train, y_train, eval_x, eval_y = tiny_data()
  inputs = tiny_inputs(["at", "sr_wdro_r0.1"], y_train)
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  whole = training.train(inputs, x_train, eval_x, eval_y, TINY, mesh=mesh, progress=False)
  first = training.train(inputs, x_train, eval_x, eval_y, dataclasses.replace(TINY, epochs=3),
                         mesh=mesh, workdir=tmp_path, ckpt_every=2, progress=False)
  np.testing.assert_array_equal(first.curve_epochs, [2, 3])   # a ragged last chunk
  resumed = training.train(inputs, x_train, eval_x, eval_y, TINY, mesh=mesh,
                           workdir=tmp_path, ckpt_every=2, progress=False)
  assert resumed.earlier_s > 0
  chex.assert_trees_all_close(resumed.state["params"], whole.state["params"], rtol=1e-6,
                              atol=1e-7)
  # Epoch 3's record belongs to the shorter run; the resumed one evaluates 2 (read back) and 4.
  np.testing.assert_array_equal(resumed.curve_epochs, [2, 3, 4])
  np.testing.assert_allclose(resumed.curves["robust"][:, [0, 2]], whole.curves["robust"],
                             atol=1e-5)
