"""Semantix's guidance energy (reconstructed: no code was released) and its correspondence.

Features are UNet taps of one image batch, each [B, h, w, C] (`zoo.unet` names them). With N =
h * w positions flattened:

* correspondence pi(i) = argmax_j cos([F_ctx(i); w PE(i)], [F_ref(j); w PE(j)]), PE the 2-D
  sinusoidal position code of a position's (row, column) in [0, 1); `soft` replaces the argmax by
  a softmax over j with a temperature (then F_ref(pi(i)) is the weighted mean);
* E_style = mean_i |F_out(i) - F_ref(pi(i))|^2 on the style taps (decoder block outputs);
* E_spatial = mean_i |Q_out(i) - Q_ctx(i)|^2 on the self-attention queries;
* E_sd = mean_i (1 - cos(M_out(i), M_ctx(i))) on the middle block;
* `global_style` (a baseline, no correspondence): match each channel's mean and std over all
  positions, |mu_out - mu_ref|^2 + |sd_out - sd_ref|^2.

Every energy is a mean over the batch of per-image energies, so its gradient with respect to
one image's x does not depend on the others. The correspondence is not differentiated (it is
recomputed every step from the context and reference features, which carry no gradient).
"""
from __future__ import annotations

import math
from typing import Mapping

import chex
import jax
import jax.numpy as jnp

Features = Mapping[str, jax.Array]


def flatten(feature: jax.Array) -> jax.Array:
  """[B, h, w, C] -> [B, h * w, C]."""
  chex.assert_rank(feature, 4)
  batch, height, width, channels = feature.shape
  return feature.reshape(batch, height * width, channels)


def positional_encoding(height: int, width: int, dim: int) -> jax.Array:
  """[h * w, dim] 2-D sinusoidal code: dim / 2 features of the row and dim / 2 of the column,
  each (sin, cos) pairs at frequencies 2^0 .. pi (positions scaled to [0, 1))."""
  if dim % 4:
    raise ValueError(f"the 2-D position code needs dim divisible by 4, got {dim}")
  quarter = dim // 4
  frequencies = math.pi * 2.0 ** jnp.arange(quarter, dtype=jnp.float32)

  def code(count):
    position = jnp.arange(count, dtype=jnp.float32) / count
    angle = position[:, None] * frequencies[None]
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)      # [count, dim / 2]

  rows = jnp.repeat(code(height), width, axis=0)
  columns = jnp.tile(code(width), (height, 1))
  return jnp.concatenate([rows, columns], axis=-1)


def _unit(x: jax.Array) -> jax.Array:
  return x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-8)


def match_descriptors(feature: jax.Array, pe_weight: float, feature_weight: float = 1.0
                      ) -> jax.Array:
  """[B, h, w, C] -> [B, N, C + P]: the unit feature (times `feature_weight`) beside the
  position code (times `pe_weight`); P = 4 * ceil(C / 4) so both halves weigh alike."""
  batch, height, width, channels = feature.shape
  pe = positional_encoding(height, width, 4 * -(-channels // 4))
  pe = _unit(pe) * pe_weight
  flat = _unit(flatten(feature).astype(jnp.float32)) * feature_weight
  return jnp.concatenate([flat, jnp.broadcast_to(pe[None], (batch,) + pe.shape)], axis=-1)


def similarity(context: jax.Array, reference: jax.Array, pe_weight: float,
               feature_weight: float = 1.0) -> jax.Array:
  """[B, N, N] cosine similarity of context position i and reference position j."""
  a = _unit(match_descriptors(context, pe_weight, feature_weight))
  b = _unit(match_descriptors(reference, pe_weight, feature_weight))
  return jnp.einsum("bic,bjc->bij", a, b)


def correspondence(context: jax.Array, reference: jax.Array, *, pe_weight: float,
                   feature_weight: float = 1.0, temperature: float | None = None) -> jax.Array:
  """[B, N, N] row-stochastic matching weights: one-hot at argmax_j (hard), or a softmax over
  j of similarity / temperature (soft). No gradient flows through it."""
  scores = jax.lax.stop_gradient(similarity(context, reference, pe_weight, feature_weight))
  if temperature is None:
    return jax.nn.one_hot(jnp.argmax(scores, axis=-1), scores.shape[-1], dtype=jnp.float32)
  return jax.nn.softmax(scores / temperature, axis=-1)


def matched_reference(reference: jax.Array, weights: jax.Array) -> jax.Array:
  """F_ref(pi(i)) [B, N, C] for matching weights [B, N, N]."""
  return jnp.einsum("bij,bjc->bic", weights, jax.lax.stop_gradient(
      flatten(reference).astype(jnp.float32)))


def style_energy(output: jax.Array, reference: jax.Array, weights: jax.Array) -> jax.Array:
  """mean_i |F_out(i) - F_ref(pi(i))|^2 (mean over channels too), averaged over the batch."""
  target = matched_reference(reference, weights)
  return jnp.mean(jnp.square(flatten(output).astype(jnp.float32) - target))


def global_style_energy(output: jax.Array, reference: jax.Array) -> jax.Array:
  """|mu_out - mu_ref|^2 + |sd_out - sd_ref|^2 per channel over all positions, averaged."""
  out = flatten(output).astype(jnp.float32)
  ref = jax.lax.stop_gradient(flatten(reference).astype(jnp.float32))
  mean = lambda f: jnp.mean(f, axis=1)
  std = lambda f: jnp.sqrt(jnp.var(f, axis=1) + 1e-6)
  return jnp.mean(jnp.square(mean(out) - mean(ref)) + jnp.square(std(out) - std(ref)))


def spatial_energy(output: jax.Array, context: jax.Array) -> jax.Array:
  """mean_i |Q_out(i) - Q_ctx(i)|^2 (queries or any structure features)."""
  target = jax.lax.stop_gradient(context.astype(jnp.float32))
  return jnp.mean(jnp.square(output.astype(jnp.float32) - target))


def semantic_distance(output: jax.Array, context: jax.Array) -> jax.Array:
  """mean_i (1 - cos(M_out(i), M_ctx(i))) over positions, averaged over the batch."""
  out = _unit(flatten(output).astype(jnp.float32))
  ctx = _unit(jax.lax.stop_gradient(flatten(context).astype(jnp.float32)))
  return jnp.mean(1.0 - jnp.sum(out * ctx, axis=-1))
