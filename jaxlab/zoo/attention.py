"""Self-attention over `[B, L, D]` sequences: softmax, or linear (softmax-free) attention.

One module with a fused q/k/v projection and an output projection (the GPT-2 layout); `kind`
picks how queries, keys and values are mixed. Both kinds can be causal.
"""
from __future__ import annotations

import functools
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
  """[..., M, K] @ [..., K, N] as one dot_general with leading batch dimensions."""
  batch = tuple(range(a.ndim - 2))
  return jax.lax.dot_general(a, b, (((a.ndim - 1,), (b.ndim - 2,)), (batch, batch)))


def _batched_matmul_nt(a: jax.Array, b: jax.Array) -> jax.Array:
  """[..., M, K] @ [..., N, K]^T."""
  batch = tuple(range(a.ndim - 2))
  return jax.lax.dot_general(a, b, (((a.ndim - 1,), (b.ndim - 1,)), (batch, batch)))


def _transposed_copy(x: jax.Array) -> jax.Array:
  """x with its last two axes swapped, materialised: the barrier stops XLA from folding the
  transpose back into the next dot, which XLA:CPU runs 2x slower in that (transposed) form."""
  return jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2))


def _mix_weights(scores: jax.Array, softmax: bool, causal: bool) -> jax.Array:
  if softmax:
    if causal:
      scores = jnp.where(causal_mask(scores.shape[-2]), scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1)
  return jnp.where(causal_mask(scores.shape[-2]), scores, 0.0) if causal else scores


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _quadratic_mix(q, k, v, softmax: bool, causal: bool):
  """weights(q k^T / sqrt(Dh)) v on head-major `[B, H, L, Dh]`; weights = softmax or (masked)
  identity.

  Heads are batch-major so that every product is a plain batched matmul, and the gradient is
  written out (`_quadratic_mix_bwd`) so that each of its four products is one too. Autodiff's
  gradient used two transposed-operand products instead, and together with the `[B, L, H, Dh]`
  layout made XLA:CPU's training step 2x slower. Reverse mode only (a `custom_vjp`).
  """
  return _quadratic_mix_fwd(q, k, v, softmax, causal)[0]


def _quadratic_mix_fwd(q, k, v, softmax, causal):
  scaled_q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
  weights = _mix_weights(_batched_matmul_nt(scaled_q, k), softmax, causal)
  out = _batched_matmul(weights, v)
  return out, (scaled_q, k, v, weights, out)


def _quadratic_mix_bwd(softmax, causal, residuals, d_out):
  scaled_q, k, v, weights, out = residuals
  d_v = _batched_matmul(_transposed_copy(weights), d_out)
  d_weights = _batched_matmul_nt(d_out, v)
  if softmax:
    # d softmax: w * (dw - sum_j w_j dw_j); sum_j w_j dw_j = d_out . out per query.
    d_scores = weights * (d_weights - jnp.sum(d_out * out, axis=-1, keepdims=True))
  else:
    d_scores = jnp.where(causal_mask(weights.shape[-2]), d_weights, 0.0) if causal else d_weights
  d_q = _batched_matmul(d_scores, k) * jnp.asarray(1.0 / math.sqrt(k.shape[-1]), k.dtype)
  d_k = _batched_matmul(_transposed_copy(d_scores), scaled_q)
  return d_q, d_k, d_v


_quadratic_mix.defvjp(_quadratic_mix_fwd, _quadratic_mix_bwd)


def softmax_mix(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v on head-major `[B, H, L, Dh]`."""
  return _quadratic_mix(q, k, v, True, causal)


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
  return _quadratic_mix(q, k, v, False, causal)


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
