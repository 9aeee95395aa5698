"""The Kraskov-Stoegbauer-Grassberger estimator (KSG, algorithm 1), brute force in row blocks.

For each point i, eps_i is the max-norm distance to its k-th nearest neighbour in the joint space
(max of the x and y max-norm distances); n_x(i), n_y(i) count the other points strictly closer
than eps_i in each marginal space. I = psi(k) + psi(N) - mean_i [psi(n_x(i) + 1) + psi(n_y(i) + 1)].
Exact O(N^2) distances: at N = 5000 that is 25M pairs. The k-th distance is found by k rounds of
"take the row minimum, then mask it out" rather than `lax.top_k`, which on CPU sorts every row and
made this estimator 12x slower (6 s against 0.5 s per 5,000-point dataset).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma


def ksg(x: jax.Array, y: jax.Array, k: int = 5, row_block: int = 128) -> jax.Array:
  """KSG estimate (nats) from x [N, dx], y [N, dy]."""
  n = x.shape[0]
  if not 1 <= k < n:
    raise ValueError(f"KSG needs 1 <= k < N, got k={k} with N={n}")
  return _ksg(x, y, k, min(row_block, n))


def kth_smallest(dist: jax.Array, k: int) -> jax.Array:
  """The k-th smallest entry of each row of `dist` [B, N], ties counted with multiplicity."""
  columns = jnp.arange(dist.shape[-1])

  def drop_row_minimum(d, _):
    nearest = jnp.argmin(d, axis=-1)
    smallest = jnp.take_along_axis(d, nearest[:, None], axis=-1)[:, 0]
    return jnp.where(columns[None] == nearest[:, None], jnp.inf, d), smallest

  _, smallest = jax.lax.scan(drop_row_minimum, dist, None, length=k)
  return smallest[-1]


def _ksg_impl(x, y, k, row_block):
  n = x.shape[0]
  others = jnp.arange(n)

  def block(args):
    x_block, y_block, rows = args
    is_self = rows[:, None] == others[None]
    dist_x = jnp.where(is_self, jnp.inf, jnp.max(jnp.abs(x_block[:, None] - x[None]), axis=-1))
    dist_y = jnp.where(is_self, jnp.inf, jnp.max(jnp.abs(y_block[:, None] - y[None]), axis=-1))
    eps = kth_smallest(jnp.maximum(dist_x, dist_y), k)[:, None]
    return jnp.sum(dist_x < eps, axis=-1), jnp.sum(dist_y < eps, axis=-1)

  pad = (-n) % row_block
  as_blocks = lambda a: jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1)).reshape(
      (-1, row_block) + a.shape[1:])
  count_x, count_y = jax.lax.map(block, (as_blocks(x), as_blocks(y), as_blocks(others)))
  count_x, count_y = count_x.reshape(-1)[:n], count_y.reshape(-1)[:n]
  return (digamma(float(k)) + digamma(float(n))
          - jnp.mean(digamma(count_x + 1.0) + digamma(count_y + 1.0)))


_ksg = jax.jit(_ksg_impl, static_argnums=(2, 3))
