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


def _batched_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
  """[..., M, K] @ [..., K, N] as one dot_general with leading batch dimensions.

  Heads are kept batch-major (`[B, H, L, Dh]`), so every product is a plain batched matmul. With
  `[B, L, H, Dh]` einsums XLA:CPU transposed q, k, v, the scores and their gradients around each
  tiny per-head product (the linear-attention training step of precision_ls ran 2x slower).
  """
  batch = tuple(range(a.ndim - 2))
  return jax.lax.dot_general(a, b, (((a.ndim - 1,), (b.ndim - 2,)), (batch, batch)))


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
  """q k^T / sqrt(Dh) on `[..., L, Dh]` -> `[..., Lq, Lk]`."""
  batch = tuple(range(q.ndim - 2))
  # Scaling q (L x Dh per head) is cheaper than scaling the L x L scores.
  q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
  return jax.lax.dot_general(q, k, (((q.ndim - 1,), (k.ndim - 1,)), (batch, batch)))


def softmax_mix(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v on head-major `[B, H, L, Dh]`."""
  scores = _scores(q, k)
  if causal:
    scores = jnp.where(causal_mask(q.shape[-2]), scores, -jnp.inf)
  return _batched_matmul(jax.nn.softmax(scores, axis=-1), v)


def linear_mix(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """(q k^T / sqrt(Dh)) v with no softmax, in linear time, on head-major `[B, H, L, Dh]`.

  q (sum_s k_s v_s^T), with the sum running over s <= t when causal. A polynomial of degree 3 in
  the layer input; equals `linear_mix_quadratic`.
  """
  if q.shape[-2] * k.shape[-2] <= q.shape[-1] * v.shape[-1]:
    # For short sequences the quadratic form is the cheaper one (L^2 Dh vs L Dh^2 per head).
    return linear_mix_quadratic(q, k, v, causal)
  scale = 1.0 / math.sqrt(q.shape[-1])
  if causal:
    kv = jnp.cumsum(jnp.einsum("bhsd,bhse->bhsde", k, v), axis=2)
    return jnp.einsum("bhtd,bhtde->bhte", q, kv) * scale
  return _batched_matmul(q, _batched_matmul(jnp.swapaxes(k, -1, -2), v)) * scale


def linear_mix_quadratic(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """The explicit O(L^2) form of `linear_mix`: (mask * q k^T / sqrt(Dh)) v."""
  scores = _scores(q, k)
  if causal:
    scores = jnp.where(causal_mask(q.shape[-2]), scores, 0.0)
  return _batched_matmul(scores, v)


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
    """x: [B, L, D] -> q, k, v each head-major [B, H, L, D/H]."""
    batch, length, _ = x.shape
    split = lambda t: jnp.swapaxes(
        t.reshape(batch, length, self.num_heads, self.width // self.num_heads), 1, 2)
    q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
    return split(q), split(k), split(v)

  def __call__(self, x: jax.Array, last_only: bool = False) -> jax.Array:
    """x: [B, L, D] -> [B, L, D], or [B, 1, D] (the last query only) if last_only."""
    chex.assert_shape(x, (None, None, self.width))
    q, k, v = self.heads(x)
    if last_only:
      # The last query attends to every key, causal or not.
      mixed = MIXES[self.kind](q[:, :, -1:], k, v, False)
    else:
      mixed = MIXES[self.kind](q, k, v, self.causal)
    mixed = jnp.swapaxes(mixed, 1, 2)   # [B, L, H, D/H]
    return self.out(mixed.reshape(mixed.shape[:2] + (self.width,)))
