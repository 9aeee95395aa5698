"""The shared loop: bit-identical resume, NaN guard, one compile, metrics and evaluation."""
import pathlib
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.core import checkpoint
from jaxlab.core import config as config_lib
from jaxlab.core import metrics
from jaxlab.core import train_loop
from jaxlab.data import pipeline


def toy_config(steps: int, **train):
  c = config_lib.base_config(preset="smoke", seed=0)
  c.train.update({**dict(steps=steps, batch_size=16, log_every=1, eval_every=2, ckpt_every=3,
                         progress=False), **train})
  c.eval.update(dict(batch_size=16))
  return config_lib.finalize(c)


def toy_experiment(nan_at_step: int | None = None, trace_limit: int | None = None):
  """Noisy linear regression; the data order and the per-step key both matter for the result."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(256, 4)).astype(np.float32)
  y = (x @ np.arange(1.0, 5.0) + 0.1 * rng.normal(size=256)).astype(np.float32)
  source = pipeline.InMemorySource({"x": x, "y": y})
  tx = optax.adam(0.05)

  def init(rng):
    params = {"w": jax.random.normal(rng, (4,)), "b": jnp.zeros([])}
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros([], jnp.int32)}

  def loss_fn(params, batch, rng):
    noise = 0.01 * jax.random.normal(rng, batch["y"].shape)   # uses the per-step key
    pred = batch["x"] @ params["w"] + params["b"]
    return jnp.mean((pred - batch["y"] + noise) ** 2)

  def update(state, batch, rng):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch, rng)
    updates, opt_state = tx.update(grads, state["opt_state"])
    params = optax.apply_updates(state["params"], updates)
    if nan_at_step is not None:
      loss = jnp.where(state["step"] + 1 == nan_at_step, jnp.nan, loss)
    return ({"params": params, "opt_state": opt_state, "step": state["step"] + 1},
            {"loss": loss})

  if trace_limit is not None:
    update = chex.assert_max_traces(update, n=trace_limit)

  def evaluate(state, batch):
    return {"mse": loss_fn(state["params"], batch, jax.random.key(0))}

  return train_loop.Experiment(
      init=init, update=update,
      train_data=lambda i, n: pipeline.grain_pipeline(source, batch_size=16, seed=3,
                                                      process_index=i, process_count=n),
      evaluate=evaluate,
      eval_data=lambda i, n: pipeline.grain_pipeline(source, batch_size=16, seed=0,
                                                     shuffle=False, num_epochs=1,
                                                     process_index=i, process_count=n))


def test_resume_after_step_3_matches_uninterrupted_6_steps(tmp_path):
  straight = train_loop.run(toy_experiment(), toy_config(6), tmp_path / "straight")
  first = train_loop.run(toy_experiment(), toy_config(3), tmp_path / "resumed")
  assert first.step == 3 and first.resumed_from is None
  resumed = train_loop.run(toy_experiment(), toy_config(6), tmp_path / "resumed")
  assert resumed.resumed_from == 3 and resumed.step == 6
  assert resumed.earlier_s > 0 and first.earlier_s == 0   # the first call's time is carried
  chex.assert_trees_all_equal(jax.device_get(straight.state), jax.device_get(resumed.state))
  # A different data order (seed) would have given different parameters: the check can fail.
  assert not np.array_equal(jax.device_get(first.state["params"]["w"]),
                            jax.device_get(resumed.state["params"]["w"]))
  logged = [r["step"] for r in metrics.read_jsonl(tmp_path / "resumed") if "train/loss" in r]
  assert logged == [1, 2, 3, 4, 5, 6]


def test_nan_guard_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
  config = toy_config(8, log_every=4, ckpt_every=2)
  with pytest.raises(metrics.NonFiniteError, match=r"at step 3\b"):
    train_loop.run(toy_experiment(nan_at_step=3), config, tmp_path)
  assert checkpoint.latest_step(tmp_path / "checkpoints") == 2


def test_update_compiles_once(tmp_path):
  result = train_loop.run(toy_experiment(trace_limit=1), toy_config(5), tmp_path)
  assert result.step == 5


def test_metrics_eval_and_config_are_written(tmp_path):
  result = train_loop.run(toy_experiment(), toy_config(4), tmp_path)
  records = metrics.read_jsonl(tmp_path)
  assert [r["step"] for r in records if "eval/mse" in r] == [2, 4]
  assert all(np.isfinite(r["train/loss"]) for r in records if "train/loss" in r)
  assert result.eval_metrics["eval/mse"] > 0
  assert (tmp_path / "config.json").exists()
  assert checkpoint.latest_step(tmp_path / "checkpoints") == 4


def test_finished_run_is_not_retrained(tmp_path):
  train_loop.run(toy_experiment(), toy_config(3), tmp_path)
  again = train_loop.run(toy_experiment(trace_limit=0), toy_config(3), tmp_path)
  assert again.resumed_from == 3 and again.step == 3


_TWO_SEEDS_WITH_CACHE = """
import os, sys
sys.path.insert(0, {tests!r})
from jaxlab.core import host
host.enable_compilation_cache({cache!r})
import jax
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)   # the toy compiles fast
from jaxlab.core import train_loop
import test_train_loop as toy
for seed in (0, 1):
  config = toy.toy_config(2).copy_and_resolve_references()
  config.unlock()
  config.seed = seed
  train_loop.run(toy.toy_experiment(), config, os.path.join({work!r}, str(seed)))
  print(len(os.listdir({cache!r})))
"""


def test_runs_differing_only_in_seed_share_one_compiled_step(tmp_path):
  """With the compilation cache on, the second seed's run compiles nothing new: the key is an
  argument of the step, not a constant baked into its program."""
  cache = tmp_path / "xla_cache"
  script = _TWO_SEEDS_WITH_CACHE.format(tests=str(pathlib.Path(__file__).parent),
                                        cache=str(cache), work=str(tmp_path))
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=pathlib.Path(__file__).resolve().parents[2])
  assert result.returncode == 0, result.stderr
  after_first, after_second = map(int, result.stdout.split())
  assert after_first > 0 and after_second == after_first
