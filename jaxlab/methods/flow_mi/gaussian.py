"""Moment-matched Gaussian quantities: the closed-form pieces of every variational estimator.

H_G(Z) = 1/2 log det Cov(Z) + d/2 (1 + log 2 pi) is the entropy of the Gaussian with Z's first two
moments, an upper bound on H(Z). The Gaussian MI of a joint sample (CCA's estimate, and JVG's) is
H_G(X) + H_G(Y) - H_G(X, Y) = 1/2 log(det S_xx det S_yy / det S).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# Added to every sample covariance: it keeps slogdet finite when a flow collapses a direction,
# and moves a standardised estimate by well under 1e-3 nats.
COVARIANCE_JITTER = 1e-5


def covariance(z: jax.Array, jitter: float = COVARIANCE_JITTER) -> jax.Array:
  """Unbiased sample covariance of z [N, d] (+ jitter I): [d, d]."""
  centred = z - z.mean(axis=0, keepdims=True)
  cov = centred.T @ centred / (z.shape[0] - 1)
  return cov + jitter * jnp.eye(z.shape[1], dtype=z.dtype)


def gaussian_entropy(cov: jax.Array) -> jax.Array:
  """Entropy (nats) of a Gaussian with covariance `cov` [d, d]."""
  d = cov.shape[-1]
  return 0.5 * jnp.linalg.slogdet(cov)[1] + 0.5 * d * (1.0 + math.log(2 * math.pi))


def gaussian_mi_of_covariance(cov: jax.Array, dim_x: int) -> jax.Array:
  """1/2 log(det S_xx det S_yy / det S) for a joint covariance over [x, y]."""
  logdet = lambda m: jnp.linalg.slogdet(m)[1]
  return 0.5 * (logdet(cov[:dim_x, :dim_x]) + logdet(cov[dim_x:, dim_x:]) - logdet(cov))


def gaussian_mi(x: jax.Array, y: jax.Array) -> jax.Array:
  """The CCA estimate: MI of the Gaussian with the sample moments of (x [N, dx], y [N, dy])."""
  return gaussian_mi_of_covariance(covariance(jnp.concatenate([x, y], axis=1)), x.shape[1])


def standardize(x: jax.Array) -> jax.Array:
  """Zero mean, unit variance per column (what the official code does before splitting)."""
  return (x - x.mean(axis=0, keepdims=True)) / jnp.maximum(x.std(axis=0, keepdims=True), 1e-12)
