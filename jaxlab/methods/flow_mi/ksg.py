"""The Kraskov-Stoegbauer-Grassberger estimator (KSG, algorithm 1), brute force in row blocks.

For each point i, eps_i is the max-norm distance to its k-th nearest neighbour in the joint space
(max of the x and y max-norm distances); n_x(i), n_y(i) count the other points strictly closer
than eps_i in each marginal space. I = psi(k) + psi(N) - mean_i [psi(n_x(i) + 1) + psi(n_y(i) + 1)].
Exact O(N^2) distances: at N = 5000 that is 25M pairs, a fraction of a second per call.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma


def ksg(x: jax.Array, y: jax.Array, k: int = 5, row_block: int = 128) -> jax.Array:
  """KSG estimate (nats) from x [N, dx], y [N, dy]."""
  return _ksg(x, y, k, row_block)


def _ksg_impl(x, y, k, row_block):
  n = x.shape[0]
  if not 1 <= k < n:
    raise ValueError(f"KSG needs 1 <= k < N, got k={k} with N={n}")

  def row(args):
    x_i, y_i, i = args
    is_self = jnp.arange(n) == i
    dist_x = jnp.where(is_self, jnp.inf, jnp.max(jnp.abs(x - x_i[None]), axis=-1))
    dist_y = jnp.where(is_self, jnp.inf, jnp.max(jnp.abs(y - y_i[None]), axis=-1))
    dist = jnp.maximum(dist_x, dist_y)
    kth = -jax.lax.top_k(-dist, k)[0][k - 1]
    return jnp.sum(dist_x < kth), jnp.sum(dist_y < kth)

  count_x, count_y = jax.lax.map(row, (x, y, jnp.arange(n)), batch_size=min(row_block, n))
  return (digamma(float(k)) + digamma(float(n))
          - jnp.mean(digamma(count_x + 1.0) + digamma(count_y + 1.0)))


_ksg = jax.jit(_ksg_impl, static_argnums=(2, 3))
