"""A decoder-only transformer in the Gemma layout: RMSNorm, RoPE, grouped-query attention, GeGLU.

* `RMSNorm`: x / rms(x) * (1 + scale), scale zero-initialised so the layer starts as the plain
  normalisation and weight decay pulls it back there.
* `apply_rope`: rotary position embedding of `[B, L, H, Dh]` queries or keys (a pure function).
* `MultiQueryAttention`: `num_heads` query heads sharing `num_kv_heads` key/value heads (1: MQA,
  `num_heads`: ordinary multi-head attention), RoPE on q and k, logits and softmax in float32.
* `GeGLU`: the gated MLP W_down(gelu(W_gate x) * W_up x).
* `DecoderBlock`: x + attn(norm(x)), then x + mlp(norm(x)).
* `Decoder`: a stack of blocks and a final RMSNorm over `[B, L, D]` embeddings. It takes
  embeddings, not tokens, so callers can mix soft tokens (continuous features through their own
  projection) with embedded discrete ones; `embed` and `attend` give an optional token embedding
  and its tied read-out.
* `DecoderSpec`: a checked (width, depth, heads, MLP) size that builds a `Decoder`.
* `causal_mask`, `prefix_lm_mask`: boolean attention masks, True where a query may see a key.

Dropout (rate `dropout`) acts on the two residual branches of every block when a call is given an
`rng`; with `rng=None` everything is deterministic. No biases anywhere, as in Gemma.
"""
from __future__ import annotations

import dataclasses
import math

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.zoo import mlp as mlp_lib


# ---------------------------------------------------------------------------------------------
# Masks.


def causal_mask(length: int) -> jax.Array:
  """[L, L] boolean, True where query t may attend to key s (s <= t)."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))


def prefix_lm_mask(length: int, prefix_length: int | jax.Array) -> jax.Array:
  """Causal, except that the first `prefix_length` positions all see each other.

  `prefix_length` is an int (-> [L, L]) or one length per example, shape [B] (-> [B, L, L]), for
  batches whose examples put different segments first. Suffix queries see the whole prefix and
  the suffix up to themselves; prefix queries never see the suffix.
  """
  prefix = jnp.asarray(prefix_length)[..., None, None]
  lead = (1,) * (prefix.ndim - 2)
  query = jnp.arange(length).reshape(lead + (length, 1))
  key = jnp.arange(length).reshape(lead + (1, length))
  return (query >= key) | (key < prefix)


# ---------------------------------------------------------------------------------------------
# Layers.


def _dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  if rng is None or rate == 0:
    return x
  keep = jax.random.bernoulli(rng, 1 - rate, x.shape)
  return jnp.where(keep, x / (1 - rate), 0).astype(x.dtype)


def _compute_dtype(dtype) -> jnp.dtype:
  """At least float32: reductions and softmaxes in bfloat16 lose too much, float64 is kept."""
  return jnp.promote_types(dtype, jnp.float32)


class RMSNorm(nnx.Module):
  """x / sqrt(mean(x^2) + eps) * (1 + scale) over the last axis; `scale` starts at 0.

  Statistics are taken in at least float32 and the result is cast back to x's dtype.
  """

  def __init__(self, features: int, *, eps: float = 1e-6, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    del rngs  # Zero initialisation needs no randomness.
    self.features, self.eps = features, eps
    self.scale = nnx.Param(jnp.zeros((features,), param_dtype))

  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [..., features] -> [..., features]."""
    chex.assert_shape(x, (..., self.features))
    h = x.astype(_compute_dtype(x.dtype))
    h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + self.eps)
    scale = self.scale[...].astype(h.dtype).reshape((1,) * (x.ndim - 1) + (self.features,))
    return (h * (1 + scale)).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, max_wavelength: float = 10_000) -> jax.Array:
  """Rotary position embedding; x: [B, L, H, Dh] (Dh even), positions: [B, L] -> [B, L, H, Dh].

  Feature pairs (i, i + Dh/2) are rotated by the angle position / max_wavelength^(2i/Dh), so the
  dot product of a rotated query and key depends on their positions only through the difference,
  and norms are unchanged.
  """
  chex.assert_rank(x, 4)
  chex.assert_shape(positions, x.shape[:2])
  head_dim = x.shape[-1]
  if head_dim % 2:
    raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
  dtype = _compute_dtype(x.dtype)
  inv_timescale = max_wavelength ** (-2 * jnp.arange(head_dim // 2, dtype=dtype) / head_dim)
  angle = positions.astype(dtype)[..., None, None] * inv_timescale[None, None, None]
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = jnp.split(x.astype(dtype), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _linear(in_features: int, out_features: int, *, param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
  # LeCun-normal weights (variance 1 / fan_in): with pre-norm blocks every projection then sees
  # unit-scale inputs and starts with unit-scale outputs.
  return nnx.Linear(in_features, out_features, use_bias=False, param_dtype=param_dtype,
                    dot_general=mlp_lib.flat_dot_general, rngs=rngs)


class MultiQueryAttention(nnx.Module):
  """Self-attention with `num_heads` query heads over `num_kv_heads` shared key/value heads.

  Query head h reads key/value head h // (num_heads / num_kv_heads). RoPE rotates q and k;
  logits are q.k / sqrt(head_dim) and the softmax runs in (at least) float32. `head_dim=None`
  means width // num_heads. Dropout (rate `dropout`) acts on the output when an rng is given.
  """

  def __init__(self, width: int, num_heads: int, num_kv_heads: int = 1,
               head_dim: int | None = None, *, dropout: float = 0.0, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if num_heads % num_kv_heads:
      raise ValueError(f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}")
    if head_dim is None:
      if width % num_heads:
        raise ValueError(f"width {width} is not divisible by num_heads {num_heads}; "
                         "pass head_dim explicitly")
      head_dim = width // num_heads
    if not 0 <= dropout < 1:
      raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    self.width, self.num_heads, self.num_kv_heads = width, num_heads, num_kv_heads
    self.head_dim, self.dropout = head_dim, dropout
    linear = lambda fan_in, fan_out: _linear(fan_in, fan_out, param_dtype=param_dtype, rngs=rngs)
    self.query = linear(width, num_heads * head_dim)
    self.key = linear(width, num_kv_heads * head_dim)
    self.value = linear(width, num_kv_heads * head_dim)
    self.out = linear(num_heads * head_dim, width)

  def __call__(self, x: jax.Array, *, positions: jax.Array, mask: jax.Array | None = None,
               rng: jax.Array | None = None) -> jax.Array:
    """x: [B, L, D], positions: [B, L] -> [B, L, D].

    `mask` ([B or 1, L, L], or [L, L]) is boolean (True = query t may attend to key s) or a float
    added to the logits; None attends everywhere. A query with no visible key gets the mean of
    all values rather than NaN.
    """
    chex.assert_shape(x, (None, None, self.width))
    batch, length, _ = x.shape
    groups = self.num_heads // self.num_kv_heads
    q = apply_rope(self.query(x).reshape(batch, length, self.num_heads, self.head_dim), positions)
    k = apply_rope(self.key(x).reshape(batch, length, self.num_kv_heads, self.head_dim), positions)
    v = self.value(x).reshape(batch, length, self.num_kv_heads, self.head_dim)
    # Heads k*G .. k*G + G-1 form group k and share key/value head k.
    q = q.reshape(batch, length, self.num_kv_heads, groups, self.head_dim)

    dtype = _compute_dtype(x.dtype)
    logits = jnp.einsum("btkgd,bskd->bkgts", q.astype(dtype), k.astype(dtype))
    logits = logits / math.sqrt(self.head_dim)
    if mask is not None:
      mask = _batched_mask(mask, batch, length)[:, None, None]   # [B, 1, 1, L, L]
      if mask.dtype == bool:
        # A finite floor, not -inf: a fully masked row then softmaxes to uniform, not NaN.
        logits = jnp.where(mask, logits, jnp.finfo(dtype).min)
      else:
        logits = logits + mask.astype(dtype)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    mixed = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    out = self.out(mixed.reshape(batch, length, self.num_heads * self.head_dim))
    return _dropout(out, self.dropout, rng)


def _batched_mask(mask: jax.Array, batch: int, length: int) -> jax.Array:
  """[L, L] or [B or 1, L, L] -> [B or 1, L, L], checked."""
  if mask.ndim == 2:
    mask = mask[None]
  chex.assert_shape(mask, (None, length, length))
  if mask.shape[0] not in (1, batch):
    raise ValueError(f"mask batch size {mask.shape[0]} is neither 1 nor {batch}")
  return mask


class GeGLU(nnx.Module):
  """x -> W_down(gelu(W_gate x) * W_up x), hidden size `mlp_dim`; [..., D] -> [..., D]."""

  def __init__(self, width: int, mlp_dim: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
    linear = lambda fan_in, fan_out: _linear(fan_in, fan_out, param_dtype=param_dtype, rngs=rngs)
    self.width = width
    self.gate = linear(width, mlp_dim)
    self.up = linear(width, mlp_dim)
    self.down = linear(mlp_dim, width)

  def __call__(self, x: jax.Array) -> jax.Array:
    chex.assert_shape(x, (..., self.width))
    return self.down(jax.nn.gelu(self.gate(x)) * self.up(x))


class DecoderBlock(nnx.Module):
  """x + dropout(attn(norm(x))), then x + dropout(mlp(norm(x))); [B, L, D] -> [B, L, D].

  The attention branch's dropout is the attention layer's own (on its output); the MLP's is here.
  """

  def __init__(self, width: int, *, num_heads: int, num_kv_heads: int = 1,
               head_dim: int | None = None, mlp_dim: int, dropout: float = 0.0,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.dropout = dropout
    self.attn_norm = RMSNorm(width, param_dtype=param_dtype, rngs=rngs)
    self.attn = MultiQueryAttention(width, num_heads, num_kv_heads, head_dim, dropout=dropout,
                                    param_dtype=param_dtype, rngs=rngs)
    self.mlp_norm = RMSNorm(width, param_dtype=param_dtype, rngs=rngs)
    self.mlp = GeGLU(width, mlp_dim, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array, *, positions: jax.Array, mask: jax.Array | None = None,
               rng: jax.Array | None = None) -> jax.Array:
    attn_rng, mlp_rng = jax.random.split(rng) if rng is not None else (None, None)
    x = x + self.attn(self.attn_norm(x), positions=positions, mask=mask, rng=attn_rng)
    return x + _dropout(self.mlp(self.mlp_norm(x)), self.dropout, mlp_rng)


class Decoder(nnx.Module):
  """`depth` DecoderBlocks and a final RMSNorm over embeddings: [B, L, D] -> [B, L, D].

  With `vocab_size`, also a token embedding (`embed`) and its tied read-out (`attend`); the
  embedding is not scaled by sqrt(width), so a caller mixing it with other inputs sees them at
  the scale they were made. `embed_init_std` draws the embedding from N(0, std^2) (Gemma-style
  models use 1.0); by default it is Flax's, std 1/sqrt(width).
  """

  def __init__(self, *, vocab_size: int | None = None, width: int, depth: int, num_heads: int,
               num_kv_heads: int = 1, head_dim: int | None = None, mlp_dim: int,
               dropout: float = 0.0, embed_init_std: float | None = None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.width, self.vocab_size = width, vocab_size
    embed_init = ({} if embed_init_std is None
                  else {"embedding_init": nnx.initializers.normal(embed_init_std)})
    self.token_embed = (nnx.Embed(vocab_size, width, param_dtype=param_dtype, rngs=rngs,
                                  **embed_init)
                        if vocab_size is not None else None)
    self.blocks = nnx.List([
        DecoderBlock(width, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     mlp_dim=mlp_dim, dropout=dropout, param_dtype=param_dtype, rngs=rngs)
        for _ in range(depth)])
    self.final_norm = RMSNorm(width, param_dtype=param_dtype, rngs=rngs)

  def _embedding(self) -> nnx.Embed:
    if self.token_embed is None:
      raise ValueError("this Decoder has no token embedding; build it with vocab_size")
    return self.token_embed

  def embed(self, tokens: jax.Array) -> jax.Array:
    """Integer tokens [B, L] -> embeddings [B, L, D]."""
    return self._embedding()(tokens)

  def attend(self, h: jax.Array) -> jax.Array:
    """Decoder outputs [B, L, D] -> token logits [B, L, vocab_size] (tied to the embedding)."""
    chex.assert_shape(h, (..., self.width))
    return self._embedding().attend(h)

  def __call__(self, x: jax.Array, *, positions: jax.Array | None = None,
               mask: jax.Array | None = None, rng: jax.Array | None = None) -> jax.Array:
    """x: [B, L, D] embeddings -> [B, L, D], final norm applied.

    `positions` [B, L] defaults to 0..L-1 per example. `mask` defaults to `causal_mask(L)`:
    a decoder that silently saw the future would be a bug, so full attention must be asked for
    (pass `jnp.ones((L, L), bool)`). See `MultiQueryAttention` for the mask forms.
    """
    chex.assert_shape(x, (None, None, self.width))
    batch, length, _ = x.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    chex.assert_shape(positions, (batch, length))
    mask = _batched_mask(causal_mask(length) if mask is None else mask, batch, length)
    depth = len(self.blocks)
    keys = jax.random.split(rng, depth) if rng is not None else [None] * depth
    for block, key in zip(self.blocks, keys):
      x = block(x, positions=positions, mask=mask, rng=key)
    return self.final_norm(x)


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
  """The size of a `Decoder` (multi-head: as many key/value heads as query heads), checked:
  every size >= 1, and a width that splits into heads of even size (RoPE rotates pairs)."""
  width: int = 64
  depth: int = 2
  num_heads: int = 4
  mlp_dim: int = 256

  def __post_init__(self):
    for name in ("width", "depth", "num_heads", "mlp_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
    if self.width % self.num_heads or (self.width // self.num_heads) % 2:
      raise ValueError(f"model.width {self.width} must split into model.num_heads "
                       f"{self.num_heads} heads of even size (RoPE)")

  def build(self, vocab_size: int | None, *, rngs: nnx.Rngs, **options) -> Decoder:
    return Decoder(vocab_size=vocab_size, width=self.width, depth=self.depth,
                   num_heads=self.num_heads, num_kv_heads=self.num_heads,
                   mlp_dim=self.mlp_dim, rngs=rngs, **options)


# ---------------------------------------------------------------------------------------------
# Decoding.


def greedy_generate(logits_fn, tokens: jax.Array, segments: jax.Array, prompt_len: jax.Array,
                    max_new: int, *, new_segment: int = 3) -> tuple[jax.Array, jax.Array]:
  """Greedy decoding into a fixed-length buffer, one full forward pass per new token.

  logits_fn(tokens [B, L], segments [B, L]) -> logits [B, L, V] (causal, so what lies beyond a
  row's current end does not matter). tokens, segments: [B, L] buffers holding each prompt in
  its first `prompt_len[b]` positions. Returns (tokens, segments) with `max_new` argmax tokens
  written after each prompt (segment `new_segment`); a row that reaches the end of the buffer
  stops there. One `lax.scan` of fixed length: nothing recompiles per prompt length.
  """
  chex.assert_rank([tokens, segments], 2)
  chex.assert_equal_shape([tokens, segments])
  batch, length = tokens.shape
  prompt_len = jnp.broadcast_to(jnp.asarray(prompt_len, jnp.int32), (batch,))
  positions = jnp.arange(length)

  def step(carry, index):
    tokens, segments = carry
    last = prompt_len + index - 1                   # the position whose logits come next
    logits = logits_fn(tokens, segments)
    picked = jnp.take_along_axis(logits, jnp.clip(last, 0, length - 1)[:, None, None], axis=1)
    new = jnp.argmax(picked[:, 0], axis=-1).astype(tokens.dtype)
    write = (positions[None] == (last + 1)[:, None]) & ((last + 1) < length)[:, None]
    tokens = jnp.where(write, new[:, None], tokens)
    segments = jnp.where(write, jnp.asarray(new_segment, segments.dtype), segments)
    return (tokens, segments), None

  (tokens, segments), _ = jax.lax.scan(step, (tokens, segments), jnp.arange(max_new))
  return tokens, segments
