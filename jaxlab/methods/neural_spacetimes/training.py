"""Full-batch training of spacetime embeddings, many replicas at once.

A replica is one (graph, initialisation seed) pair. Every replica of one (model, dim) shares the
compiled step: `chunk_steps` epochs are a `lax.scan` inside one jitted function vmapped over the
replicas, and `core.replicas.run_chunks` runs the chunks with logging, progress and resumable
checkpoints. Each epoch is one step on the whole graph (every edge), as in the paper.

Optimiser (the official settings): gradient-norm clipping at 0.5, then AdamW with lr 1e-4 and
weight decay 0.01 (torch's AdamW default; optax's `adamw` defaults to 1e-4, so it is explicit).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.core import replicas
from jaxlab.methods.neural_spacetimes import models
from jaxlab.methods.neural_spacetimes import objective

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Schedule:
  epochs: int = 5_000
  chunk_epochs: int = 500
  ckpt_every: int = 2_500
  learning_rate: float = 1e-4
  weight_decay: float = 0.01
  clip_norm: float = 0.5


def optimizer(schedule: Schedule) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(schedule.clip_norm),
                     optax.adamw(schedule.learning_rate, weight_decay=schedule.weight_decay))


def _compiled_schedule(schedule: Schedule) -> Schedule:
  """Only what the compiled step depends on (epochs and checkpointing are host-side)."""
  return dataclasses.replace(schedule, epochs=0, ckpt_every=0)


@functools.lru_cache(maxsize=None)
def init_function(spec: models.SpacetimeSpec, schedule: Schedule):
  model, tx = models.spacetime(spec), optimizer(schedule)

  def init_one(key):
    params = model.init(key)
    return {"params": params, "opt_state": tx.init(params)}

  return jax.jit(jax.vmap(init_one))


def replica_chunk(spec: models.SpacetimeSpec, schedule: Schedule):
  """(state, graph, start, stop) -> (state, metrics) for one replica: `chunk_epochs` epochs (those
  at or past `stop` are no-ops, so start/stop are traced and never trigger a recompile), then the
  evaluation metrics of the parameters reached."""
  model, tx = models.spacetime(spec), optimizer(schedule)
  grad_fn = jax.grad(functools.partial(objective.loss_fn, model), has_aux=True)

  def one_replica(state, graph, start, stop):
    def epoch(state, index):
      del index
      grads, metrics = grad_fn(state["params"], graph)
      updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
      return {"params": optax.apply_updates(state["params"], updates),
              "opt_state": opt_state}, metrics

    state, metrics = replicas.scan_chunk(epoch, state, start, stop, schedule.chunk_epochs)
    evaluation = objective.evaluate(model, state["params"], graph)
    return state, {**{f"train/{name}": m for name, m in metrics.items()},
                   **{f"eval/{name}": value for name, value in evaluation.items()}}

  return one_replica


def vectorize(one_replica, sharding: jax.sharding.Sharding | None = None):
  """jit(vmap over replicas), the replica state donated and returned with `sharding`."""
  return jax.jit(jax.vmap(one_replica, in_axes=(0, 0, None, None)), donate_argnums=0,
                 out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def chunk_function(spec: models.SpacetimeSpec, schedule: Schedule,
                   sharding: jax.sharding.Sharding | None = None):
  """The compiled chunk of every replica; cached, so one compile per (spec, shapes)."""
  return vectorize(replica_chunk(spec, schedule), sharding)


@functools.lru_cache(maxsize=None)
def evaluate_function(spec: models.SpacetimeSpec):
  model = models.spacetime(spec)
  return jax.jit(jax.vmap(functools.partial(objective.evaluate, model)))


@dataclasses.dataclass
class FitResult:
  metrics: dict[str, np.ndarray]     # evaluation metrics per replica, [R] each
  history: list[dict[str, Any]]
  params: PyTree                     # replica-stacked final parameters
  wall_s: float
  earlier_s: float


def fit(spec: models.SpacetimeSpec, graphs: objective.GraphArrays, keys: jax.Array,
        schedule: Schedule, *, mesh: jax.sharding.Mesh,
        workdir: str | os.PathLike | None = None, desc: str | None = None,
        progress: bool = True) -> FitResult:
  """Trains one replica per (graphs[r], keys[r]) for `schedule.epochs` full-batch epochs."""
  if graphs.features.shape[0] != keys.shape[0]:
    raise ValueError(f"{graphs.features.shape[0]} graphs but {keys.shape[0]} keys")
  compiled = _compiled_schedule(schedule)
  graphs = replicas.place(graphs, mesh)
  keys = replicas.place(keys, mesh)
  chunk = chunk_function(spec, compiled, replicas.replica_sharding(keys.shape[0], mesh))
  run = replicas.run_chunks(
      lambda: init_function(spec, compiled)(keys),
      lambda state, start, stop: chunk(state, graphs, start, stop),
      steps=schedule.epochs, chunk_steps=schedule.chunk_epochs, ckpt_every=schedule.ckpt_every,
      mesh=mesh, workdir=workdir, desc=desc or f"{spec.kind} dim {spec.dim}",
      progress=progress)
  if run.last_metrics is not None:
    metrics = {name.removeprefix("eval/"): value for name, value in run.last_metrics.items()
               if name.startswith("eval/")}
  else:   # resumed at the end: nothing ran, evaluate the restored parameters
    metrics = jax.device_get(evaluate_function(spec)(run.state["params"], graphs))
  return FitResult(metrics={k: np.asarray(v) for k, v in metrics.items()}, history=run.history,
                   params=run.state["params"], wall_s=run.wall_s, earlier_s=run.earlier_s)
