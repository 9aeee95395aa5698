"""Reward reductions R^K -> R^m, learned online beside the agent.

Every method is four pure functions over its own state (a pytree):
  observe(state, reward [K]) -> state             every environment step (running statistics)
  update(state, rewards [B, K], key) -> (state, loss)   every `interval` steps, on replayed rewards
  reduce(state, rewards [..., K]) -> [..., m]     what the agent's TD targets see (no gradient)
  matrix(state) -> [m, K]                         the linear map, where there is one

* `ours` (the paper): A = softmax(W) row-wise, positive and row-stochastic, W = 0 at init (A
  uniform), no bias; trained with a decoder m -> 32 -> 32 -> K (ReLU, dropout) to reconstruct the
  raw reward (MSE), Adam with torch-style L2.
* `pca`: Welford mean and covariance of every observed reward; A = the top-m eigenvectors,
  recomputed at each update, applied to centred rewards (signed entries).
* `npca`: A = ReLU(V) maximising tr(A C A^T) - c ||A A^T - I||^2 on the running covariance C.
* `ae`: an unconstrained MLP encoder K -> 32 -> 32 -> m and decoder, MSE.
* `random`: a fixed positive row-stochastic A with Dirichlet(1) rows; `uniform`: A = 1/K (the
  official `random`, the untrained A of `ours`); `none`: the identity (m = K).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlab.zoo import functional
from jaxlab.zoo import mlp

PyTree = Any
METHODS = ("ours", "pca", "ae", "random", "none", "npca", "uniform")
LEARNED = ("ours", "ae", "npca")


@dataclasses.dataclass(frozen=True)
class ReductionSettings:
  method: str
  num_objectives: int = 16
  reduced_dim: int = 4
  hidden: tuple[int, ...] = (32, 32)
  dropout: float = 0.75
  learning_rate: float = 3e-4
  weight_decay: float = 1e-5
  npca_penalty: float = 5e4

  def __post_init__(self):
    if self.method not in METHODS:
      raise ValueError(f"unknown reduction {self.method!r}; choose one of {', '.join(METHODS)}")
    if not 1 <= self.reduced_dim < self.num_objectives:
      raise ValueError(f"need 1 <= reduced_dim < num_objectives, got {self.reduced_dim} and "
                       f"{self.num_objectives}")

  @property
  def output_dim(self) -> int:
    """The dimension the agent works in: K for `none`, else m."""
    return self.num_objectives if self.method == "none" else self.reduced_dim


class Reduction(NamedTuple):
  init: Callable[[jax.Array], PyTree]
  observe: Callable[[PyTree, jax.Array], PyTree]
  update: Callable[[PyTree, jax.Array, jax.Array], tuple[PyTree, jax.Array]]
  reduce: Callable[[PyTree, jax.Array], jax.Array]
  matrix: Callable[[PyTree], jax.Array]


def _decoder(settings: ReductionSettings, in_dim: int, out_dim: int,
             dropout: float) -> functional.Functional:
  return functional.Functional(lambda rngs: mlp.MLP(
      [in_dim, *settings.hidden, out_dim], activation="relu", torch_init=True, dropout=dropout,
      rngs=rngs))


def _optimizer(settings: ReductionSettings) -> optax.GradientTransformation:
  # torch.optim.Adam's weight_decay: L2 added to the gradient before the Adam moments.
  return optax.chain(optax.add_decayed_weights(settings.weight_decay),
                     optax.adam(settings.learning_rate))


def row_stochastic(logits: jax.Array) -> jax.Array:
  return jax.nn.softmax(logits, axis=-1)


def welford(stats: PyTree, reward: jax.Array) -> PyTree:
  """One reward into the running (count, mean, M2) of the reward distribution."""
  count = stats["count"] + 1.0
  delta = reward - stats["mean"]
  mean = stats["mean"] + delta / count
  m2 = stats["m2"] + jnp.outer(delta, reward - mean)
  return {**stats, "count": count, "mean": mean, "m2": m2}


def covariance(stats: PyTree) -> jax.Array:
  """The population covariance (the official running estimate divides by n)."""
  return stats["m2"] / jnp.maximum(stats["count"], 1.0)


def top_eigenvectors(cov: jax.Array, m: int) -> jax.Array:
  """[m, K]: the eigenvectors of the m largest eigenvalues, largest first."""
  _, vectors = jnp.linalg.eigh(cov)
  return vectors[:, ::-1][:, :m].T


def _stats(k: int) -> PyTree:
  return {"count": jnp.float32(0.0), "mean": jnp.zeros(k, jnp.float32),
          "m2": jnp.zeros((k, k), jnp.float32)}


def _no_observe(state, reward):
  del reward
  return state


def _no_update(state, rewards, key):
  del rewards, key
  return state, jnp.float32(0.0)


@functools.lru_cache(maxsize=None)
def make(settings: ReductionSettings) -> Reduction:
  k, m = settings.num_objectives, settings.reduced_dim
  method = settings.method
  tx = _optimizer(settings)

  if method in ("none", "random", "uniform"):
    def init(key):
      if method == "none":
        return {"matrix": jnp.eye(k, dtype=jnp.float32)}
      if method == "uniform":
        return {"matrix": jnp.full((m, k), 1.0 / k, jnp.float32)}
      return {"matrix": jax.random.dirichlet(key, jnp.ones(k), (m,)).astype(jnp.float32)}
    return Reduction(init, _no_observe, _no_update,
                     lambda state, r: r @ state["matrix"].T, lambda state: state["matrix"])

  if method == "pca":
    def init(key):
      del key
      # The official A is 1/K until the first eigendecomposition.
      return {**_stats(k), "matrix": jnp.full((m, k), 1.0 / k, jnp.float32)}

    def update(state, rewards, key):
      del rewards, key
      return {**state, "matrix": top_eigenvectors(covariance(state), m)}, jnp.float32(0.0)

    return Reduction(init, welford, update,
                     lambda state, r: (r - state["mean"]) @ state["matrix"].T,
                     lambda state: state["matrix"])

  if method == "npca":
    def init(key):
      del key
      # The official W = 1/K: every row the same, and the same gradient keeps them so.
      params = {"v": jnp.full((m, k), 1.0 / k, jnp.float32)}
      return {**_stats(k), "params": params, "opt_state": tx.init(params)}

    def npca_loss(params, cov):
      a = jax.nn.relu(params["v"])
      gram = a @ a.T
      return -jnp.trace(a @ cov @ a.T) + settings.npca_penalty * jnp.sum(
          (gram - jnp.eye(m)) ** 2)

    def update(state, rewards, key):
      del rewards, key
      loss, grads = jax.value_and_grad(npca_loss)(state["params"], covariance(state))
      updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
      return {**state, "params": optax.apply_updates(state["params"], updates),
              "opt_state": opt_state}, loss

    def matrix(state):
      return jax.nn.relu(state["params"]["v"])

    return Reduction(init, welford, update,
                     lambda state, r: (r - state["mean"]) @ matrix(state).T, matrix)

  # ours and ae: an encoder (row-stochastic A, or an MLP) and a decoder, trained by MSE.
  decoder = _decoder(settings, m, k, settings.dropout)
  encoder = _decoder(settings, k, m, 0.0) if method == "ae" else None

  def encode(params, r):
    if encoder is None:
      return r @ row_stochastic(params["logits"]).T
    return encoder.apply(params["encoder"], r)

  def init(key):
    encoder_key, decoder_key = jax.random.split(key)
    params = {"decoder": decoder.init(decoder_key)}
    if encoder is None:
      params["logits"] = jnp.zeros((m, k), jnp.float32)
    else:
      params["encoder"] = encoder.init(encoder_key)
    return {"params": params, "opt_state": tx.init(params)}

  def reconstruction_loss(params, rewards, key):
    decoded = decoder.apply(params["decoder"], encode(params, rewards), dropout_key=key)
    return jnp.mean((decoded - rewards) ** 2)

  def update(state, rewards, key):
    loss, grads = jax.value_and_grad(reconstruction_loss)(state["params"], rewards, key)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    return {**state, "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state}, loss

  def matrix(state):
    if encoder is None:
      return row_stochastic(state["params"]["logits"])
    return jnp.full((m, k), jnp.nan, jnp.float32)   # no linear map

  return Reduction(init, _no_observe, update,
                   lambda state, r: jax.lax.stop_gradient(encode(state["params"], r)), matrix)


def reconstruction_mse(reduction: Reduction, state: PyTree, rewards: jax.Array) -> jax.Array:
  """Mean squared error of the best linear reconstruction of `rewards` [N, K] from their
  reductions (least squares with a bias), comparable across methods with and without decoders."""
  reduced = reduction.reduce(state, rewards)
  design = jnp.concatenate([reduced, jnp.ones((reduced.shape[0], 1), reduced.dtype)], axis=1)
  solution, *_ = jnp.linalg.lstsq(design, rewards)
  return jnp.mean((design @ solution - rewards) ** 2)
