"""Training and evaluating one reduction method: its seeds as replicas of one compiled chunk.

Methods differ in the agent's dimension (m, or K for `none`) and in the reduction's state, so
each method compiles its own chunk; its seeds run together under `vmap`, chunked and resumable
through `core.replicas.run_chunks`.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.core import replicas
from jaxlab.methods.reward_reduction import agent
from jaxlab.methods.reward_reduction import reduction as reduction_lib
from jaxlab.methods.reward_reduction import traffic

PyTree = Any


@functools.lru_cache(maxsize=None)
def chunk_function(settings: agent.AgentSettings,
                   sharding: jax.sharding.Sharding | None = None):
  """jit(vmap(one replica's chunk)) over seeds; `start` and `stop` are shared."""
  return jax.jit(jax.vmap(agent.replica_chunk(settings), in_axes=(0, 0, None, None, None)),
                 donate_argnums=0, out_shardings=(sharding, None))


@functools.lru_cache(maxsize=None)
def init_function(settings: agent.AgentSettings):
  """(env_params, keys [S]) -> the seed-stacked initial state. The Q-networks' orthogonal
  kernels are drawn seed by seed outside jit (`agent.q_params` says why), the rest in one
  jit(vmap)."""
  replicas_init = jax.jit(jax.vmap(functools.partial(agent.init_replica, settings),
                                   in_axes=(None, 0, 0)))

  def init(env_params, keys):
    params = [agent.q_params(settings, key) for key in keys]
    return replicas_init(env_params, keys, jax.tree.map(lambda *seeds: jnp.stack(seeds),
                                                        *params))

  return init


def seed_keys(seeds: Sequence[int]) -> jax.Array:
  return jnp.stack([jax.random.key(s) for s in seeds])


@dataclasses.dataclass
class TrainResult:
  state: PyTree            # seed-stacked final state
  history: list[dict]
  wall_s: float
  earlier_s: float


def train(settings: agent.AgentSettings, env_params: traffic.TrafficParams,
          seeds: Sequence[int], *, mesh: jax.sharding.Mesh,
          workdir: str | os.PathLike | None = None, ckpt_every: int | None = None,
          progress: bool = True, desc: str = "reward_reduction") -> TrainResult:
  """`settings.total_steps` environment steps for every seed, resumable from
  `workdir/checkpoints`."""
  keys = replicas.place(jax.random.key_data(seed_keys(seeds)), mesh)
  sharding = replicas.replica_sharding(len(seeds), mesh)
  chunk = chunk_function(settings, sharding)
  init = init_function(settings)

  def init_state():
    return init(env_params, jax.random.wrap_key_data(keys))

  run = replicas.run_chunks(
      init_state,
      lambda state, start, stop: chunk(state, jax.random.wrap_key_data(keys), env_params,
                                       start, stop),
      steps=settings.total_steps, chunk_steps=settings.chunk_steps,
      ckpt_every=ckpt_every or settings.chunk_steps * 5, mesh=mesh, workdir=workdir,
      desc=desc, progress=progress)
  return TrainResult(state=run.state, history=run.history, wall_s=run.wall_s,
                     earlier_s=run.earlier_s)


@functools.lru_cache(maxsize=None)
def evaluation_function(settings: agent.AgentSettings):
  """jit(vmap over seeds of greedy_returns): params [S, ...] -> [S, P, K]."""
  return jax.jit(jax.vmap(functools.partial(agent.greedy_returns, settings),
                          in_axes=(0, None, None, None)))


def evaluate(settings: agent.AgentSettings, params: PyTree, env_params: traffic.TrafficParams,
             preferences: np.ndarray, eval_key: jax.Array) -> np.ndarray:
  """[S, P, K] discounted original returns, one greedy episode per preference; episode p's
  traffic comes from fold_in(eval_key, p) for every seed and method."""
  keys = jnp.stack([jax.random.fold_in(eval_key, p) for p in range(len(preferences))])
  return np.asarray(evaluation_function(settings)(params, env_params,
                                                  jnp.asarray(preferences), keys))


def reduction_matrices(settings: agent.AgentSettings, state: PyTree) -> np.ndarray:
  """[S, m, K] the learned linear maps (NaN where the method has none)."""
  reduction = reduction_lib.make(settings.reduction)
  return np.asarray(jax.vmap(reduction.matrix)(state["reduction"]))
