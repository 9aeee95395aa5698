"""RBGM, the rank-based Gaussian mapping of ADDT.

Given an adversarial guidance g [B, H, W, C] (the accumulated gradient of the classifier's loss
with respect to the injected noise), draw z ~ N(0, I) and, within each (image, channel), give the
pixel with the k-th smallest guidance the k-th smallest of the H*W Gaussian values. The result is
exactly a permutation of i.i.d. N(0, 1) draws — so the noise the diffusion model is trained on
stays Gaussian — while pointing as far as ranks allow in the adversarial direction.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri


def sorted_gaussian(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
  """n = shape[-1] i.i.d. N(0, 1) draws in increasing order along the last axis, without a sort.

  Renyi's representation: with E_1 .. E_{n+1} i.i.d. Exp(1) and S_k = E_1 + ... + E_k, the
  ratios S_k / S_{n+1} (k = 1 .. n) are distributed exactly as the order statistics of n
  uniforms, so Phi^-1 of them are those of n standard normals. The upper tail takes
  -Phi^-1 of 1 - U, summed from the other end, to keep float32 resolution there.
  """
  exponential = jax.random.exponential(key, (*shape[:-1], shape[-1] + 1), dtype)
  total = jnp.sum(exponential, axis=-1, keepdims=True)
  below = jnp.cumsum(exponential, axis=-1)[..., :-1] / total
  above = jnp.cumsum(exponential[..., ::-1], axis=-1)[..., ::-1][..., 1:] / total
  return jnp.where(below < 0.5, ndtri(below), -ndtri(above))


def rank_gaussian_map(guidance: jax.Array, key: jax.Array) -> jax.Array:
  """guidance [B, H, W, C] -> delta [B, H, W, C], a per-(image, channel) permutation of a
  Gaussian sample ordered like the guidance."""
  batch, height, width, channels = guidance.shape
  flat = jnp.moveaxis(guidance, -1, 1).reshape(batch, channels, height * width)
  gaussian = sorted_gaussian(key, flat.shape, guidance.dtype)
  # The k-th smallest Gaussian value goes to the position of the k-th smallest guidance: one
  # argsort and a scatter (XLA's CPU sort is the slowest part of an ADDT step, so neither
  # rank = argsort(argsort(g)) nor sorting the Gaussian draws).
  order = jnp.argsort(flat, axis=-1)
  rows = jnp.arange(batch)[:, None, None]
  cols = jnp.arange(channels)[None, :, None]
  delta = jnp.zeros_like(flat).at[rows, cols, order].set(gaussian, unique_indices=True)
  return jnp.moveaxis(delta.reshape(batch, channels, height, width), 1, -1)
