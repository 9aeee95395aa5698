"""Self-attention over `[B, L, D]` sequences: softmax, or linear (softmax-free) attention.

One module with a fused q/k/v projection and an output projection (the GPT-2 layout); `kind`
picks how queries, keys and values are mixed. Both kinds can be causal.
"""
from __future__ import annotations

import math
from typing import Callable

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.zoo.mlp import normal_linear


def causal_mask(length: int) -> jax.Array:
  """[L, L] boolean, True where query t may attend to key s (s <= t)."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))


def softmax_mix(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v on `[B, L, H, Dh]`."""
  scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
  if causal:
    scores = jnp.where(causal_mask(q.shape[1])[None, None], scores, -jnp.inf)
  return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)


def linear_mix(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """(q k^T / sqrt(Dh)) v with no softmax, in linear time, on `[B, L, H, Dh]`.

  q (sum_s k_s v_s^T), with the sum running over s <= t when causal. A polynomial of degree 3 in
  the layer input; equals `linear_mix_quadratic`.
  """
  if q.shape[1] * k.shape[1] <= q.shape[-1] * v.shape[-1]:
    # For short sequences the quadratic form is the cheaper one (L^2 Dh vs L Dh^2 per head).
    return linear_mix_quadratic(q, k, v, causal)
  scale = 1.0 / math.sqrt(q.shape[-1])
  if causal:
    kv = jnp.cumsum(jnp.einsum("bshd,bshe->bshde", k, v), axis=1)
    return jnp.einsum("bthd,bthde->bthe", q, kv) * scale
  return jnp.einsum("bthd,bhde->bthe", q, jnp.einsum("bshd,bshe->bhde", k, v)) * scale


def linear_mix_quadratic(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """The explicit O(L^2) form of `linear_mix`: (mask * q k^T / sqrt(Dh)) v."""
  scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
  if causal:
    scores = jnp.where(causal_mask(q.shape[1])[None, None], scores, 0.0)
  return jnp.einsum("bhts,bshd->bthd", scores, v)


MIXES: dict[str, Callable[..., jax.Array]] = {"softmax": softmax_mix, "linear": linear_mix}


class Attention(nnx.Module):
  """Multi-head self-attention; `kind` is "softmax" or "linear"."""

  def __init__(self, width: int, num_heads: int, *, kind: str = "softmax",
               causal: bool = True, init_std: float = 0.02, out_init_std: float = 0.02,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if width % num_heads:
      raise ValueError(f"width {width} is not divisible by num_heads {num_heads}")
    if kind not in MIXES:
      raise ValueError(f"unknown attention kind {kind!r}; choose one of {sorted(MIXES)}")
    self.width, self.num_heads, self.kind, self.causal = width, num_heads, kind, causal
    self.qkv = normal_linear(width, 3 * width, std=init_std, param_dtype=param_dtype, rngs=rngs)
    self.out = normal_linear(width, width, std=out_init_std, param_dtype=param_dtype, rngs=rngs)

  def heads(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x: [B, L, D] -> q, k, v each [B, L, H, D/H]."""
    batch, length, _ = x.shape
    split = lambda t: t.reshape(batch, length, self.num_heads, self.width // self.num_heads)
    q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
    return split(q), split(k), split(v)

  def __call__(self, x: jax.Array, last_only: bool = False) -> jax.Array:
    """x: [B, L, D] -> [B, L, D], or [B, 1, D] (the last query only) if last_only."""
    chex.assert_shape(x, (None, None, self.width))
    q, k, v = self.heads(x)
    if last_only:
      # The last query attends to every key, causal or not.
      mixed = MIXES[self.kind](q[:, -1:], k, v, False)
    else:
      mixed = MIXES[self.kind](q, k, v, self.causal)
    return self.out(mixed.reshape(mixed.shape[:2] + (self.width,)))
