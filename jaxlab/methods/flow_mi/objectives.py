"""Training objectives and reported MI of the variational estimators and the critic baselines.

Each objective maps (module, x [B, dx], y [B, dy], rng) to (loss to minimise, reported MI). The
loss is what is trained *and* what selects the reported value on held-out data (the MI at the
lowest held-out loss).

Joint variational (JVF; JVG with identity flows), with H_G the moment-matched Gaussian entropy:
  H_XY = H_G(f(x), g(y)) - E log|J_f| - E log|J_g|  (a cross-entropy upper bound on H(X, Y)),
  loss = H_XY,  MI = H_X + H_Y - H_XY = 1/2 log(det S_xx det S_yy / det S)  (log-dets cancel).
Neural variational (NVF; NVG with identity flows):
  H_X  = H_G(f_prior(x)) - E log|J_prior|,
  H_X|Y = -E log q(f_post(x) | y) - E log|J_post|,
  loss = H_X + H_X|Y,  MI = H_X - H_X|Y.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.methods.flow_mi import bounds
from jaxlab.methods.flow_mi import gaussian
from jaxlab.methods.flow_mi import models


def joint_variational(model: models.JointFlows, x: jax.Array, y: jax.Array,
                      rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  fx, logdet_f, gy, logdet_g = model(x, y, rng=rng)
  cov = gaussian.covariance(jnp.concatenate([fx, gy], axis=1))
  joint_entropy = gaussian.gaussian_entropy(cov) - logdet_f.mean() - logdet_g.mean()
  return joint_entropy, gaussian.gaussian_mi_of_covariance(cov, x.shape[1])


# Up to this dimension q(. | y)'s log density is written out entry by entry, as elementwise
# operations over the batch: the covariance L L^T + jitter from L's entries, its Cholesky factor
# (Cholesky-Banachiewicz) and the whitened residual. Scattering L into a matrix, the batched
# matmul and a batched LAPACK Cholesky and triangular solve (with their gradients) cost more on
# CPU: value and gradient for 6 datasets x 256 at d = 5, 15.5 vs 2.3 ms. At d = 10 the unrolled
# form is still faster (12 vs 17 ms) but compiles for 17 s instead of 1.4 s, which a 3,000-step fit
# does not earn back, so the matrix form is used there.
UNROLLED_MAX_DIM = 6


def _unrolled_whitening(residual: jax.Array, cov_entry, d: int) -> tuple[jax.Array, jax.Array]:
  """(|F^-1 r|^2, sum log diag F) with F F^T = the covariance whose (i, j) entry is cov_entry."""
  factor: dict[tuple[int, int], jax.Array] = {}
  for i in range(d):
    for j in range(i + 1):
      partial = cov_entry(i, j)
      for k in range(j):
        partial = partial - factor[i, k] * factor[j, k]
      factor[i, j] = jnp.sqrt(partial) if i == j else partial / factor[j, j]
  white: list[jax.Array] = []
  for i in range(d):
    partial = residual[..., i]
    for k in range(i):
      partial = partial - factor[i, k] * white[k]
    white.append(partial / factor[i, i])
  squared_norm = sum(w**2 for w in white)
  half_logdet = sum(jnp.log(factor[i, i]) for i in range(d))
  return squared_norm, half_logdet


def _normal_log_prob(squared_norm: jax.Array, half_logdet: jax.Array, d: int) -> jax.Array:
  return -0.5 * squared_norm - half_logdet - 0.5 * d * math.log(2 * math.pi)


def gaussian_log_prob(u: jax.Array, mean: jax.Array, cov: jax.Array) -> jax.Array:
  """log N(u; mean, cov) for u, mean [B, d] and cov [B, d, d] (batched LAPACK)."""
  d = u.shape[-1]
  chol = jnp.linalg.cholesky(cov)
  white = jax.scipy.linalg.solve_triangular(chol, (u - mean)[..., None], lower=True)[..., 0]
  squared_norm = jnp.sum(white**2, axis=-1)
  half_logdet = jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
  return _normal_log_prob(squared_norm, half_logdet, d)


def factor_log_prob(u: jax.Array, mean: jax.Array, entries: jax.Array) -> jax.Array:
  """log N(u; mean, L L^T + jitter I) for u, mean [B, d], L's lower triangle [B, d (d + 1) / 2]."""
  d = u.shape[-1]
  if d > UNROLLED_MAX_DIM:
    return gaussian_log_prob(u, mean, models.covariance_of_factor(entries, d))
  # Sliced once: every slice's gradient is a pad to the full [B, d (d + 1) / 2] array.
  columns = [entries[..., k] for k in range(entries.shape[-1])]
  lower = {(int(r), int(c)): columns[k] for k, (r, c) in enumerate(zip(*np.tril_indices(d)))}

  def cov_entry(i: int, j: int) -> jax.Array:   # i >= j
    total = sum(lower[i, k] * lower[j, k] for k in range(j + 1))
    return total + models.COVARIANCE_JITTER if i == j else total

  squared_norm, half_logdet = _unrolled_whitening(u - mean, cov_entry, d)
  return _normal_log_prob(squared_norm, half_logdet, d)


def neural_variational(model: models.NeuralVariational, x: jax.Array, y: jax.Array,
                       rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  rng_prior, rng_post = jax.random.split(rng) if rng is not None else (None, None)
  fx, logdet_prior = model.prior.forward(x, rng=rng_prior)
  prior_entropy = gaussian.gaussian_entropy(gaussian.covariance(fx)) - logdet_prior.mean()
  u, logdet_post = model.posterior.forward(x, rng=rng_post)
  mean, entries = model.conditional_moments(y)
  conditional_entropy = -factor_log_prob(u, mean, entries).mean() - logdet_post.mean()
  return prior_entropy + conditional_entropy, prior_entropy - conditional_entropy


CRITIC_BOUNDS = {
    "infonce": bounds.infonce,
    "nwj": bounds.nwj,
    "dv": bounds.donsker_varadhan,
    "mine": bounds.donsker_varadhan,
}


def critic_bound(kind: str, model: models.PairCritic, x: jax.Array, y: jax.Array,
                 rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(-bound, bound) of a critic on a batch (or, evaluated in row blocks, a whole test set)."""
  del rng
  value = CRITIC_BOUNDS[kind](bounds.score_statistics(model.pairwise, x, y))
  return -value, value


def mine_training_loss(model: models.PairCritic, moving_average: jax.Array, x: jax.Array,
                       y: jax.Array, decay: float
                       ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """(loss whose gradient is MINE's, (updated moving average, batch DV value))."""
  stats = bounds.score_statistics(model.pairwise, x, y)
  surrogate, updated = bounds.mine_surrogate(stats, moving_average, decay)
  return -surrogate, (updated, bounds.donsker_varadhan(stats))
