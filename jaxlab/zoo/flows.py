"""Normalizing-flow layers: invertible maps with a tractable log-Jacobian-determinant.

* `rational_quadratic_spline` / `rational_quadratic_spline_inverse`: the monotone
  rational-quadratic spline of Durkan et al. (2019), elementwise, identity outside [-bound, bound].
* `MaskedAutoregressiveSpline`: a MADE conditioner (Germain et al. 2015) emitting spline parameters
  for each dimension from the dimensions before it; one pass forward, `features` passes inverse.
* `AffineCoupling`: the conditioning dimensions, through a caller-supplied conditioner, scale and
  shift the transformed ones (by default the second half).
* `Permutation`: a fixed reordering of the features (no parameters).
* `Chain`: sequential composition.
* Token flows on x [B, N, C] (N tokens of C channels), with logdet per example [B]:
  `ViTConditioner` (a bidirectional transformer encoder used as a coupling conditioner),
  `ChannelCoupling` (half the channels condition the other half), `TokenSplitCoupling` (half the
  tokens of a square grid, chosen by a checkerboard / stripe pattern, condition the other half)
  and `Jet`, a stack of both kinds.

Every layer is an `nnx.Module` with `forward(x, *, rng=None) -> (y, logdet)` and
`inverse(y) -> x`. x is `[..., features]` with any leading batch axes, y has x's shape, and
`logdet = log |det dy/dx|` per event, shape `x.shape[:-1]` (the token flows differ: see their
section). `rng` drives dropout in training and is ignored by layers without it; with `rng=None`
every layer is deterministic. The trainable layers start as the identity map (their last
projection is zero-initialised), so a deep stack trains from a well-conditioned start.
Non-trainable state (permutations) lives in `Buffer` variables, which `Functional` keeps out of
the parameters the optimiser sees.

JetFormer's flow and the mutual-information estimators share these layers. Only `Jet` is named
for a use (the Jet flow stack); the layers it is built from, like the rest, are generic.
"""
from __future__ import annotations

import math
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.zoo.attention import Attention
from jaxlab.zoo.mlp import ACTIVATIONS
from jaxlab.zoo.mlp import flat_dot_general
from jaxlab.zoo.sequence import Block


class Buffer(nnx.Variable):
  """A module array that is not trained: excluded by `nnx.Param` filters, so by the optimiser."""


# ---------------------------------------------------------------------------------------------
# Rational-quadratic spline.


def _knots(raw_sizes: jax.Array, *, bound: float, min_bin_size: float) -> jax.Array:
  """Bin edges [..., K+1] running from exactly -bound to exactly +bound.

  Bin sizes are a softmax floored at `min_bin_size` (as a fraction of the interval) so no bin
  collapses; the end knots are pinned rather than summed so the spline meets the identity tails
  without rounding error.
  """
  num_bins = raw_sizes.shape[-1]
  sizes = min_bin_size + (1 - min_bin_size * num_bins) * jax.nn.softmax(raw_sizes, axis=-1)
  # The running sum as a product with a triangular matrix of ones: XLA:CPU lowers cumsum to a
  # reduce-window that is ~10x slower than this matmul at K = 32 (and its gradient likewise).
  # HIGHEST keeps the sum in float32 on accelerators whose default matmul rounds to bfloat16.
  prefix = np.triu(np.ones((num_bins - 1, num_bins - 1), np.float32))
  interior = jnp.matmul(sizes[..., :-1], jnp.asarray(prefix, sizes.dtype),
                        precision=jax.lax.Precision.HIGHEST)
  fractions = jnp.concatenate(
      [jnp.zeros_like(interior[..., :1]), interior, jnp.ones_like(interior[..., :1])], axis=-1)
  return bound * (2 * fractions - 1)


def _knot_derivatives(raw_derivatives: jax.Array, *, min_derivative: float) -> jax.Array:
  """Slopes [..., K+1] at the knots; the two boundary slopes are 1 to match the identity tails.

  The shift makes raw = 0 give slope 1, so all-zero raw parameters give the identity map.
  """
  shift = math.log(math.expm1(1 - min_derivative))
  interior = min_derivative + jax.nn.softplus(raw_derivatives + shift)
  ones = jnp.ones_like(interior[..., :1])
  return jnp.concatenate([ones, interior, ones], axis=-1)


def _spline_bins(raw_widths, raw_heights, raw_derivatives, *, shape, bound, min_bin_size,
                 min_derivative):
  """Knots in x and y and knot slopes, broadcast to `shape + (K+1,)`."""
  num_bins = raw_widths.shape[-1]
  if raw_heights.shape[-1] != num_bins or raw_derivatives.shape[-1] != num_bins - 1:
    raise ValueError(
        f"need K widths, K heights and K-1 derivatives; got {raw_widths.shape[-1]}, "
        f"{raw_heights.shape[-1]} and {raw_derivatives.shape[-1]}")
  if min_bin_size * num_bins >= 1:
    raise ValueError(f"min_bin_size {min_bin_size} is too large for {num_bins} bins")
  broadcast = lambda a, k: jnp.broadcast_to(a, tuple(shape) + (k,))
  x_knots = _knots(broadcast(raw_widths, num_bins), bound=bound, min_bin_size=min_bin_size)
  y_knots = _knots(broadcast(raw_heights, num_bins), bound=bound, min_bin_size=min_bin_size)
  slopes = _knot_derivatives(broadcast(raw_derivatives, num_bins - 1),
                             min_derivative=min_derivative)
  return x_knots, y_knots, slopes


def _bin_of(value: jax.Array, knots: jax.Array) -> jax.Array:
  """Index in [0, K-1] of the bin holding `value` (already inside [knots[0], knots[K]])."""
  return jnp.sum(value[..., None] >= knots[..., 1:-1], axis=-1)


def _bin_ends(x_knots, y_knots, slopes, k):
  """(x, y, slope) at the lower and upper knot of bin k.

  Picked with a one-hot mask over the K bins rather than gathered: on CPU a gather (and the
  scatter-add of its gradient) over [..., K+1] tables costs several times the masked sums.
  """
  num_bins = x_knots.shape[-1] - 1
  mask = jax.nn.one_hot(k, num_bins, dtype=x_knots.dtype)
  pick = lambda table: jnp.sum(table * mask, axis=-1)
  lower = tuple(pick(t[..., :-1]) for t in (x_knots, y_knots, slopes))
  upper = tuple(pick(t[..., 1:]) for t in (x_knots, y_knots, slopes))
  return lower, upper


def rational_quadratic_spline(x: jax.Array, raw_widths: jax.Array, raw_heights: jax.Array,
                              raw_derivatives: jax.Array, *, bound: float,
                              min_bin_size: float = 1e-3, min_derivative: float = 1e-3
                              ) -> tuple[jax.Array, jax.Array]:
  """Monotone rational-quadratic spline, elementwise: (y, log |dy/dx|), both of x's shape.

  K bins on [-bound, bound]; the identity outside it (slope 1 at both ends, so the map is C^1).
  raw_widths, raw_heights: [..., K]; raw_derivatives: [..., K-1] (interior knots). The parameters'
  leading axes broadcast against x's. All-zero parameters give the identity.
  """
  x_knots, y_knots, slopes = _spline_bins(
      raw_widths, raw_heights, raw_derivatives, shape=x.shape, bound=bound,
      min_bin_size=min_bin_size, min_derivative=min_derivative)
  inside = (x >= -bound) & (x <= bound)
  # Out-of-range inputs take the identity branch below; clamping them here keeps the spline
  # branch finite, so its (discarded) gradient cannot be NaN and poison the `where`.
  x_in = jnp.clip(x, -bound, bound)
  (x_lo, y_lo, d_lo), (x_hi, y_hi, d_hi) = _bin_ends(x_knots, y_knots, slopes,
                                                     _bin_of(x_in, x_knots))
  width, height = x_hi - x_lo, y_hi - y_lo
  slope = height / width
  xi = jnp.clip((x_in - x_lo) / width, 0, 1)
  xi_1m_xi = xi * (1 - xi)   # the xi (1 - xi) term of Durkan et al., eq. 4
  denominator = slope + (d_hi + d_lo - 2 * slope) * xi_1m_xi
  y = y_lo + height * (slope * xi**2 + d_lo * xi_1m_xi) / denominator
  dy_numerator = d_hi * xi**2 + 2 * slope * xi_1m_xi + d_lo * (1 - xi)**2
  logabsdet = 2 * jnp.log(slope) + jnp.log(dy_numerator) - 2 * jnp.log(denominator)
  return jnp.where(inside, y, x), jnp.where(inside, logabsdet, 0)


def rational_quadratic_spline_inverse(y: jax.Array, raw_widths: jax.Array,
                                      raw_heights: jax.Array, raw_derivatives: jax.Array, *,
                                      bound: float, min_bin_size: float = 1e-3,
                                      min_derivative: float = 1e-3) -> jax.Array:
  """The inverse of `rational_quadratic_spline` with the same parameters: x of y's shape."""
  x_knots, y_knots, slopes = _spline_bins(
      raw_widths, raw_heights, raw_derivatives, shape=y.shape, bound=bound,
      min_bin_size=min_bin_size, min_derivative=min_derivative)
  inside = (y >= -bound) & (y <= bound)
  y_in = jnp.clip(y, -bound, bound)
  (x_lo, y_lo, d_lo), (x_hi, y_hi, d_hi) = _bin_ends(x_knots, y_knots, slopes,
                                                     _bin_of(y_in, y_knots))
  width, height = x_hi - x_lo, y_hi - y_lo
  slope = height / width
  # Solve the forward map for xi in the bin: a xi^2 + b xi + c = 0 with c <= 0. The root in
  # [0, 1] is 2c / (-b - sqrt(D)) = (-b + sqrt(D)) / (2a). Each form is cancellation-free for one
  # sign of b (the first also survives a -> 0, a near-linear bin); use that one. a + b =
  # height * slope > 0, so b < 0 implies a > 0 and the second form's division is safe.
  dy = y_in - y_lo
  curvature = d_hi + d_lo - 2 * slope
  a = height * (slope - d_lo) + dy * curvature
  b = height * d_lo - dy * curvature
  c = -slope * dy
  # A nearly flat bin (tiny dy/dx) has a discriminant near 0 that rounding can push below it;
  # flooring at the smallest normal number keeps sqrt's gradient finite there.
  discriminant = b**2 - 4 * a * c
  root_discriminant = jnp.sqrt(jnp.maximum(discriminant, jnp.finfo(discriminant.dtype).tiny))
  b_positive = b >= 0
  # The branch jnp.where discards still gets a nonzero denominator, so neither value nor
  # gradient of it is inf/NaN.
  xi_b_positive = 2 * c / jnp.where(b_positive, -b - root_discriminant, -1)
  xi_b_negative = (-b + root_discriminant) / jnp.where(b_positive, 1, 2 * a)
  xi = jnp.clip(jnp.where(b_positive, xi_b_positive, xi_b_negative), 0, 1)
  return jnp.where(inside, x_lo + xi * width, y)


# ---------------------------------------------------------------------------------------------
# Masked autoregressive spline.


class MaskedLinear(nnx.Module):
  """A Linear layer whose kernel is masked by MADE degrees.

  Unit j of the output sees input unit i iff out_degree[j] >= in_degree[i] (or > with `strict`,
  used for the output layer so a dimension never sees itself). Degrees are static tuples; the
  mask is rebuilt from them at trace time and so is a compile-time constant.
  """

  def __init__(self, in_degrees: Sequence[int], out_degrees: Sequence[int], *, strict: bool,
               zero_init: bool = False, param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.in_degrees, self.out_degrees, self.strict = tuple(in_degrees), tuple(out_degrees), strict
    shape = (len(self.in_degrees), len(self.out_degrees))
    kernel_init = (nnx.initializers.zeros_init() if zero_init
                   else nnx.initializers.lecun_normal())
    self.kernel = nnx.Param(kernel_init(rngs.params(), shape, param_dtype))
    self.bias = nnx.Param(jnp.zeros(shape[1:], param_dtype))

  def mask(self) -> np.ndarray:
    inputs, outputs = np.asarray(self.in_degrees)[:, None], np.asarray(self.out_degrees)[None, :]
    return outputs > inputs if self.strict else outputs >= inputs

  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.kernel[...] * self.mask()
    bias = self.bias[...].reshape((1,) * (x.ndim - 1) + (-1,))
    return x @ kernel + bias


def _dropout(h: jax.Array, rate: float, rng: jax.Array) -> jax.Array:
  keep = jax.random.bernoulli(rng, 1 - rate, h.shape)
  return jnp.where(keep, h / (1 - rate), 0)


class MaskedAutoregressiveSpline(nnx.Module):
  """y_i = spline_i(x_i) with spline parameters from a MADE of x_{<i} (Durkan et al. 2019).

  The MADE maps features -> hidden (x depth) -> features * (3 * num_bins - 1); dimension 0's
  spline depends only on biases. Hidden units get degrees cycling through 0..features-2, so with
  hidden < features - 1 the later dimensions see only a prefix of the earlier ones (still
  autoregressive, less expressive). The output layer is zero-initialised: identity at init.
  Dropout (rate `dropout`) acts on hidden activations when `forward` is given an rng.
  """

  def __init__(self, features: int, *, hidden: int = 8, depth: int = 2, num_bins: int = 8,
               bound: float = 8.0, dropout: float = 0.0, activation: str = "relu",
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if activation not in ACTIVATIONS:
      raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    if not 0 <= dropout < 1:
      raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if num_bins < 1:
      raise ValueError(f"num_bins must be positive, got {num_bins}")
    self.features, self.num_bins, self.bound = features, num_bins, bound
    self.dropout, self.activation = dropout, activation
    per_dim = 3 * num_bins - 1
    degrees = [tuple(range(features))]
    degrees += [tuple(j % max(features - 1, 1) for j in range(hidden))] * depth
    out_degrees = tuple(i for i in range(features) for _ in range(per_dim))
    layers = [MaskedLinear(d_in, d_out, strict=False, param_dtype=param_dtype, rngs=rngs)
              for d_in, d_out in zip(degrees[:-1], degrees[1:])]
    layers.append(MaskedLinear(degrees[-1], out_degrees, strict=True, zero_init=True,
                               param_dtype=param_dtype, rngs=rngs))
    self.layers = nnx.List(layers)

  def spline_parameters(self, x: jax.Array, rng: jax.Array | None = None
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Raw (widths, heights, derivatives), [..., features, K / K / K-1]; row i sees only x_{<i}."""
    act = ACTIVATIONS[self.activation]
    use_dropout = rng is not None and self.dropout > 0
    num_hidden = len(self.layers) - 1
    keys = jax.random.split(rng, num_hidden) if use_dropout else None
    h = x
    for i in range(num_hidden):
      h = act(self.layers[i](h))
      if use_dropout:
        h = _dropout(h, self.dropout, keys[i])
    k = self.num_bins
    out = self.layers[num_hidden](h).reshape(x.shape[:-1] + (self.features, 3 * k - 1))
    return out[..., :k], out[..., k:2 * k], out[..., 2 * k:]

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    y, logabsdet = rational_quadratic_spline(x, *self.spline_parameters(x, rng),
                                             bound=self.bound)
    return y, jnp.sum(logabsdet, axis=-1)

  def inverse(self, y: jax.Array) -> jax.Array:
    """Sequential: `features` MADE passes (the forward map needs one).

    Each pass inverts every dimension from the current guess; after pass i, dimension i is exact,
    because its spline parameters depend only on dimensions < i, already exact.
    """
    def invert_once(_, x):
      return rational_quadratic_spline_inverse(y, *self.spline_parameters(x), bound=self.bound)
    return jax.lax.fori_loop(0, self.features, invert_once, y)


# ---------------------------------------------------------------------------------------------
# Affine coupling, permutation, composition.


class AffineCoupling(nnx.Module):
  """y_T = (x_T + bias(x_C)) * scale(x_C), y_C = x_C, for transformed dims T and the rest C.

  `conditioner` (any module, [..., |C|] -> [..., conditioner_features]) is followed by a
  zero-initialised Linear giving (raw_scale, bias); scale = 2 sigmoid(raw_scale) lies in (0, 2),
  which bounds how fast one layer can expand, and is 1 at init: the layer starts as the identity
  whatever the conditioner. `transformed` (booleans, one per feature) defaults to the second half.
  """

  def __init__(self, features: int, conditioner: nnx.Module, conditioner_features: int, *,
               transformed: Sequence[bool] | None = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if transformed is None:
      transformed = [i >= features // 2 for i in range(features)]
    transformed = [bool(t) for t in transformed]
    if len(transformed) != features:
      raise ValueError(f"transformed has {len(transformed)} entries for {features} features")
    self.transformed_dims = tuple(i for i, t in enumerate(transformed) if t)
    self.conditioning_dims = tuple(i for i, t in enumerate(transformed) if not t)
    if not self.transformed_dims or not self.conditioning_dims:
      raise ValueError("a coupling needs at least one transformed and one conditioning dim")
    self.conditioner = conditioner
    self.head = nnx.Linear(conditioner_features, 2 * len(self.transformed_dims),
                           kernel_init=nnx.initializers.zeros_init(),
                           bias_init=nnx.initializers.zeros_init(), param_dtype=param_dtype,
                           dot_general=flat_dot_general, rngs=rngs)

  def _scale_and_bias(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log scale, scale, bias) for the transformed dims, from the conditioning dims of x."""
    conditioning = x[..., np.asarray(self.conditioning_dims)]
    raw_scale, bias = jnp.split(self.head(self.conditioner(conditioning)), 2, axis=-1)
    log_scale = math.log(2) + jax.nn.log_sigmoid(raw_scale)
    return log_scale, jnp.exp(log_scale), bias

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    del rng  # No dropout of its own; a conditioner wanting it would need an rng-taking call.
    log_scale, scale, bias = self._scale_and_bias(x)
    dims = np.asarray(self.transformed_dims)
    y_t = (x[..., dims] + bias) * scale
    return x.at[..., dims].set(y_t), jnp.sum(log_scale, axis=-1)

  def inverse(self, y: jax.Array) -> jax.Array:
    _, scale, bias = self._scale_and_bias(y)  # y_C == x_C, so the conditioner sees the same input.
    dims = np.asarray(self.transformed_dims)
    x_t = y[..., dims] / scale - bias
    return y.at[..., dims].set(x_t)


class Permutation(nnx.Module):
  """y = x[..., permutation]: a fixed reordering of the features, log-det 0.

  Placed between autoregressive or coupling layers so each conditions on different dimensions.
  A random order from `seed` unless `permutation` is given; held in `Buffer`s, never trained.
  """

  def __init__(self, features: int, *, seed: int = 0,
               permutation: Sequence[int] | None = None):
    if permutation is None:
      permutation = np.random.default_rng(seed).permutation(features)
    permutation = np.asarray(permutation, np.int32)
    if sorted(permutation.tolist()) != list(range(features)):
      raise ValueError(f"{permutation.tolist()} is not a permutation of range({features})")
    self.permutation = Buffer(jnp.asarray(permutation))
    self.inverse_permutation = Buffer(jnp.asarray(np.argsort(permutation)))

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    del rng
    return jnp.take(x, self.permutation[...], axis=-1), jnp.zeros(x.shape[:-1], x.dtype)

  def inverse(self, y: jax.Array) -> jax.Array:
    return jnp.take(y, self.inverse_permutation[...], axis=-1)


class Chain(nnx.Module):
  """Layers applied in order; log-dets add. Each layer gets its own key split from `rng`."""

  def __init__(self, layers: Sequence[nnx.Module]):
    self.layers = nnx.List(layers)

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    keys = (jax.random.split(rng, len(self.layers)) if rng is not None
            else [None] * len(self.layers))
    logdet = jnp.zeros(x.shape[:-1], x.dtype)
    for layer, key in zip(self.layers, keys):
      x, layer_logdet = layer.forward(x, rng=key)
      logdet = logdet + layer_logdet
    return x, logdet

  def inverse(self, y: jax.Array) -> jax.Array:
    for layer in reversed(self.layers):
      y = layer.inverse(y)
    return y


# ---------------------------------------------------------------------------------------------
# Token flows: x is [B, N, C], N tokens of C channels, and each example's [N, C] is one event.
#
# The conditioners below mix tokens, so a coupling's Jacobian is not block-diagonal over tokens
# and only the sum of per-token log-scales is a log-determinant. Every layer in this section
# therefore returns logdet per example, shape [B] (summed over tokens and channels), not the
# per-event `x.shape[:-1]` of the layers above. `AffineCoupling` given a token-mixing conditioner
# still returns [B, N]: per-token terms that mean something only summed over N.


class ViTConditioner(nnx.Module):
  """A bidirectional ViT encoder over a fixed number of tokens: [B, N, in] -> [B, N, out].

  Linear(in -> width) + learned position embedding [N, width], then `depth` pre-LayerNorm
  blocks x + Attention(LN(x)), x + MLP(LN(x)) with non-causal softmax attention, then a final
  LayerNorm and Linear(width -> out_features). `out_features=None` drops that last Linear and
  returns the normalised [B, N, width] features, for a caller (e.g. `AffineCoupling`) that adds
  its own read-out. `zero_init_output` zero-initialises the read-out, so a coupling built on it
  starts as the identity. Blocks are initialised like GPT-2 (N(0, 0.02), residual projections
  / sqrt(2 depth)). Jet's couplings use it as their conditioner.
  """

  def __init__(self, in_features: int, out_features: int | None, num_tokens: int, *,
               width: int, depth: int, num_heads: int, mlp_ratio: int = 4,
               zero_init_output: bool = False, init_std: float = 0.02,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.in_features, self.num_tokens = in_features, num_tokens
    out_std = init_std / math.sqrt(2 * max(depth, 1))
    attention = lambda rngs: Attention(width, num_heads, kind="softmax", causal=False,
                                       init_std=init_std, out_init_std=out_std,
                                       param_dtype=param_dtype, rngs=rngs)
    self.read_in = nnx.Linear(in_features, width, param_dtype=param_dtype,
                              dot_general=flat_dot_general, rngs=rngs)
    self.positions = nnx.Param(
        nnx.initializers.normal(init_std)(rngs.params(), (num_tokens, width), param_dtype))
    self.blocks = nnx.List([
        Block(width, attention, use_mlp=True, mlp_ratio=mlp_ratio, init_std=init_std,
              out_init_std=out_std, param_dtype=param_dtype, rngs=rngs)
        for _ in range(depth)])
    self.final_norm = nnx.LayerNorm(width, epsilon=1e-5, param_dtype=param_dtype, rngs=rngs)
    if out_features is None:
      self.read_out = None
    else:
      zeros = nnx.initializers.zeros_init()
      kernel_init = zeros if zero_init_output else nnx.initializers.lecun_normal()
      self.read_out = nnx.Linear(width, out_features, kernel_init=kernel_init, bias_init=zeros,
                                 param_dtype=param_dtype, dot_general=flat_dot_general,
                                 rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [B, N, in] -> [B, N, out] ([B, N, width] without a read-out)."""
    if x.ndim != 3 or x.shape[1:] != (self.num_tokens, self.in_features):
      raise ValueError(f"expected [B, {self.num_tokens}, {self.in_features}], got {x.shape}")
    h = self.read_in(x) + self.positions[...][None]
    for block in self.blocks:
      h = block(h)
    h = self.final_norm(h)
    return h if self.read_out is None else self.read_out(h)


def _check_tokens(x: jax.Array, num_tokens: int, channels: int) -> None:
  if x.ndim != 3 or x.shape[1:] != (num_tokens, channels):
    raise ValueError(f"expected tokens [B, {num_tokens}, {channels}], got {x.shape}")


class ChannelCoupling(nnx.Module):
  """A coupling across channels for token inputs [B, N, C]; logdet per example, [B].

  A fixed random channel permutation (from `seed`, in a `Buffer`), an `AffineCoupling` whose
  first C/2 permuted channels condition the other C/2 through a `ViTConditioner` (so every token
  sees every other token's conditioning half), then the inverse permutation, so the layer works
  in place: it rescales and shifts a random half of the channels. This is Jet's channel-wise
  coupling. Identity at init (AffineCoupling's zero-initialised head).
  """

  def __init__(self, num_tokens: int, channels: int, *, width: int, depth: int,
               num_heads: int, seed: int = 0, mlp_ratio: int = 4, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if channels < 2:
      raise ValueError(f"a channel coupling needs at least 2 channels, got {channels}")
    self.num_tokens, self.channels = num_tokens, channels
    self.permutation = Permutation(channels, seed=seed)
    conditioning = channels // 2   # AffineCoupling's default split: the first floor(C/2) dims
    conditioner = ViTConditioner(conditioning, None, num_tokens, width=width, depth=depth,
                                 num_heads=num_heads, mlp_ratio=mlp_ratio,
                                 param_dtype=param_dtype, rngs=rngs)
    self.coupling = AffineCoupling(channels, conditioner, width, param_dtype=param_dtype,
                                   rngs=rngs)

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    """x: [B, N, C] -> (y [B, N, C], logdet [B])."""
    del rng
    _check_tokens(x, self.num_tokens, self.channels)
    permuted, _ = self.permutation.forward(x)
    y, logdet = self.coupling.forward(permuted)   # logdet: [B, N] per-token terms
    return self.permutation.inverse(y), jnp.sum(logdet, axis=-1)

  def inverse(self, y: jax.Array) -> jax.Array:
    _check_tokens(y, self.num_tokens, self.channels)
    permuted, _ = self.permutation.forward(y)
    return self.permutation.inverse(self.coupling.inverse(permuted))


SPATIAL_PATTERNS = ("checkerboard", "checkerboard-inv", "vstripes", "vstripes-inv", "hstripes",
                    "hstripes-inv")


def token_split_order(num_tokens: int, pattern: str) -> np.ndarray:
  """A token order [N] over a raster (row-major) sqrt(N) x sqrt(N) grid: first half, then second.

  "checkerboard": squares with even row + column first; "vstripes": even columns first;
  "hstripes": even rows first; "-inv" puts the other half first. Each half keeps raster order.
  The grid side must be even, so that the halves have N/2 tokens each.
  """
  side = math.isqrt(num_tokens)
  if side * side != num_tokens or side % 2:
    raise ValueError(f"{num_tokens} tokens are not a square grid with an even side")
  base, inverted = pattern.removesuffix("-inv"), pattern.endswith("-inv")
  rows, cols = np.divmod(np.arange(num_tokens), side)
  first = {"checkerboard": (rows + cols) % 2 == 0, "vstripes": cols % 2 == 0,
           "hstripes": rows % 2 == 0}.get(base)
  if first is None or pattern not in SPATIAL_PATTERNS:
    raise ValueError(f"unknown pattern {pattern!r}; choose one of {SPATIAL_PATTERNS}")
  if inverted:
    first = ~first
  return np.concatenate([np.flatnonzero(first), np.flatnonzero(~first)]).astype(np.int32)


class TokenSplitCoupling(nnx.Module):
  """A coupling across tokens on a square grid: half the tokens condition the other half.

  x: [B, N, C], N = s^2 tokens in raster order on an s x s grid (s even), C even. The tokens are
  reordered by `token_split_order(N, pattern)` (a `Buffer`); the first N/2 (x1) condition the
  last N/2 (x2), then the original order is restored, so the layer works in place and
  alternating patterns (e.g. "checkerboard" then "checkerboard-inv") transform both halves.

  To keep the conditioner's signature the same as a channel coupling's ([B, N, C/2] in), each
  half is reshaped [B, N/2, C] -> [B, N, C/2]: token k's channels split into pseudo-tokens 2k
  (first C/2 channels) and 2k+1 (last C/2). The `ViTConditioner` maps x1 in that layout to
  [B, N, C] = (raw_scale, bias), each [B, N, C/2], which are reshaped back to x2's [B, N/2, C].
  Then scale = 2 sigmoid(raw_scale), y2 = (x2 + bias) * scale, y1 = x1, and logdet [B] is the sum
  of log scale over x2's tokens and channels. The conditioner's read-out is zero-initialised:
  identity at init. Jet's spatial coupling.
  """

  def __init__(self, num_tokens: int, channels: int, *, pattern: str, width: int, depth: int,
               num_heads: int, mlp_ratio: int = 4, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if channels % 2:
      raise ValueError(f"a token-split coupling needs an even channel count, got {channels}")
    order = token_split_order(num_tokens, pattern)
    self.num_tokens, self.channels, self.pattern = num_tokens, channels, pattern
    self.order = Buffer(jnp.asarray(order))
    self.inverse_order = Buffer(jnp.asarray(np.argsort(order).astype(np.int32)))
    self.conditioner = ViTConditioner(channels // 2, channels, num_tokens, width=width,
                                      depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
                                      zero_init_output=True, param_dtype=param_dtype, rngs=rngs)

  def _split(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, N, C] in grid order -> (x1, x2), each [B, N/2, C], in pattern order."""
    _check_tokens(x, self.num_tokens, self.channels)
    reordered = jnp.take(x, self.order[...], axis=1)
    return jnp.split(reordered, 2, axis=1)

  def _merge(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
    return jnp.take(jnp.concatenate([x1, x2], axis=1), self.inverse_order[...], axis=1)

  def _log_scale_and_bias(self, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Both [B, N/2, C], in x2's layout, from x1 [B, N/2, C]."""
    batch, half, channels = x1.shape
    # "(N/2, C) -> (N, C/2)": a row-major reshape, so pseudo-token 2k + j holds token k's
    # channels j C/2 .. (j+1) C/2 - 1, and the reverse reshape below undoes it exactly.
    out = self.conditioner(x1.reshape(batch, 2 * half, channels // 2))   # [B, N, C]
    raw_scale, bias = (part.reshape(batch, half, channels) for part in jnp.split(out, 2, -1))
    return math.log(2) + jax.nn.log_sigmoid(raw_scale), bias

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    """x: [B, N, C] -> (y [B, N, C], logdet [B])."""
    del rng
    x1, x2 = self._split(x)
    log_scale, bias = self._log_scale_and_bias(x1)
    y2 = (x2 + bias) * jnp.exp(log_scale)
    return self._merge(x1, y2), jnp.sum(log_scale, axis=(1, 2))

  def inverse(self, y: jax.Array) -> jax.Array:
    y1, y2 = self._split(y)
    log_scale, bias = self._log_scale_and_bias(y1)   # y1 == x1: the same conditioner input
    return self._merge(y1, y2 * jnp.exp(-log_scale) - bias)


class Jet(nnx.Module):
  """A stack of token couplings: [B, N, C] -> (z [B, N, C], logdet [B]) and back.

  Layer i is a `ChannelCoupling` or a `TokenSplitCoupling` as `kinds[i % len(kinds)]` is
  "channels" or "spatial" (e.g. four "channels" then one "spatial"). The j-th spatial layer takes
  pattern `SPATIAL_PATTERNS[j % 6]`; channel layer i gets the random channel permutation seeded by
  (seed, i), so each channel layer splits the channels differently. Every layer has its own
  `ViTConditioner` (width, conditioner_depth blocks, num_heads). Permutations are `Buffer`s: they
  depend on `seed`, never on the init key, and are not trained. Identity at init.

  logdet is per example, [B]: the sum over every layer, token and channel (the layers above
  give it per event, `x.shape[:-1]`; here an event is a whole [N, C] example).
  """

  def __init__(self, num_tokens: int, channels: int, *, depth: int,
               kinds: Sequence[str] = ("channels",), width: int, conditioner_depth: int,
               num_heads: int, mlp_ratio: int = 4, seed: int = 0, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    kinds = tuple(kinds)
    if not kinds or any(kind not in ("channels", "spatial") for kind in kinds):
      raise ValueError(f"kinds must be a non-empty sequence of 'channels'/'spatial', got {kinds}")
    self.num_tokens, self.channels, self.kinds = num_tokens, channels, kinds
    shared = dict(width=width, depth=conditioner_depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
                  param_dtype=param_dtype, rngs=rngs)
    layers, num_spatial = [], 0
    for i in range(depth):
      if kinds[i % len(kinds)] == "channels":
        # An int seed hashed from the (seed, layer) pair: layers and seeds get independent orders.
        layer_seed = int(np.random.SeedSequence((seed, i)).generate_state(1)[0])
        layers.append(ChannelCoupling(num_tokens, channels, seed=layer_seed, **shared))
      else:
        pattern = SPATIAL_PATTERNS[num_spatial % len(SPATIAL_PATTERNS)]
        layers.append(TokenSplitCoupling(num_tokens, channels, pattern=pattern, **shared))
        num_spatial += 1
    self.layers = nnx.List(layers)

  def forward(self, x: jax.Array, *, rng: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    """x: [B, N, C] -> (z [B, N, C], logdet [B]). `rng` is unused (no dropout)."""
    del rng
    _check_tokens(x, self.num_tokens, self.channels)
    logdet = jnp.zeros(x.shape[:1], x.dtype)
    for layer in self.layers:
      x, layer_logdet = layer.forward(x)
      logdet = logdet + layer_logdet
    return x, logdet

  def inverse(self, z: jax.Array) -> jax.Array:
    """z: [B, N, C] -> x [B, N, C]."""
    _check_tokens(z, self.num_tokens, self.channels)
    for layer in reversed(self.layers):
      z = layer.inverse(z)
    return z
