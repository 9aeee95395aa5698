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


def rank_gaussian_map(guidance: jax.Array, key: jax.Array) -> jax.Array:
  """guidance [B, H, W, C] -> delta [B, H, W, C], a per-(image, channel) permutation of a
  Gaussian sample ordered like the guidance."""
  batch, height, width, channels = guidance.shape
  flat = jnp.moveaxis(guidance, -1, 1).reshape(batch, channels, height * width)
  gaussian = jnp.sort(jax.random.normal(key, flat.shape, guidance.dtype), axis=-1)
  ranks = jnp.argsort(jnp.argsort(flat, axis=-1), axis=-1)
  delta = jnp.take_along_axis(gaussian, ranks, axis=-1)
  return jnp.moveaxis(delta.reshape(batch, channels, height, width), 1, -1)
