"""Self-attention over `[B, L, D]` sequences: softmax, or linear (softmax-free) attention.

One module with a fused q/k/v projection and an output projection (the GPT-2 layout); `kind`
picks how queries, keys and values are mixed. Both kinds can be causal.

Methods that edit the attention logits (low-rank or sparse query-key matrices, say) read the
per-head kernels with `Attention.query_key_kernels` / `merged_query_key` and run the module with
replaced ones through `query_key=` without touching its parameters:

* `{"w_q": [D, D], "w_k": [D, D]}` replaces the query and key kernels (biases, if any, kept);
* `{"merged": [H, D, D]}` gives each head's logits directly as x W_h x^T, where
  W_h = W_Q,h W_K,h^T / sqrt(Dh) already holds the scale. Only exact without q/k biases, so only
  allowed with `qkv_bias=False`.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

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


def masked_softmax(scores: jax.Array, causal: bool) -> jax.Array:
  """Row softmax of `[..., L, L]` logits; causal rows give zero weight to later keys."""
  if causal:
    scores = jnp.where(causal_mask(scores.shape[-2]), scores, -jnp.inf)
  return jax.nn.softmax(scores, axis=-1)


def softmax_mix(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v on head-major `[B, H, L, Dh]`."""
  return _batched_matmul(masked_softmax(_scores(q, k), causal), v)


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
  return mix_logits(_scores(q, k), v, "linear", causal)


MIXES: dict[str, Callable[..., jax.Array]] = {"softmax": softmax_mix, "linear": linear_mix}


def mix_logits(scores: jax.Array, v: jax.Array, kind: str, causal: bool) -> jax.Array:
  """Mixes head-major values `[B, H, Lk, Dh]` by given logits `[B, H, Lq, Lk]`.

  The quadratic form of either kind, for logits that do not come from a q k^T product (merged
  per-head query-key matrices): softmax(logits) v, or (mask * logits) v for linear attention.
  """
  if kind == "softmax":
    return _batched_matmul(masked_softmax(scores, causal), v)
  if causal:
    scores = jnp.where(causal_mask(scores.shape[-2]), scores, 0.0)
  return _batched_matmul(scores, v)


QueryKey = Mapping[str, jax.Array]


def merge_query_key(w_q: jax.Array, w_k: jax.Array, num_heads: int) -> jax.Array:
  """Per-head W_h = W_Q,h W_K,h^T / sqrt(Dh): `[D, D]` kernels -> `[H, D, D]`.

  Columns are head-major (head h owns columns h*Dh:(h+1)*Dh), as in `Attention`'s projection.
  Without q/k biases, head h's logits are exactly x W_h x^T.
  """
  width, inner = w_q.shape
  head_dim = inner // num_heads
  q = w_q.reshape(width, num_heads, head_dim)
  k = w_k.reshape(width, num_heads, head_dim)
  return jnp.einsum("dhe,fhe->hdf", q, k) / jnp.asarray(math.sqrt(head_dim), q.dtype)


class Attention(nnx.Module):
  """Multi-head self-attention; `kind` is "softmax" or "linear".

  `qkv_bias=False` drops the bias of the fused q/k/v projection (the output projection keeps
  its own), so the logits are exactly x W_Q W_K^T x^T / sqrt(Dh): a bilinear form that merged
  per-head matrices can replace (see `query_key=` in `__call__`).
  """

  def __init__(self, width: int, num_heads: int, *, kind: str = "softmax",
               causal: bool = True, qkv_bias: bool = True, init_std: float = 0.02,
               out_init_std: float = 0.02, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if width % num_heads:
      raise ValueError(f"width {width} is not divisible by num_heads {num_heads}")
    if kind not in MIXES:
      raise ValueError(f"unknown attention kind {kind!r}; choose one of {sorted(MIXES)}")
    self.width, self.num_heads, self.kind, self.causal = width, num_heads, kind, causal
    self.qkv = normal_linear(width, 3 * width, std=init_std, use_bias=qkv_bias,
                             param_dtype=param_dtype, rngs=rngs)
    self.out = normal_linear(width, width, std=out_init_std, param_dtype=param_dtype, rngs=rngs)

  def query_key_kernels(self) -> tuple[jax.Array, jax.Array]:
    """(w_q, w_k), each `[D, D]` with head-major columns (head h: columns h*Dh:(h+1)*Dh)."""
    kernel = self.qkv.kernel[...]
    return kernel[:, :self.width], kernel[:, self.width:2 * self.width]

  def merged_query_key(self) -> jax.Array:
    """`[H, D, D]`: W_h = W_Q,h W_K,h^T / sqrt(Dh), so (without q/k bias) logits_h = x W_h x^T."""
    return merge_query_key(*self.query_key_kernels(), self.num_heads)

  def _split_heads(self, t: jax.Array) -> jax.Array:
    """[B, L, D] -> head-major [B, H, L, D/H]."""
    batch, length, _ = t.shape
    return jnp.swapaxes(
        t.reshape(batch, length, self.num_heads, self.width // self.num_heads), 1, 2)

  def _project(self, x: jax.Array, kernel: jax.Array, bias: jax.Array | None) -> jax.Array:
    """x kernel + bias, computed exactly as `self.qkv` (an `nnx.Linear`) computes it.

    With the module's own kernel and bias this reproduces `self.qkv(x)` bit for bit, so a
    replacement by the unchanged matrices changes nothing.
    """
    x, kernel, bias = self.qkv.promote_dtype((x, kernel, bias), dtype=self.qkv.dtype)
    y = self.qkv.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                             precision=self.qkv.precision)
    return y if bias is None else y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))

  def _check_query_key(self, query_key: QueryKey) -> None:
    width, heads = self.width, self.num_heads
    if set(query_key) == {"w_q", "w_k"}:
      expected = {"w_q": (width, width), "w_k": (width, width)}
    elif set(query_key) == {"merged"}:
      expected = {"merged": (heads, width, width)}
      if self.qkv.bias is not None:
        raise ValueError("merged query-key matrices give the logits x W_h x^T, which leaves out "
                         "the q/k biases; build the attention with qkv_bias=False to use them")
    else:
      raise ValueError("query_key must have the keys {'w_q', 'w_k'} or {'merged'}, got "
                       f"{sorted(query_key)}")
    for name, shape in expected.items():
      if tuple(query_key[name].shape) != shape:
        raise ValueError(f"query_key[{name!r}] has shape {tuple(query_key[name].shape)}; "
                         f"expected {shape}")

  def _replaced_heads(self, x: jax.Array,
                      query_key: QueryKey) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q, k, v (head-major) with the query and key kernels replaced by `query_key`'s."""
    kernel = jnp.concatenate(
        [query_key["w_q"], query_key["w_k"], self.qkv.kernel[...][:, 2 * self.width:]], axis=1)
    bias = self.qkv.bias[...] if self.qkv.bias is not None else None
    q, k, v = jnp.split(self._project(x, kernel, bias), 3, axis=-1)
    return self._split_heads(q), self._split_heads(k), self._split_heads(v)

  def _merged_logits(self, x: jax.Array, merged: jax.Array, last_only: bool) -> jax.Array:
    """logits_h = x_query W_h x^T: `[B, H, Lq, L]`, Lq = 1 with last_only, else L."""
    queries = x[:, -1:] if last_only else x
    left = jnp.einsum("bld,hde->bhle", queries, merged.astype(x.dtype))
    return jax.lax.dot_general(left, x, (((3,), (2,)), ((0,), (0,))))

  def _values(self, x: jax.Array) -> jax.Array:
    """v alone (head-major), for the merged path, which needs no q or k."""
    columns = slice(2 * self.width, 3 * self.width)
    bias = self.qkv.bias[...][columns] if self.qkv.bias is not None else None
    return self._split_heads(self._project(x, self.qkv.kernel[...][:, columns], bias))

  def logits(self, x: jax.Array, query_key: QueryKey | None = None) -> jax.Array:
    """x: [B, L, D] -> the logits q k^T / sqrt(Dh), `[B, H, L, L]`, before any causal mask."""
    chex.assert_shape(x, (None, None, self.width))
    if query_key is None:
      q, k, _ = self.heads(x)
      return _scores(q, k)
    self._check_query_key(query_key)
    if "merged" in query_key:
      return self._merged_logits(x, query_key["merged"], last_only=False)
    q, k, _ = self._replaced_heads(x, query_key)
    return _scores(q, k)

  def probabilities(self, x: jax.Array, query_key: QueryKey | None = None) -> jax.Array:
    """x: [B, L, D] -> the softmax attention matrix `[B, H, L, L]`, causal mask if causal.

    Computed in float32 at least (float64 parameters stay float64), so that rows sum to 1 for
    low-precision parameters too.
    """
    if self.kind != "softmax":
      raise ValueError(f"{self.kind!r} attention has no softmax probabilities; its mixing "
                       "weights are the (masked) logits, see `Attention.logits`")
    logits = self.logits(x, query_key)
    return masked_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)),
                          self.causal)

  def heads(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x: [B, L, D] -> q, k, v each head-major [B, H, L, D/H]."""
    q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
    return self._split_heads(q), self._split_heads(k), self._split_heads(v)

  def __call__(self, x: jax.Array, last_only: bool = False, *,
               query_key: QueryKey | None = None) -> jax.Array:
    """x: [B, L, D] -> [B, L, D], or [B, 1, D] (the last query only) if last_only.

    `query_key` runs the layer with replaced query-key matrices (see the module docstring),
    leaving its parameters alone; None (the default) is the plain layer.
    """
    chex.assert_shape(x, (None, None, self.width))
    if query_key is not None:
      self._check_query_key(query_key)
    if query_key is not None and "merged" in query_key:
      # The last query attends to every key, causal or not.
      logits = self._merged_logits(x, query_key["merged"], last_only)
      mixed = mix_logits(logits, self._values(x), self.kind, self.causal and not last_only)
    else:
      q, k, v = self.heads(x) if query_key is None else self._replaced_heads(x, query_key)
      if last_only:
        # The last query attends to every key, causal or not.
        mixed = MIXES[self.kind](q[:, :, -1:], k, v, False)
      else:
        mixed = MIXES[self.kind](q, k, v, self.causal)
    mixed = jnp.swapaxes(mixed, 1, 2)   # [B, L, H, D/H]
    return self.out(mixed.reshape(mixed.shape[:2] + (self.width,)))
