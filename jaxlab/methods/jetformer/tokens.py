"""Pixels <-> soft tokens: grey levels, dequantisation, the noise curriculum, patches.

Images hold integer grey levels 0..L-1 (L = 17 for the digits). In model space a level v maps to
x = v / bin_scale - 1 with bin_scale = (L - 1) / 2, so the levels span [-1, 1] and one level is a
bin of width 1 / bin_scale. Uniform dequantisation adds U[0, 1 / bin_scale) to x: a density
p(x) over the continuous x then gives the probability of a level as ~ p(x) / bin_scale^D, which
is where the `log2(bin_scale)` bits per dimension of the loss come from.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def bin_scale(num_levels: int) -> float:
  return (num_levels - 1) / 2


def levels_to_unit(levels: jax.Array, num_levels: int) -> jax.Array:
  """Integer levels -> the lower edge of their bin in [-1, 1]."""
  return levels.astype(jnp.result_type(float)) / bin_scale(num_levels) - 1.0


def unit_to_levels(x: jax.Array, num_levels: int) -> jax.Array:
  """Continuous x -> the level whose bin holds it (clipped to the valid range)."""
  return jnp.clip(jnp.floor((x + 1.0) * bin_scale(num_levels)), 0, num_levels - 1).astype(
      jnp.int32)


def dequantize(key: jax.Array, levels: jax.Array, num_levels: int) -> jax.Array:
  """x = lower bin edge + U[0, bin width)."""
  width = 1.0 / bin_scale(num_levels)
  return levels_to_unit(levels, num_levels) + width * jax.random.uniform(
      key, levels.shape, jnp.result_type(float))


def curriculum_std(progress: jax.Array, initial_std: float, final_std: float = 0.0
                   ) -> jax.Array:
  """Noise std (in levels) at curriculum progress p: a cosine from initial (p = 0) to final
  (p >= 1)."""
  progress = jnp.clip(progress, 0.0, 1.0)
  return (initial_std - final_std) * (1 + jnp.cos(math.pi * progress)) / 2 + final_std


def add_curriculum_noise(key: jax.Array, levels: jax.Array, std: jax.Array) -> jax.Array:
  """Levels + std * N(0, 1), rounded to whole levels (noise in pixel units).

  Not clipped to the valid range, as in the official code: on digits, whose pixels are mostly 0,
  clipping would turn zero-mean noise into a brightening (+1.6 levels of mean at std 4).
  """
  noisy = jnp.round(levels.astype(jnp.result_type(float))
                    + std * jax.random.normal(key, levels.shape, jnp.result_type(float)))
  return noisy.astype(levels.dtype)


def patchify(images: jax.Array, patch: int) -> jax.Array:
  """[B, H, W, C] -> [B, (H/p)(W/p), p*p*C] tokens in row-major patch order."""
  b, h, w, c = images.shape
  if h % patch or w % patch:
    raise ValueError(f"image size {h}x{w} is not divisible by the patch size {patch}")
  x = images.reshape(b, h // patch, patch, w // patch, patch, c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (h // patch) * (w // patch), patch * patch * c)


def unpatchify(tokens: jax.Array, patch: int, height: int, width: int, channels: int
               ) -> jax.Array:
  """Inverse of `patchify`: [B, N, p*p*C] -> [B, H, W, C]."""
  b = tokens.shape[0]
  x = tokens.reshape(b, height // patch, width // patch, patch, patch, channels)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, height, width, channels)
