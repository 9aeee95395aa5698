"""Fitting many independent replicas of one model at once, in scanned chunks.

Some methods do not train one model on a data stream but fit a small model per (dataset, seed): an
estimator per task, an embedding per graph. Their fast form is one jitted function that runs
`chunk_steps` steps of every replica (a `lax.scan` inside `map_replicas` over the leading replica
axis) and compiles once; Python runs only between chunks. This module is the outer loop around
such a function: restore from `workdir/checkpoints`, call the chunk function until `steps`, log a
summary of every chunk to `metrics.jsonl` and the progress bar, checkpoint every `ckpt_every`
steps and at the end. The chunk function must take the step range as traced arguments (`start`,
`stop`) and leave replicas unchanged at steps >= stop, so a ragged last chunk or a resumed run
reuses it, and it should return its state with the input's `replica_sharding` (jit's
`out_shardings`): XLA may otherwise hand back a replicated state, and the next call with a new
sharding compiles again.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.core import checkpoint as checkpoint_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import parallel

PyTree = Any
ChunkFn = Callable[[PyTree, jax.Array, jax.Array], tuple[PyTree, Mapping[str, jax.Array]]]


def mean_ignoring_nan(values: Any) -> float:
  values = np.asarray(values, float)
  return float(np.nanmean(values)) if np.any(np.isfinite(values)) else math.nan


def summarize_replicas(metrics: Mapping[str, np.ndarray]) -> dict[str, float]:
  """Per-replica chunk metrics -> one number each (the mean over replicas, NaNs ignored)."""
  return {name: mean_ignoring_nan(value) for name, value in metrics.items()}


def scan_chunk(step: Callable[[PyTree, jax.Array], tuple[PyTree, Any]], state: PyTree,
               start: jax.Array, stop: jax.Array, length: int) -> tuple[PyTree, Any]:
  """`step(state, index)` for index = start .. start + length - 1 in one `lax.scan`; steps at or
  past `stop` leave the state as it is, so a ragged last chunk reuses the compiled function.
  Returns the state and the metrics of the last step that ran."""
  def body(state, index):
    new_state, metrics = step(state, index)
    active = index < stop
    return jax.tree.map(lambda new, old: jnp.where(active, new, old), new_state, state), metrics

  state, metrics = jax.lax.scan(body, state, start + jnp.arange(length))
  last = jnp.clip(stop - start - 1, 0, length - 1)
  return state, jax.tree.map(lambda m: m[last], metrics)


def runs_replicas_in_turn() -> bool:
  """True on a single CPU device, where `map_replicas` runs one replica at a time."""
  return jax.default_backend() == "cpu" and jax.device_count() == 1


def map_replicas(fn: Callable[..., Any], in_axes: int | None | Sequence[int | None] = 0
                 ) -> Callable[..., Any]:
  """`jax.vmap(fn, in_axes)` over a leading replica axis (outputs stacked on axis 0), except on
  a single CPU device, where it is a `lax.map`: one replica after another in one compiled loop.

  Why: vmapping a step over replicas turns every matmul with per-replica weights into a batched
  matmul, and XLA:CPU runs the gradients of those (a contraction over the token axis with a
  batch axis in front) well below the speed of the same products one replica at a time. Measured
  on 2 cores: a [3, 1280, 64] x [3, 64, 256] layer's forward and backward 3.9 ms vmapped against
  2.9 ms in turn; JetFormer's GMM-AR decoder step (3 seeds) 72 -> 46 ms. On accelerators, and
  when replicas are split over several devices, the batched form is the fast (and the sharded)
  one, so it stays a vmap there. It is not a win for every model: LEAP's 21 replicas of a
  narrower decoder take 177 ms a step vmapped and 185 ms in turn, so that method keeps vmap; use
  it where a benchmark shows the gain. Both give the same values up to float rounding.
  `in_axes`: per argument 0 (replica-stacked) or None (shared); other axes fall back to vmap.
  """
  vmapped = jax.vmap(fn, in_axes=in_axes)

  def mapped(*args):
    axes = ((in_axes,) * len(args) if in_axes is None or isinstance(in_axes, int)
            else tuple(in_axes))
    if len(axes) != len(args):
      raise ValueError(f"in_axes has {len(axes)} entries for {len(args)} arguments")
    if not runs_replicas_in_turn() or any(axis not in (0, None) for axis in axes):
      return vmapped(*args)
    stacked = [index for index, axis in enumerate(axes) if axis == 0]
    if not stacked:
      raise ValueError("map_replicas needs at least one replica-stacked argument (in_axes 0)")

    def one(replica_args):
      full = list(args)
      for index, value in zip(stacked, replica_args):
        full[index] = value
      return fn(*full)

    return jax.lax.map(one, tuple(args[index] for index in stacked))

  return mapped


def num_replicas(tree: PyTree) -> int:
  """R of a replica-stacked tree (every leaf [R, ...])."""
  return int(jax.tree.leaves(tree)[0].shape[0])


def take(tree: PyTree, index: int) -> PyTree:
  """Replica `index` of a replica-stacked tree."""
  return jax.tree.map(lambda leaf: leaf[index], tree)


def replica_sharding(num_replicas: int, mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Replicas split over the data axis when they divide it, else replicated (each replica's
  step is independent, so either placement gives the same result)."""
  return (parallel.data_sharded(mesh) if num_replicas % mesh.devices.size == 0
          else parallel.replicated(mesh))


def padded_count(num_replicas: int, mesh: jax.sharding.Mesh) -> int:
  """The smallest multiple of the mesh size that holds `num_replicas`."""
  size = mesh.devices.size
  return -(-num_replicas // size) * size


def pad(tree: PyTree, mesh: jax.sharding.Mesh) -> PyTree:
  """A replica-stacked tree padded to `padded_count` replicas by repeating its first ones, so
  the replicas shard over every device (the extra ones are computed and dropped: on 2 devices,
  3 replicas as 4 take 2 replica-times instead of 3)."""
  count = num_replicas(tree)
  extra = padded_count(count, mesh) - count
  if not extra:
    return tree
  rows = np.arange(count + extra) % count
  return jax.tree.map(lambda leaf: leaf[rows], tree)


def place(tree: PyTree, mesh: jax.sharding.Mesh) -> PyTree:
  """Replica-stacked arrays [R, ...] placed by `replica_sharding`."""
  return parallel.put(tree, replica_sharding(num_replicas(tree), mesh))


@dataclasses.dataclass
class ChunkedRun:
  state: PyTree                         # the replica-stacked state after the last step
  history: list[dict[str, Any]]         # one summary record per chunk run by this call
  last_metrics: dict[str, np.ndarray] | None   # per-replica metrics of the last chunk run
  wall_s: float = 0.0                   # this call
  earlier_s: float = 0.0                # earlier calls on the same workdir that this one resumed


def run_chunks(init: Callable[[], PyTree], chunk: ChunkFn, *, steps: int, chunk_steps: int,
               ckpt_every: int, mesh: jax.sharding.Mesh,
               workdir: str | os.PathLike | None = None, desc: str = "fit",
               progress: bool = True,
               summarize: Callable[[dict[str, np.ndarray]], dict[str, Any]] = summarize_replicas,
               ) -> ChunkedRun:
  """Runs `chunk(state, start, stop)` from the last checkpoint (or `init()`) up to `steps`.

  `init` returns the replica-stacked initial state (it is only traced abstractly when a
  checkpoint exists). Checkpoints land at multiples of `ckpt_every` that end a chunk, and at
  `steps`; `chunk_steps` should divide `ckpt_every`.
  """
  if chunk_steps <= 0 or steps < 0:
    raise ValueError(f"need chunk_steps > 0 and steps >= 0, got {chunk_steps}, {steps}")
  start_time = time.perf_counter()
  checkpointer = writer = None
  step, state, earlier_s = 0, None, 0.0
  if workdir is not None:
    checkpointer = checkpoint_lib.Checkpointer(os.path.join(os.fspath(workdir), "checkpoints"))
    writer = metrics_lib.MetricWriter(workdir)
    latest = checkpointer.latest_step()
    if latest is not None:
      abstract = jax.eval_shape(init)
      state, _, meta = checkpointer.restore(latest, checkpoint_lib.abstract_like(
          abstract, parallel.replicated(mesh)))
      step, earlier_s = latest, float(meta.get("train_s", 0.0))
  if state is None:
    state = init()
  state = place(state, mesh)

  history: list[dict[str, Any]] = []
  last_metrics = None
  bar = metrics_lib.Progress(steps, initial=min(step, steps), desc=desc, enabled=progress)
  try:
    while step < steps:
      stop = min(step + chunk_steps, steps)
      state, chunk_metrics = chunk(state, jnp.asarray(step), jnp.asarray(stop))
      step = stop
      last_metrics = {k: np.asarray(v) for k, v in parallel.fetch(chunk_metrics).items()}
      record = summarize(last_metrics)
      history.append({"step": step, **record})
      bar.update(step, record)
      if writer is not None:
        writer.write(step, record)
      if checkpointer is not None and (step % ckpt_every == 0 or step == steps):
        checkpointer.save(step, state, meta={
            "step": step, "train_s": earlier_s + time.perf_counter() - start_time})
  finally:
    bar.close()
    if writer is not None:
      writer.close()
    if checkpointer is not None:
      checkpointer.close()
  return ChunkedRun(state=state, history=history, last_metrics=last_metrics,
                    wall_s=time.perf_counter() - start_time, earlier_s=earlier_s)
