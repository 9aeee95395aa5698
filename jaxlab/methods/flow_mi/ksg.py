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
  """The k-th smallest entry of `dist` [N], ties counted with multiplicity."""
  def drop_minimum(d, _):
    nearest = jnp.argmin(d)
    return d.at[nearest].set(jnp.inf), d[nearest]

  _, smallest = jax.lax.scan(drop_minimum, dist, None, length=k)
  return smallest[-1]


def _ksg_impl(x, y, k, row_block):
  n = x.shape[0]

  def row(args):
    x_i, y_i, i = args
    is_self = jnp.arange(n) == i
    dist_x = jnp.where(is_self, jnp.inf, jnp.max(jnp.abs(x - x_i[None]), axis=-1))
    dist_y = jnp.where(is_self, jnp.inf, jnp.max(jnp.abs(y - y_i[None]), axis=-1))
    eps = kth_smallest(jnp.maximum(dist_x, dist_y), k)
    return jnp.sum(dist_x < eps), jnp.sum(dist_y < eps)

  count_x, count_y = jax.lax.map(row, (x, y, jnp.arange(n)), batch_size=row_block)
  return (digamma(float(k)) + digamma(float(n))
          - jnp.mean(digamma(count_x + 1.0) + digamma(count_y + 1.0)))


_ksg = jax.jit(_ksg_impl, static_argnums=(2, 3))
