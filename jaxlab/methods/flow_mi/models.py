"""The trainable parts of each estimator, built from zoo layers.

* `JointFlows`: flows f on x and g on y (JVF); identity flows give JVG.
* `NeuralVariational`: a prior flow on x, a posterior flow on x and a Gaussian q(. | y) whose mean
  and Cholesky factor are MLPs of y (NVF); identity flows give NVG.
* `PairCritic`: the bmi-style MLP critic T(x, y) on the concatenation [x, y] used by InfoNCE,
  NWJ, DV and MINE, with a pairwise evaluation that never materialises all N^2 concatenations.
"""
from __future__ import annotations

from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.zoo import flows
from jaxlab.zoo import mlp


class IdentityFlow(nnx.Module):
  """f(x) = x with log-determinant 0 (the G in JVG / NVG)."""

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None):
    del rng
    return x, jnp.zeros(x.shape[:-1], x.dtype)

  def inverse(self, y: jax.Array) -> jax.Array:
    return y


def spline_flow(features: int, *, layers: int, hidden: int, depth: int, num_bins: int,
                bound: float, dropout: float, permutation_seed: int,
                rngs: nnx.Rngs) -> flows.Chain:
  """`layers` x (fixed random permutation -> masked autoregressive RQ-spline layer)."""
  parts: list[nnx.Module] = []
  for layer in range(layers):
    parts.append(flows.Permutation(features, seed=permutation_seed + layer))
    parts.append(flows.MaskedAutoregressiveSpline(
        features, hidden=hidden, depth=depth, num_bins=num_bins, bound=bound,
        dropout=dropout, rngs=rngs))
  return flows.Chain(parts)


def make_flow(features: int, *, use_flow: bool, rngs: nnx.Rngs, permutation_seed: int,
              **flow_options) -> nnx.Module:
  if not use_flow:
    return IdentityFlow()
  return spline_flow(features, permutation_seed=permutation_seed, rngs=rngs, **flow_options)


class JointFlows(nnx.Module):
  """(x [B, dx], y [B, dy]) -> (f(x), log|J_f| [B], g(y), log|J_g| [B])."""

  def __init__(self, dim_x: int, dim_y: int, *, use_flow: bool, rngs: nnx.Rngs, **flow_options):
    self.f = make_flow(dim_x, use_flow=use_flow, rngs=rngs, permutation_seed=0, **flow_options)
    self.g = make_flow(dim_y, use_flow=use_flow, rngs=rngs, permutation_seed=1000,
                       **flow_options)

  def __call__(self, x: jax.Array, y: jax.Array, *, rng: jax.Array | None = None):
    rng_f, rng_g = jax.random.split(rng) if rng is not None else (None, None)
    fx, logdet_f = self.f.forward(x, rng=rng_f)
    gy, logdet_g = self.g.forward(y, rng=rng_g)
    return fx, logdet_f, gy, logdet_g


class NeuralVariational(nnx.Module):
  """Prior flow f_prior(x), posterior flow f_post(x), and q(u | y) = N(m(y), L(y) L(y)^T + 1e-5 I).

  m: MLP dim_y -> 16 -> 8 -> dim_x; L: MLP dim_y -> 16 -> 8 -> dim_x (dim_x + 1) / 2 filling the
  lower triangle, the diagonal through softplus (the official sizes).
  """

  def __init__(self, dim_x: int, dim_y: int, *, use_flow: bool, head_hidden: Sequence[int],
               rngs: nnx.Rngs, **flow_options):
    self.dim_x = dim_x
    self.prior = make_flow(dim_x, use_flow=use_flow, rngs=rngs, permutation_seed=0,
                           **flow_options)
    self.posterior = make_flow(dim_x, use_flow=use_flow, rngs=rngs, permutation_seed=1000,
                               **flow_options)
    self.mean_net = mlp.MLP([dim_y, *head_hidden, dim_x], activation="relu", rngs=rngs)
    self.scale_net = mlp.MLP([dim_y, *head_hidden, dim_x * (dim_x + 1) // 2],
                             activation="relu", rngs=rngs)

  def factor_entries(self, y: jax.Array) -> jax.Array:
    """L(y)'s lower triangle [B, d (d + 1) / 2], rows in order, its diagonal through softplus."""
    rows, cols = np.tril_indices(self.dim_x)
    raw = self.scale_net(y)
    return jnp.where(jnp.asarray(rows == cols), jax.nn.softplus(raw), raw)

  def conditional_moments(self, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean [B, dx] and L's lower-triangle entries [B, dx (dx + 1) / 2] of q(. | y)."""
    return self.mean_net(y), self.factor_entries(y)

  def conditional(self, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean [B, dx] and covariance L L^T + jitter I [B, dx, dx] of q(. | y)."""
    mean, entries = self.conditional_moments(y)
    return mean, covariance_of_factor(entries, self.dim_x)


COVARIANCE_JITTER = 1e-5


def covariance_of_factor(entries: jax.Array, dim: int) -> jax.Array:
  """L L^T + jitter I [..., d, d] from L's lower-triangle entries [..., d (d + 1) / 2]."""
  rows, cols = np.tril_indices(dim)
  lower = jnp.zeros(entries.shape[:-1] + (dim, dim), entries.dtype).at[..., rows, cols].set(
      entries)
  eye = jnp.eye(dim, dtype=entries.dtype).reshape((1,) * (lower.ndim - 2) + (dim, dim))
  return lower @ jnp.swapaxes(lower, -1, -2) + COVARIANCE_JITTER * eye


class PairCritic(nnx.Module):
  """T(x, y) = MLP([x, y]) -> scalar, ReLU, hidden sizes as given (bmi's critic)."""

  def __init__(self, dim_x: int, dim_y: int, *, hidden: Sequence[int], rngs: nnx.Rngs):
    self.dim_x = dim_x
    self.net = mlp.MLP([dim_x + dim_y, *hidden, 1], activation="relu", rngs=rngs)

  def __call__(self, x: jax.Array, y: jax.Array) -> jax.Array:
    """Scores of matching pairs: x [B, dx], y [B, dy] -> [B]."""
    return self.net(jnp.concatenate([x, y], axis=-1))[..., 0]

  def pairwise(self, x: jax.Array, y: jax.Array) -> jax.Array:
    """Scores of every pair: x [A, dx], y [B, dy] -> [A, B].

    The first layer is linear in [x, y], so it is applied to x and y separately and broadcast;
    only the (small) hidden activations are formed per pair.
    """
    layers = list(self.net.layers)
    first = layers[0]
    kernel = first.kernel[...]
    hidden = (x @ kernel[:self.dim_x])[:, None, :] + (y @ kernel[self.dim_x:])[None, :, :]
    if first.bias is not None:
      hidden = hidden + first.bias[...][None, None, :]
    for layer in layers[1:]:
      hidden = layer(jax.nn.relu(hidden))
    return hidden[..., 0]
