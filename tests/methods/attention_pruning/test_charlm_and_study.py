"""The character corpus, the LM's training step and pruned scoring, and the pruning sweep."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import attention_pruning as experiment
from jaxlab.core import config as config_lib
from jaxlab.data import python_docs
from jaxlab.methods.attention_pruning import charlm
from jaxlab.methods.attention_pruning import pruning
from jaxlab.methods.attention_pruning import study
from jaxlab.methods.attention_pruning import synthetic


@functools.lru_cache(maxsize=1)
def corpus():
  return python_docs.char_corpus(0.9)


def smoke_config(**overrides):
  config = config_lib.load_config("configs/attention_pruning.py", "smoke")
  return config_lib.override(config, overrides) if overrides else config


def test_corpus_is_recorded_and_split_without_overlap():
  data = corpus()
  assert data.info["chars"] == len(data.train) + len(data.validation)
  assert len(data.info["sha256"]) == 64 and data.info["python"].count(".") == 2
  assert data.vocab_size == len(set(data.vocabulary)) and 50 < data.vocab_size < 200
  assert abs(len(data.train) / data.info["chars"] - 0.9) < 1e-4
  windows = python_docs.evenly_spaced_windows(data.validation, 4, 16)
  assert windows.shape == (4, 17) and windows.max() < data.vocab_size
  with pytest.raises(ValueError, match="do not fit"):
    python_docs.evenly_spaced_windows(data.validation[:30], 4, 16)


def test_window_starts_are_deterministic_and_in_range():
  starts = charlm.window_starts(np.arange(1000), 5000, 128, seed=3)
  assert starts.min() >= 0 and starts.max() + 129 <= 5000
  np.testing.assert_array_equal(starts, charlm.window_starts(np.arange(1000), 5000, 128, seed=3))
  assert len(np.unique(starts)) > 900


def test_lm_train_step_compiles_once_and_lowers_the_loss():
  config = smoke_config()
  experiment_ = charlm.make_experiment(config, corpus())
  state = experiment_.init(jax.random.key(0))
  update = jax.jit(chex.assert_max_traces(experiment_.update, n=1))
  batches = experiment_.train_data(0, 1)
  batch = {k: jnp.asarray(v) for k, v in next(batches).items()}
  losses = []
  for _ in range(3):
    state, metrics = update(state, batch, jax.random.key(1))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0]


def test_replaced_query_keys_with_the_model_own_factors_leave_the_loss_unchanged():
  config = smoke_config()
  model = charlm.make_model(config, corpus().vocab_size)
  params = model.init(jax.random.key(0))
  windows = python_docs.random_windows(corpus().train, 2, config.data.seq_len, seed=0)
  dense = charlm.bits_per_character(model, params, windows, corpus().vocab_size)
  heads = config.model.num_heads
  own = [charlm.query_key_of_factors(*charlm.attention_kernels(params, layer, heads))
         for layer in range(config.model.depth)]
  merged = [{"merged": jnp.asarray(charlm.merged_matrices(
      *charlm.attention_kernels(params, layer, heads)))} for layer in range(config.model.depth)]
  for query_keys in (own, merged):
    assert charlm.bits_per_character(model, params, windows, corpus().vocab_size,
                                     query_keys) == pytest.approx(dense, rel=1e-5)
  # The attention input the study calibrates on is what the first block's attention sees.
  inputs = charlm.attention_inputs(model, params, windows, corpus().vocab_size)
  assert len(inputs) == config.model.depth and inputs[0].shape == (2, config.data.seq_len, 16)


def test_prune_model_at_zero_sparsity_keeps_the_dense_model():
  config = smoke_config()
  model = charlm.make_model(config, corpus().vocab_size)
  params = model.init(jax.random.key(0))
  calibration = python_docs.random_windows(corpus().train, 2, config.data.seq_len, seed=1)
  validation = python_docs.random_windows(corpus().train, 2, config.data.seq_len, seed=2)
  dense = study.dense_bpc(model, params, validation, corpus().vocab_size)
  for setting in study.SETTINGS:
    for method in ("magnitude", "wanda", "sparsegpt"):
      pruner = study.LayerPruner(setting, method, study.GdOptions(), {})
      found = study.prune_model(model, params, vocab_size=corpus().vocab_size,
                                num_heads=config.model.num_heads, calibration=calibration,
                                validation=validation, pruner=pruner, sparsities=(0.0,),
                                seed_key=0)
      assert found["s0.0"]["bpc"] == pytest.approx(dense, rel=1e-4), (setting, method)
      assert found["s0.0"]["attn_err"] < 1e-4


def test_the_first_layer_descends_once_and_later_layers_for_every_sparsity_at_once():
  config = smoke_config()
  model = charlm.make_model(config, corpus().vocab_size)
  params = model.init(jax.random.key(0))
  windows = python_docs.random_windows(corpus().train, 2, config.data.seq_len, seed=1)
  gd = study.GdOptions(steps=3, iterations=2)
  run = lambda pruner, sparsities: study.prune_model(
      model, params, vocab_size=corpus().vocab_size, num_heads=config.model.num_heads,
      calibration=windows, validation=windows, pruner=pruner, sparsities=sparsities, seed_key=0)
  pruner = study.LayerPruner("factors", "gd_mask", gd, {})
  found = run(pruner, (0.3, 0.6))
  # Layer 0 once for both sparsities; layer 1 once, its two calibration inputs side by side.
  assert sorted(pruner._masks) == [(0, 0), (0, 1)] and found["gd_loss_monotone"] in (True, False)
  (layer0_q, _), _ = pruner._masks[(0, 0)]
  (layer1_q, layer1_k), losses = pruner._masks[(0, 1)]
  assert layer0_q.shape[0] == 1 and layer1_q.shape[0] == 2
  assert losses.shape == (2, config.model.num_heads, len(gd.lams), 4)
  for i, sparsity in enumerate((0.3, 0.6)):  # the same masks as one sparsity at a time
    alone = study.LayerPruner("factors", "gd_mask", gd, {})
    assert run(alone, (sparsity,))[f"s{sparsity}"]["bpc"] == pytest.approx(
        found[f"s{sparsity}"]["bpc"], rel=1e-4)
    (alone_q, alone_k), _ = alone._masks[(0, 1)]
    np.testing.assert_allclose(layer1_q[i], alone_q[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(layer1_k[i], alone_k[0], rtol=1e-4, atol=1e-6)
  assert all(np.isfinite(found[k]["bpc"]) and found[k]["attn_err"] > 0 for k in ("s0.3", "s0.6"))
  lams = found["s0.6"]["lam"]  # the lam each head chose, per layer
  assert len(lams) == config.model.depth and all(len(layer) == config.model.num_heads
                                                 for layer in lams)
  assert set(np.ravel(lams)) <= set(pruning.DEFAULT_LAMS)


def test_synthetic_instances_have_the_asked_logit_scale_and_share_draws_across_scales():
  low, high = (synthetic.instance(4, num_tokens=64, width=32, logit_std=c) for c in (0.5, 5.0))
  assert np.std(high.x @ high.w @ high.x.T) == pytest.approx(5.0, rel=1e-4)
  np.testing.assert_allclose(high.w, 10.0 * low.w, rtol=1e-5)
  with pytest.raises(ValueError, match="logit_std"):
    synthetic.instance(0, num_tokens=8, width=4, logit_std=0.0)


def test_monotone_allows_float_rounding_but_not_a_rise():
  assert study.is_monotone(np.array([1.0, 0.5, 0.5 + 1e-8, 0.4]))
  assert not study.is_monotone(np.array([1.0, 0.5, 0.6]))


@pytest.mark.parametrize("overrides, key", [
    ({"sparsities": (0.5, 1.0)}, "sparsities"), ({"methods": "gd_mask,obs"}, "methods"),
    ({"settings": "both"}, "settings"), ({"gd.score": "abs"}, "gd.score"),
    ({"data.calibration_seeds": 1}, "data.calibration_seeds"),
    ({"ablations": "lam_x100"}, "ablations"), ({"gd.lams": ()}, "gd.lams"),
    ({"gd.lams": (0.01, -0.1)}, "gd.lams")])
def test_bad_configs_fail_naming_the_key(overrides, key):
  with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
    experiment.options(smoke_config(**overrides))


def test_ablations_change_one_choice_each():
  base = study.GdOptions()
  for name, change in study.ABLATIONS.items():
    ablated = base.ablated(change)
    differing = [f for f in ("lams", "lam_scale", "score", "keep_values", "causal", "steps")
                 if getattr(ablated, f) != getattr(base, f)]
    assert len(differing) == 1, name
  assert base.ablated({"lam_factor": 10.0}).lams == pytest.approx(
      [10 * lam for lam in pruning.DEFAULT_LAMS])
  assert base.ablated(study.ABLATIONS["fixed_lam"]).lams == (pruning.DEFAULT_LAM,)


def test_f_equals_the_zoo_attention_probabilities_on_the_first_layer():
  config = smoke_config()
  model = charlm.make_model(config, corpus().vocab_size)
  params = model.init(jax.random.key(3))
  windows = python_docs.random_windows(corpus().train, 2, config.data.seq_len, seed=4)
  x = charlm.attention_inputs(model, params, windows, corpus().vocab_size)[0]
  zoo = np.asarray(model.module(params).blocks[0].mixer.probabilities(jnp.asarray(x)))
  merged = charlm.merged_matrices(*charlm.attention_kernels(params, 0, config.model.num_heads))
  for b in range(x.shape[0]):
    for h in range(merged.shape[0]):
      ours = np.asarray(pruning.attention_matrix(x[b], merged[h], causal=True))
      np.testing.assert_allclose(ours, zoo[b, h], atol=1e-6)
