"""Sequence mixers and a GPT-2-style backbone that takes any of them.

* `LongConv`: depthwise causal convolution whose kernel spans the whole sequence, computed as a
  banded Toeplitz matmul (exact, fastest for short sequences) or by FFT (for long ones).
* `BaseConv`: the gated convolution `W_out[(K * W_in u + b_K) (W_p u + b_p)]`, mixed with the input
  by branch weights (w0, w1) initialised to (1, 0). Every map is linear or bilinear, so a stack of
  them is a polynomial in its input.
* `Backbone`: read-in, learned positions, residual blocks `x + mixer(LN(x))` (+ optional MLP),
  optional final LN, read-out. GPT-2 initialisation: N(0, 0.02) weights and residual projections
  scaled by 1/sqrt(2 * depth). With attention mixers it can hand back what each attention sees
  (`return_attention_inputs`) and run with replaced query-key matrices (`query_keys`), without
  touching its parameters: what methods that compress or prune attention need.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.zoo.attention import Attention, QueryKey
from jaxlab.zoo.mlp import MLP, normal_linear, torch_default_linear

CONV_IMPLS = ("toeplitz", "fft")


def toeplitz_causal_conv(v: jax.Array, kernel: jax.Array) -> jax.Array:
  """y[b, t, c] = sum_{s <= t} kernel[t - s, c] v[b, s, c]; v: [B, L, C], kernel: [>=L, C]."""
  length = v.shape[1]
  lag = jnp.arange(length)[:, None] - jnp.arange(length)[None, :]
  taps = jnp.where((lag >= 0)[..., None], kernel[jnp.clip(lag, 0, length - 1)], 0)
  return jnp.einsum("tsc,bsc->btc", taps, v)


def fft_causal_conv(v: jax.Array, kernel: jax.Array) -> jax.Array:
  """The same causal convolution by zero-padded FFT (O(L log L) per channel)."""
  length = v.shape[1]
  n = 2 * length
  spectrum = jnp.fft.rfft(v, n=n, axis=1) * jnp.fft.rfft(kernel[:length], n=n, axis=0)[None]
  return jnp.fft.irfft(spectrum, n=n, axis=1)[:, :length].astype(v.dtype)


class LongConv(nnx.Module):
  """Depthwise causal convolution with a kernel as long as the sequence, plus bias.

  `residual` adds the input to the output (the convolution's skip path). Initialisation follows
  torch's Conv1d (uniform in +-1/sqrt(kernel length)).
  """

  def __init__(self, width: int, max_len: int, *, impl: str = "toeplitz",
               residual: bool = True, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if impl not in CONV_IMPLS:
      raise ValueError(f"unknown convolution impl {impl!r}; choose one of {CONV_IMPLS}")
    bound = 1.0 / math.sqrt(max_len)
    init = nnx.initializers.uniform(2 * bound)
    self.kernel = nnx.Param(init(rngs.params(), (max_len, width), param_dtype) - bound)
    self.bias = nnx.Param(init(rngs.params(), (width,), param_dtype) - bound)
    self.impl, self.residual, self.max_len = impl, residual, max_len

  def __call__(self, v: jax.Array, last_only: bool = False) -> jax.Array:
    """v: [B, L, C] with L <= max_len -> [B, L, C], or [B, 1, C] (last position) if last_only."""
    length = v.shape[1]
    if length > self.max_len:
      raise ValueError(f"sequence length {length} exceeds the kernel length {self.max_len}")
    kernel = self.kernel[...]
    if last_only:
      y = jnp.einsum("sc,bsc->bc", kernel[:length][::-1], v)[:, None]
      v = v[:, -1:]
    else:
      conv = toeplitz_causal_conv if self.impl == "toeplitz" else fft_causal_conv
      y = conv(v, kernel)
    y = y + self.bias[...][None, None]
    return y + v if self.residual else y


class BaseConv(nnx.Module):
  """Gated long convolution: w0 * W_out[(K * W_in u + b_K) (W_p u + b_p)] + w1 * u.

  All three projections start N(0, init_std^2) (GPT-2 scales only attention's and the MLP's
  output projections, not this one).
  """

  def __init__(self, width: int, max_len: int, *, conv_impl: str = "toeplitz",
               conv_residual: bool = True, init_std: float = 0.02,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    linear = lambda: normal_linear(width, width, std=init_std, param_dtype=param_dtype, rngs=rngs)
    self.width = width
    self.in_proj = linear()
    self.conv = LongConv(width, max_len, impl=conv_impl, residual=conv_residual,
                         param_dtype=param_dtype, rngs=rngs)
    self.gate_proj = linear()
    self.out_proj = linear()
    self.branch = nnx.Param(jnp.array([1.0, 0.0], dtype=param_dtype))

  def __call__(self, u: jax.Array, last_only: bool = False) -> jax.Array:
    """u: [B, L, D] -> [B, L, D], or [B, 1, D] (the last position only) if last_only."""
    chex.assert_shape(u, (None, None, self.width))
    if last_only:
      conv, u = self.conv(self.in_proj(u), last_only=True), u[:, -1:]
    else:
      conv = self.conv(self.in_proj(u))
    y = self.out_proj(conv * self.gate_proj(u))
    w = self.branch[...]
    return w[0] * y + w[1] * u


MixerFactory = Callable[[nnx.Rngs], nnx.Module]


def mixer_factory(kind: str, width: int, max_len: int, *, num_heads: int = 1,
                  causal: bool = True, qkv_bias: bool = True, conv_impl: str = "toeplitz",
                  conv_residual: bool = True, init_std: float = 0.02,
                  out_init_std: float = 0.02, param_dtype=jnp.float32) -> MixerFactory:
  """Names a mixer: "baseconv", "softmax_attention" or "linear_attention".

  `qkv_bias` is attention's (a bias on the fused q/k/v projection); BaseConv has no such
  projection and ignores it.
  """
  if kind == "baseconv":
    if not causal:
      raise ValueError("BaseConv's long convolution is causal; set causal=True")
    return lambda rngs: BaseConv(width, max_len, conv_impl=conv_impl,
                                 conv_residual=conv_residual, init_std=init_std,
                                 param_dtype=param_dtype, rngs=rngs)
  if kind in ("softmax_attention", "linear_attention"):
    return lambda rngs: Attention(width, num_heads, kind=kind.split("_")[0], causal=causal,
                                  qkv_bias=qkv_bias, init_std=init_std,
                                  out_init_std=out_init_std, param_dtype=param_dtype,
                                  rngs=rngs)
  raise ValueError(f"unknown mixer {kind!r}; choose one of {MIXERS}")


MIXERS = ("baseconv", "softmax_attention", "linear_attention")


class Block(nnx.Module):
  """x + mixer(LN(x)), then optionally x + MLP(LN(x)). LayerNorms are optional."""

  def __init__(self, width: int, mixer: MixerFactory, *, use_mlp: bool = False,
               use_layernorm: bool = True, mlp_ratio: int = 4, mlp_activation: str = "gelu",
               init_std: float = 0.02, out_init_std: float = 0.02,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    norm = lambda: (nnx.LayerNorm(width, epsilon=1e-5, param_dtype=param_dtype, rngs=rngs)
                    if use_layernorm else None)
    self.norm_mixer = norm()
    self.mixer = mixer(rngs)
    self.norm_mlp = norm() if use_mlp else None
    self.mlp = (MLP([width, mlp_ratio * width, width], activation=mlp_activation,
                    init_std=init_std, out_init_std=out_init_std, param_dtype=param_dtype,
                    rngs=rngs) if use_mlp else None)

  def __call__(self, x: jax.Array, last_only: bool = False, *,
               query_key: QueryKey | None = None,
               return_mixer_input: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """x: [B, L, D] -> [B, L, D]; with last_only, [B, 1, D] for the last position.

    `query_key` is passed to an attention mixer (replaced query-key matrices, see
    `Attention.__call__`). `return_mixer_input` also returns what the mixer saw, LN(x) [B, L, D].
    """
    h = self.norm_mixer(x) if self.norm_mixer is not None else x
    if query_key is None:
      mixed = self.mixer(h, last_only=last_only)
    elif isinstance(self.mixer, Attention):
      mixed = self.mixer(h, last_only=last_only, query_key=query_key)
    else:
      raise ValueError(f"query_key replaces attention's query-key matrices; this block's mixer "
                       f"is a {type(self.mixer).__name__}")
    out = (x[:, -1:] if last_only else x) + mixed
    if self.mlp is not None:
      g = self.norm_mlp(out) if self.norm_mlp is not None else out
      out = out + self.mlp(g)
    return (out, h) if return_mixer_input else out


class Backbone(nnx.Module):
  """GPT-2-style sequence model around any mixer: [B, L, d_in] -> [B, L, d_out].

  Read-in and read-out are initialised like torch.nn.Linear (U(+-1/sqrt(fan_in))); the blocks
  and positions like GPT-2 (N(0, init_std^2), residual projections / sqrt(2 * depth)).
  """

  def __init__(self, *, d_in: int, d_out: int, width: int, depth: int, max_len: int,
               mixer: str = "baseconv", num_heads: int = 1, causal: bool = True,
               qkv_bias: bool = True, use_mlp: bool = False, use_layernorm: bool = True,
               final_layernorm: bool = True, conv_impl: str = "toeplitz",
               conv_residual: bool = True, mlp_activation: str = "gelu",
               init_std: float = 0.02, param_dtype=jnp.float32, rngs: nnx.Rngs):
    out_std = init_std / math.sqrt(2 * depth)
    make_mixer = mixer_factory(mixer, width, max_len, num_heads=num_heads, causal=causal,
                               qkv_bias=qkv_bias, conv_impl=conv_impl,
                               conv_residual=conv_residual, init_std=init_std,
                               out_init_std=out_std, param_dtype=param_dtype)
    self.d_in, self.max_len = d_in, max_len
    self.read_in = torch_default_linear(d_in, width, param_dtype=param_dtype, rngs=rngs)
    self.positions = nnx.Param(
        nnx.initializers.normal(init_std)(rngs.params(), (max_len, width), param_dtype))
    self.blocks = nnx.List([
        Block(width, make_mixer, use_mlp=use_mlp, use_layernorm=use_layernorm,
              mlp_activation=mlp_activation, init_std=init_std, out_init_std=out_std,
              param_dtype=param_dtype, rngs=rngs)
        for _ in range(depth)])
    self.final_norm = (nnx.LayerNorm(width, epsilon=1e-5, param_dtype=param_dtype, rngs=rngs)
                       if final_layernorm else None)
    self.read_out = torch_default_linear(width, d_out, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array, last_only: bool = False, *,
               return_attention_inputs: bool = False,
               query_keys: Sequence[QueryKey | None] | None = None,
               ) -> jax.Array | tuple[jax.Array, list[jax.Array]]:
    """x: [B, L, d_in] -> [B, L, d_out].

    With `last_only`, returns [B, 1, d_out]: only the last position's output, and the last block
    computes nothing else (a causal model's other outputs are not needed for it).

    `return_attention_inputs` returns `(output, inputs)`, `inputs[i]` being block i's mixer
    input after its LayerNorm, [B, L, D] (the activations that calibrate an edit of the
    attention). `query_keys` (one entry per block, None or an `Attention` `query_key` dict)
    runs the attention mixers with replaced query-key matrices.
    """
    chex.assert_shape(x, (None, None, self.d_in))
    length = x.shape[1]
    if length > self.max_len:
      raise ValueError(f"sequence length {length} exceeds max_len {self.max_len}")
    if query_keys is None:
      query_keys = [None] * len(self.blocks)
    else:
      for block in self.blocks:
        if not isinstance(block.mixer, Attention):
          raise ValueError(f"query_keys replaces attention's query-key matrices; this "
                           f"backbone's mixer is a {type(block.mixer).__name__}")
      if len(query_keys) != len(self.blocks):
        raise ValueError(f"query_keys has {len(query_keys)} entries; expected one per block "
                         f"({len(self.blocks)})")
    h = self.read_in(x) + self.positions[...][None, :length]
    inputs = []
    for i, (block, query_key) in enumerate(zip(self.blocks, query_keys)):
      last = last_only and i == len(self.blocks) - 1
      if return_attention_inputs:
        h, mixer_input = block(h, last_only=last, query_key=query_key, return_mixer_input=True)
        inputs.append(mixer_input)
      else:
        h = block(h, last_only=last, query_key=query_key)
    if self.final_norm is not None:
      h = self.final_norm(h)
    out = self.read_out(h)
    return (out, inputs) if return_attention_inputs else out
