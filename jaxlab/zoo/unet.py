"""A small diffusion UNet for NHWC images of about 16x16 to 32x32 pixels.

The denoiser shared by several diffusion methods: it maps a noisy image `x`, a timestep `t` and
optionally a class or task `label` to an image of the same height and width (a noise, velocity or
clean-image prediction; the caller decides which).

* `sinusoidal_embedding`: the transformer position encoding applied to (possibly fractional)
  timesteps, `[B] -> [B, dim]`.
* `ResidualBlock`: GroupNorm -> SiLU -> 3x3 conv -> + projected time embedding -> GroupNorm ->
  SiLU -> 3x3 conv, added to the input (through a 1x1 conv when the channel count changes).
* `SpatialSelfAttention`: GroupNorm, then softmax self-attention over the H*W pixels as tokens
  (the zoo's `Attention`, non-causal), added to the input.
* `UNet`: input conv; an encoder of residual blocks with a stride-2 conv between levels; a middle
  of residual block, optional attention, residual block; a decoder that mirrors the encoder,
  concatenating the matching encoder activation before every block, optionally with
  self-attention after a level's blocks (`attention_levels`), and upsampling by
  nearest-neighbour repetition plus a conv; output GroupNorm -> SiLU -> 3x3 conv. `taps` returns
  named intermediate activations (feature guidance reads them) and `attention_override` runs a
  self-attention layer with another image's keys and values (`AttentionOverride`).
* `widen_input_channels`: turns a trained UNet's parameters into those of one with a multiple of
  its input channels (fine-tuning with extra conditioning channels, as Marigold does).

The output conv is zero-initialised, so a fresh model predicts exactly 0 and every residual
branch below it starts contributing only as that conv moves away from 0.

Shapes: B batch, H x W pixels, C channels; all images are NHWC.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.zoo.attention import Attention
from jaxlab.zoo.mlp import MLP


def sinusoidal_embedding(t: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
  """Timesteps `t` [B] (int or float) -> [B, dim] float32 features.

  With half = dim // 2 and frequencies f_i = max_period^(-i / half), i = 0 .. half - 1, the
  features are [cos(t f_0), ..., cos(t f_{half-1}), sin(t f_0), ..., sin(t f_{half-1})], with one
  zero column appended when `dim` is odd. Periods therefore run from 2 pi to about
  2 pi max_period timesteps.
  """
  if dim < 1:
    raise ValueError(f"embedding dim must be positive, got {dim}")
  t = jnp.asarray(t, jnp.float32)
  chex.assert_rank(t, 1)
  half = dim // 2
  frequencies = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  angles = t[:, None] * frequencies[None, :]
  features = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)
  if dim % 2:
    features = jnp.concatenate([features, jnp.zeros_like(features[:, :1])], axis=-1)
  return features


def conv3x3(in_channels: int, out_channels: int, *, rngs: nnx.Rngs, strides: int = 1,
            zero_init: bool = False) -> nnx.Conv:
  """3x3 conv with one pixel of zero padding: keeps H x W, or halves even H x W at stride 2."""
  kwargs = {}
  if zero_init:
    kwargs["kernel_init"] = nnx.initializers.zeros_init()
  return nnx.Conv(in_channels, out_channels, (3, 3), strides=strides, padding=((1, 1), (1, 1)),
                  rngs=rngs, **kwargs)


class ResidualBlock(nnx.Module):
  """[B, H, W, in] and a time embedding [B, E] -> [B, H, W, out]."""

  def __init__(self, in_channels: int, out_channels: int, embedding_dim: int, *, groups: int,
               rngs: nnx.Rngs):
    self.in_channels, self.out_channels = in_channels, out_channels
    self.norm_in = nnx.GroupNorm(in_channels, num_groups=groups, rngs=rngs)
    self.conv_in = conv3x3(in_channels, out_channels, rngs=rngs)
    self.embedding_projection = nnx.Linear(embedding_dim, out_channels, rngs=rngs)
    self.norm_out = nnx.GroupNorm(out_channels, num_groups=groups, rngs=rngs)
    self.conv_out = conv3x3(out_channels, out_channels, rngs=rngs)
    self.skip = (nnx.Conv(in_channels, out_channels, (1, 1), rngs=rngs)
                 if in_channels != out_channels else None)

  def __call__(self, x: jax.Array, embedding: jax.Array) -> jax.Array:
    chex.assert_shape(x, (None, None, None, self.in_channels))
    h = self.conv_in(jax.nn.silu(self.norm_in(x)))
    shift = self.embedding_projection(jax.nn.silu(embedding))           # [B, out]
    h = h + shift[:, None, None, :]                                     # [B, 1, 1, out]
    h = self.conv_out(jax.nn.silu(self.norm_out(h)))
    return h + (x if self.skip is None else self.skip(x))


class SpatialSelfAttention(nnx.Module):
  """x + attention(GroupNorm(x)) with the H*W pixels of [B, H, W, C] as C-wide tokens.

  `attend(x, override)` also returns the layer's q, k, v ([B, H, W, C] each, heads side by
  side) and can run with an `AttentionOverride`: replacement keys and values (attention to
  another image's tokens, as StyleID injects a style image's), a query blended with a given one,
  and a temperature that multiplies the logits.
  """

  def __init__(self, channels: int, num_heads: int, *, groups: int, rngs: nnx.Rngs):
    self.norm = nnx.GroupNorm(channels, num_groups=groups, rngs=rngs)
    self.attention = Attention(channels, num_heads, kind="softmax", causal=False, rngs=rngs)

  def attend(self, x: jax.Array, override: "AttentionOverride | None" = None
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(output [B, H, W, C], {"q", "k", "v"} of this input, each [B, H, W, C])."""
    batch, height, width, channels = x.shape
    tokens = self.norm(x).reshape(batch, height * width, channels)
    q, k, v = self.attention.heads(tokens)                      # [B, heads, HW, C / heads]
    merge = lambda h: jnp.swapaxes(h, 1, 2).reshape(batch, height, width, channels)
    own = {"q": merge(q), "k": merge(k), "v": merge(v)}
    if override is None:
      # The layer exactly as trained (bit for bit what `__call__` has always computed).
      return x + self.attention(tokens).reshape(batch, height, width, channels), own
    split = lambda a: self.attention._split_heads(  # pylint: disable=protected-access
        a.reshape(batch, height * width, channels).astype(q.dtype))
    if override.query is not None:
      blend = jnp.asarray(override.query_blend, q.dtype)
      q = blend * split(override.query) + (1 - blend) * q
    if override.key is not None:
      k = split(override.key)
    if override.value is not None:
      v = split(override.value)
    head_dim = channels // self.attention.num_heads
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (override.temperature / math.sqrt(head_dim))
    mixed = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, axis=-1), v)
    mixed = jnp.swapaxes(mixed, 1, 2).reshape(batch, height * width, channels)
    return x + self.attention.out(mixed).reshape(batch, height, width, channels), own

  def __call__(self, x: jax.Array) -> jax.Array:
    batch, height, width, channels = x.shape
    tokens = self.norm(x).reshape(batch, height * width, channels)
    return x + self.attention(tokens).reshape(batch, height, width, channels)


class AttentionOverride(NamedTuple):
  """How one self-attention layer runs instead of as trained (any field may be left out).

  key, value: [B, H, W, C] replacement keys and values (another image's, from its taps);
  query: [B, H, W, C] a query to blend in: q = query_blend * query + (1 - query_blend) * q_own;
  temperature: multiplies the logits (> 1 sharpens the attention).
  """
  key: jax.Array | None = None
  value: jax.Array | None = None
  query: jax.Array | None = None
  query_blend: float = 1.0
  temperature: float = 1.0


class Downsample(nnx.Module):
  """Stride-2 3x3 conv: [B, H, W, C] -> [B, H/2, W/2, C]."""

  def __init__(self, channels: int, *, rngs: nnx.Rngs):
    self.conv = conv3x3(channels, channels, strides=2, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.conv(x)


class Upsample(nnx.Module):
  """Nearest-neighbour x2 then a 3x3 conv: [B, H, W, C] -> [B, 2H, 2W, C]."""

  def __init__(self, channels: int, *, rngs: nnx.Rngs):
    self.conv = conv3x3(channels, channels, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))


class UNet(nnx.Module):
  """Denoiser `(x [B, H, W, in_channels], t [B], label [B] | None) -> [B, H, W, out_channels]`.

  Level i of the encoder works at resolution H / 2^i with `base_channels * channel_multipliers[i]`
  channels, so H and W must be divisible by 2^(len(channel_multipliers) - 1). The time embedding
  (width 4 * base_channels) is an MLP (Linear -> SiLU -> Linear) of `sinusoidal_embedding(t,
  base_channels)`; with `num_embeddings` set, a learned embedding of `label` is added to it, and
  `label` is then required. Every residual block receives SiLU(embedding) through its own linear
  projection. Every channel count must be divisible by `groups` (GroupNorm) and the lowest level's
  by `num_heads` when `attention_at_lowest`.

  The decoder visits the levels in reverse with `blocks_per_level + 1` residual blocks each; before
  every one it concatenates (on channels) the most recent not yet used encoder activation: the
  outputs of the input conv, of every encoder block and of every downsample, last in first out.
  """

  def __init__(self, *, in_channels: int, out_channels: int, base_channels: int = 32,
               channel_multipliers: Sequence[int] = (1, 2, 2), blocks_per_level: int = 1,
               attention_at_lowest: bool = True, num_heads: int = 4, groups: int = 8,
               num_embeddings: int | None = None, attention_levels: Sequence[int] = (),
               rngs: nnx.Rngs):
    channel_multipliers = tuple(channel_multipliers)
    attention_levels = tuple(sorted(set(int(level) for level in attention_levels)))
    if not channel_multipliers or min(channel_multipliers) < 1:
      raise ValueError(f"channel_multipliers must be positive and non-empty, "
                       f"got {channel_multipliers}")
    if blocks_per_level < 1:
      raise ValueError(f"blocks_per_level must be at least 1, got {blocks_per_level}")
    level_channels = [base_channels * m for m in channel_multipliers]
    if any(c % groups for c in level_channels):
      raise ValueError(f"every level's channel count {level_channels} must be divisible by "
                       f"groups={groups}")
    if attention_at_lowest and level_channels[-1] % num_heads:
      raise ValueError(f"lowest level's {level_channels[-1]} channels are not divisible by "
                       f"num_heads={num_heads}")
    if num_embeddings is not None and num_embeddings < 1:
      raise ValueError(f"num_embeddings must be positive or None, got {num_embeddings}")
    for level in attention_levels:
      if not 0 <= level < len(channel_multipliers):
        raise ValueError(f"attention_levels has level {level}; levels are 0 .. "
                         f"{len(channel_multipliers) - 1}")
      if level_channels[level] % num_heads:
        raise ValueError(f"level {level}'s {level_channels[level]} channels are not divisible "
                         f"by num_heads={num_heads}")
    self.attention_levels = attention_levels

    self.in_channels, self.out_channels = in_channels, out_channels
    self.base_channels = base_channels
    self.num_levels = len(channel_multipliers)
    self.num_embeddings = num_embeddings
    embedding_dim = 4 * base_channels

    self.time_mlp = MLP([base_channels, embedding_dim, embedding_dim], activation="silu",
                        rngs=rngs)
    self.label_embedding = (nnx.Embed(num_embeddings, embedding_dim, rngs=rngs)
                            if num_embeddings is not None else None)
    self.input_conv = conv3x3(in_channels, base_channels, rngs=rngs)

    block = lambda c_in, c_out: ResidualBlock(c_in, c_out, embedding_dim, groups=groups,
                                              rngs=rngs)
    # Encoder; `skip_channels` tracks the channel counts of the activations the decoder will use.
    skip_channels = [base_channels]
    channels = base_channels
    encoder_blocks, downsamples = [], []
    for level, level_out in enumerate(level_channels):
      blocks = []
      for _ in range(blocks_per_level):
        blocks.append(block(channels, level_out))
        channels = level_out
        skip_channels.append(channels)
      encoder_blocks.append(nnx.List(blocks))
      if level < self.num_levels - 1:
        downsamples.append(Downsample(channels, rngs=rngs))
        skip_channels.append(channels)
    self.encoder_blocks = nnx.List(encoder_blocks)
    self.downsamples = nnx.List(downsamples)

    self.middle_in = block(channels, channels)
    self.middle_attention = (SpatialSelfAttention(channels, num_heads, groups=groups, rngs=rngs)
                             if attention_at_lowest else None)
    self.middle_out = block(channels, channels)

    # Decoder, lowest level first (so `decoder_blocks[0]` is the lowest level).
    decoder_blocks, upsamples = [], []
    for level in reversed(range(self.num_levels)):
      blocks = []
      for _ in range(blocks_per_level + 1):
        blocks.append(block(channels + skip_channels.pop(), level_channels[level]))
        channels = level_channels[level]
      decoder_blocks.append(nnx.List(blocks))
      if level > 0:
        upsamples.append(Upsample(channels, rngs=rngs))
    assert not skip_channels, skip_channels
    self.decoder_blocks = nnx.List(decoder_blocks)
    self.upsamples = nnx.List(upsamples)
    # Only built when asked for, so parameters of UNets without it keep their old layout.
    if attention_levels:
      self.decoder_attention = nnx.Dict({
          str(level): SpatialSelfAttention(level_channels[level], num_heads, groups=groups,
                                           rngs=rngs) for level in attention_levels})

    self.output_norm = nnx.GroupNorm(channels, num_groups=groups, rngs=rngs)
    self.output_conv = conv3x3(channels, out_channels, zero_init=True, rngs=rngs)

  def embed(self, t: jax.Array, label: jax.Array | None) -> jax.Array:
    """Timesteps [B] (and labels [B]) -> the conditioning embedding [B, 4 * base_channels]."""
    embedding = self.time_mlp(sinusoidal_embedding(t, self.base_channels))
    return add_label(embedding, self.label_embedding, label, t, "UNet")

  def tap_names(self) -> tuple[str, ...]:
    """Every activation `__call__(..., taps=...)` can return, in computation order.

    `enc<l>_<i>`: encoder block i of level l (level 0 is full resolution); `mid_q`, `mid_k`,
    `mid_v`: the middle self-attention's queries, keys and values (with `attention_at_lowest`);
    `mid`: the middle's output; `dec<l>_<i>`: decoder block i of level l; `dec<l>_q`, `_k`, `_v`:
    the decoder self-attention of level l (with `attention_levels`). Each is [B, h, w, C].
    """
    blocks = len(self.encoder_blocks[0])
    names = [f"enc{level}_{i}" for level in range(self.num_levels) for i in range(blocks)]
    if self.middle_attention is not None:
      names += ["mid_q", "mid_k", "mid_v"]
    names.append("mid")
    for level in reversed(range(self.num_levels)):
      names += [f"dec{level}_{i}" for i in range(blocks + 1)]
      if level in self.attention_levels:
        names += [f"dec{level}_q", f"dec{level}_k", f"dec{level}_v"]
    return tuple(names)

  def attention_names(self) -> tuple[str, ...]:
    """The self-attention layers an `attention_override` may name: `mid`, `dec<l>`."""
    return ((("mid",) if self.middle_attention is not None else ())
            + tuple(f"dec{level}" for level in reversed(self.attention_levels)))

  def __call__(self, x: jax.Array, t: jax.Array, label: jax.Array | None = None, *,
               taps: Sequence[str] = (),
               attention_override: Mapping[str, AttentionOverride] | None = None):
    """x [B, H, W, in_channels], t [B] (or a scalar, shared) -> [B, H, W, out_channels].

    With `taps` (names from `tap_names`), returns (output, {name: activation}) instead; the
    output is the same either way. `attention_override` maps attention layers (`mid`, `dec<l>`)
    to an `AttentionOverride` under which they run.
    """
    if x.ndim != 4 or x.shape[-1] != self.in_channels:
      raise ValueError(f"expected x of shape [B, H, W, {self.in_channels}], got {x.shape}")
    taps = tuple(taps)
    known = self.tap_names()
    unknown = [name for name in taps if name not in known]
    if unknown:
      raise ValueError(f"unknown taps {unknown}; this UNet has {', '.join(known)}")
    overrides = dict(attention_override or {})
    bad = [name for name in overrides if name not in self.attention_names()]
    if bad:
      raise ValueError(f"attention_override names {bad}; this UNet's attention layers are "
                       f"{', '.join(self.attention_names()) or '(none)'}")
    batch, height, width, _ = x.shape
    divisor = 2 ** (self.num_levels - 1)
    if height % divisor or width % divisor:
      raise ValueError(f"H and W must be divisible by 2^(levels - 1) = {divisor}, "
                       f"got {height}x{width}")
    t = jnp.asarray(t)
    if t.ndim == 0:
      t = jnp.broadcast_to(t, (batch,))
    chex.assert_shape(t, (batch,))
    embedding = self.embed(t, label)
    tapped: dict[str, jax.Array] = {}

    def keep(name, value):
      if name in taps:
        tapped[name] = value

    def attention(layer, name, h):
      if name not in overrides and not any(tap.startswith(name + "_") for tap in taps):
        return layer(h)
      h, qkv = layer.attend(h, overrides.get(name))
      for key, value in qkv.items():
        keep(f"{name}_{key}", value)
      return h

    h = self.input_conv(x)
    skips = [h]
    for level in range(self.num_levels):
      for i, block in enumerate(self.encoder_blocks[level]):
        h = block(h, embedding)
        keep(f"enc{level}_{i}", h)
        skips.append(h)
      if level < self.num_levels - 1:
        h = self.downsamples[level](h)
        skips.append(h)

    h = self.middle_in(h, embedding)
    if self.middle_attention is not None:
      h = attention(self.middle_attention, "mid", h)
    h = self.middle_out(h, embedding)
    keep("mid", h)

    for i, blocks in enumerate(self.decoder_blocks):
      level = self.num_levels - 1 - i
      for j, block in enumerate(blocks):
        h = block(jnp.concatenate([h, skips.pop()], axis=-1), embedding)
        keep(f"dec{level}_{j}", h)
      if level in self.attention_levels:
        h = attention(self.decoder_attention[str(level)], f"dec{level}", h)
      if i < self.num_levels - 1:
        h = self.upsamples[i](h)
    out = self.output_conv(jax.nn.silu(self.output_norm(h)))
    return (out, tapped) if taps else out


def check_label(label_embedding: nnx.Embed | None, label: jax.Array | None,
                network: str) -> None:
  """Fails unless a label is passed exactly when the network embeds labels."""
  if label_embedding is None and label is not None:
    raise ValueError(f"this {network} has no label embedding (num_embeddings=None); "
                     "do not pass a label")
  if label_embedding is not None and label is None:
    raise ValueError(f"this {network} embeds labels (num_embeddings="
                     f"{label_embedding.num_embeddings}); pass label, an int array of shape [B]")


def add_label(embedding: jax.Array, label_embedding: nnx.Embed | None,
              label: jax.Array | None, t: jax.Array, network: str) -> jax.Array:
  """The time embedding plus the label's (a network built with `num_embeddings`), checking that
  a label is passed exactly when the network embeds labels."""
  check_label(label_embedding, label, network)
  if label_embedding is None:
    return embedding
  chex.assert_equal_shape([label, t])
  return embedding + label_embedding(label)


def add_label_embedding(params: dict, num_labels: int) -> dict:
  """Params of a network without labels -> those of the same network built with
  `num_embeddings = num_labels + 1`, whose label table is zero: on any label it computes exactly
  what `params` computes. The last row is the null label ("no condition"), as classifier-free
  guidance and fine-tuning for control use it. Works for `UNet` and `ResidualMLP` params (both
  add the label's embedding to the output of `time_mlp`)."""
  if "label_embedding" in params:
    raise ValueError("these params already have a label embedding")
  if num_labels < 1:
    raise ValueError(f"num_labels must be at least 1, got {num_labels}")
  layers = params["time_mlp"]["layers"]
  width = layers[max(layers)]["kernel"].shape[-1]
  dtype = layers[max(layers)]["kernel"].dtype
  labelled = dict(params)
  labelled["label_embedding"] = {"embedding": jnp.zeros((num_labels + 1, width), dtype)}
  return labelled


def widen_input_channels(params: dict, new_in_channels: int) -> dict:
  """UNet params for `new_in_channels` inputs that on [x, x, ...] (k copies) act as before on x.

  `params` is the pure nested dict of a `UNet` (from `Functional.init` or `nnx.to_pure_dict`).
  The input conv kernel [3, 3, in, C] is tiled k = new_in_channels / in times along its input
  axis and divided by k, so the conv, being linear in its input, sums k copies of kernel / k.
  Everything else is shared with `params` (arrays are not copied; the dicts are new).
  """
  kernel = params["input_conv"]["kernel"]
  in_channels = kernel.shape[2]
  if new_in_channels < in_channels or new_in_channels % in_channels:
    raise ValueError(f"new_in_channels={new_in_channels} must be a positive multiple of the "
                     f"current {in_channels}")
  factor = new_in_channels // in_channels
  widened = jax.tree.map(lambda leaf: leaf, params)      # new dicts, same arrays
  widened["input_conv"]["kernel"] = jnp.tile(kernel, (1, 1, factor, 1)) / factor
  return widened
