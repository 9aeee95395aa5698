"""The one generic training loop: init -> jit(update) -> log / eval / checkpoint -> resume.

A method supplies an `Experiment` of pure functions and data factories; `run` does the rest:

* a `("data",)` mesh over every device; state replicated, batches sharded on their leading axis;
* `jax.jit(update, donate_argnums=0)`, compiled once (fixed batch shapes);
* the per-step key is `fold_in(key(seed), step)`, so a resumed run draws the same randomness;
* metrics to `workdir/metrics.jsonl` and a progress bar (loss, steps/s);
* evaluation every `train.eval_every` steps and at the end;
* orbax checkpoints every `train.ckpt_every` steps and at the end, with the data iterator's state;
* automatic resume from the newest checkpoint in `workdir/checkpoints`;
* a NaN/Inf guard that names the first bad step and never checkpoints a non-finite state.

Methods whose algorithm is not one init/update loop write their own loop from the same pieces
(`parallel`, `checkpoint`, `metrics`, `results`) rather than copying this one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, Iterable, Mapping, Protocol

import jax
import jax.numpy as jnp
import ml_collections

from jaxlab.core import checkpoint as checkpoint_lib
from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import parallel

PyTree = Any
Batch = Mapping[str, Any]
Metrics = Mapping[str, jax.Array]


class StatefulIterator(Protocol):
  """A batch iterator whose position can be saved and restored (grain's iterators are)."""

  def __next__(self) -> Batch: ...

  def get_state(self) -> dict[str, Any]: ...

  def set_state(self, state: dict[str, Any]) -> None: ...


@dataclasses.dataclass(frozen=True)
class Experiment:
  """What a method gives the loop. Every function is pure; nothing holds hidden state.

  init: rng -> state (a pytree of arrays: params, optimiser state, ...).
  update: (state, batch, rng) -> (state, metrics); one optimisation step on a global batch.
  train_data: (process_index, process_count) -> StatefulIterator of host-local batches.
  evaluate: (state, batch) -> metrics averaged over the batch, or None.
  eval_data: (process_index, process_count) -> a fresh iterable of host-local eval batches.
  """
  init: Callable[[jax.Array], PyTree]
  update: Callable[[PyTree, Batch, jax.Array], tuple[PyTree, Metrics]]
  train_data: Callable[[int, int], StatefulIterator]
  evaluate: Callable[[PyTree, Batch], Metrics] | None = None
  eval_data: Callable[[int, int], Iterable[Batch]] | None = None


@dataclasses.dataclass
class TrainResult:
  """`wall_s`: this call's time; `earlier_s`: training time spent by earlier, interrupted or
  finished calls on the same workdir (from the checkpoint), so their sum is the run's cost."""
  state: PyTree
  step: int
  eval_metrics: dict[str, float]
  resumed_from: int | None
  wall_s: float
  earlier_s: float = 0.0


def precision_scope(config: ml_collections.ConfigDict) -> contextlib.AbstractContextManager:
  """Enables float64 for the duration of a run when `config.precision == "float64"`."""
  if config.get("precision", "float32") == "float64":
    return jax.enable_x64(True)
  return contextlib.nullcontext()


def run(experiment: Experiment, config: ml_collections.ConfigDict,
        workdir: str | os.PathLike, *, desc: str = "train") -> TrainResult:
  """Trains `experiment` for `config.train.steps` steps in `workdir`, resuming if possible."""
  with precision_scope(config):
    return _run(experiment, config, os.fspath(workdir), desc)


def _run(experiment: Experiment, config: ml_collections.ConfigDict, workdir: str,
         desc: str) -> TrainResult:
  start_time = time.perf_counter()
  config_lib.validate(config, device_count=jax.device_count())
  train_cfg = config.train
  mesh = parallel.make_mesh(config.mesh)
  state_sharding = parallel.replicated(mesh)
  metrics_lib.write_json(os.path.join(workdir, "config.json"), config.to_dict())

  base_key = jax.random.key(config.seed)
  init_key, train_key = jax.random.split(base_key)
  state_shapes = jax.eval_shape(experiment.init, init_key)
  abstract_state = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=state_sharding), state_shapes)
  data_iter = experiment.train_data(jax.process_index(), jax.process_count())

  checkpointer = checkpoint_lib.Checkpointer(
      os.path.join(workdir, "checkpoints"), max_to_keep=train_cfg.max_to_keep)
  step = checkpointer.latest_step()
  resumed_from = step
  earlier_s = 0.0
  if step is None:
    state = jax.jit(experiment.init, out_shardings=state_sharding)(init_key)
    step = 0
  else:
    state, data_state, meta = checkpointer.restore(step, abstract_state)
    earlier_s = float(meta.get("train_s", 0.0))
    if data_state:
      data_iter.set_state(data_state)

  # The key is an argument, not a closed-over constant, so that runs differing only in their
  # seed lower to the same program (one compile between them with a compilation cache).
  def train_step(state, batch, step, train_key):
    rng = jax.random.fold_in(train_key, step)
    new_state, step_metrics = experiment.update(state, batch, rng)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(jnp.asarray(v)))
                                for v in jax.tree.leaves(step_metrics)] or [jnp.array(True)]))
    return new_state, step_metrics, finite

  train_step = jax.jit(train_step, donate_argnums=0,
                       out_shardings=(state_sharding, state_sharding, state_sharding))
  eval_step = (jax.jit(experiment.evaluate, out_shardings=state_sharding)
               if experiment.evaluate is not None else None)

  def run_eval(state) -> dict[str, float]:
    if eval_step is None or experiment.eval_data is None:
      return {}
    sums: dict[str, float] = {}
    count = 0
    for batch in experiment.eval_data(jax.process_index(), jax.process_count()):
      values = jax.device_get(eval_step(state, parallel.shard_batch(batch, mesh)))
      for name, value in values.items():
        sums[name] = sums.get(name, 0.0) + float(value)
      count += 1
    return {f"eval/{name}": total / max(count, 1) for name, total in sums.items()}

  writer = metrics_lib.MetricWriter(workdir)
  progress = metrics_lib.Progress(train_cfg.steps, initial=min(step, train_cfg.steps), desc=desc,
                                  enabled=train_cfg.progress)
  pending_finite: list[tuple[int, jax.Array]] = []

  def check_pending() -> None:
    flags = jax.device_get([flag for _, flag in pending_finite])
    for (bad_step, _), ok in zip(pending_finite, flags):
      if not ok:
        raise metrics_lib.NonFiniteError(
            f"non-finite training metrics at step {bad_step}; the last checkpoint before this "
            "step is intact (lower the learning rate or check the inputs)")
    pending_finite.clear()

  eval_metrics: dict[str, float] = {}
  step_metrics: Metrics = {}
  try:
    while step < train_cfg.steps:
      batch = parallel.shard_batch(next(data_iter), mesh)
      state, step_metrics, finite = train_step(state, batch, jnp.asarray(step), train_key)
      step += 1
      pending_finite.append((step, finite))
      is_last = step == train_cfg.steps
      if step % train_cfg.log_every == 0 or is_last:
        check_pending()
        host_metrics = jax.device_get(dict(step_metrics))
        metrics_lib.check_finite(host_metrics, step)
        progress.update(step, host_metrics)
        writer.write(step, {**{f"train/{k}": v for k, v in host_metrics.items()},
                            "perf/steps_per_sec": progress.steps_per_sec})
      if experiment.evaluate is not None and (step % train_cfg.eval_every == 0 or is_last):
        eval_metrics = run_eval(state)
        metrics_lib.check_finite(eval_metrics, step)
        writer.write(step, eval_metrics)
      if step % train_cfg.ckpt_every == 0 or is_last:
        check_pending()
        checkpointer.save(step, state, data_state=data_iter.get_state(), meta={
            "step": step, "train_s": earlier_s + time.perf_counter() - start_time})
    if not eval_metrics and experiment.evaluate is not None:
      eval_metrics = run_eval(state)
  finally:
    progress.close()
    writer.close()
    checkpointer.close()
  return TrainResult(state=state, step=step, eval_metrics=eval_metrics,
                     resumed_from=resumed_from, wall_s=time.perf_counter() - start_time,
                     earlier_s=earlier_s)

