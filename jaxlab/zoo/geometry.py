"""Learnable and closed-form geometries: quasi-metrics, partial orders, spacetime intervals.

* `NeuralQuasiMetric(x, y)`: a non-negative, symmetric function that is 0 on the diagonal, built
  from positive weight matrices and "fractal" power activations with learnable exponents (below 1
  near 0, above 1 far away), so it can bend distances like a snowflake metric.
* `NeuralPartialOrder(t)`: a coordinatewise non-decreasing map (positive weights, LeakyReLU and
  odd power activations): if u <= v in every coordinate then T(u) <= T(v) in every coordinate.
  `precedes(a, b)` is the product order it induces.
* `minkowski_interval`, `de_sitter_distance`: closed-form pseudo-distances of flat and de Sitter
  spacetimes, for comparison on the same encoder.

Power activations: |x|^p has an infinite (p < 1) or NaN (d/dp at x = 0) gradient at 0. `safe_abs_power`
returns 0 with zero gradient at exactly 0, and the usual value and gradient elsewhere.
"""
from __future__ import annotations

from typing import Callable

from flax import nnx
import jax
import jax.numpy as jnp

Initializer = Callable[[jax.Array, tuple[int, ...], jnp.dtype], jax.Array]


def safe_abs_power(x: jax.Array, exponent: jax.Array) -> jax.Array:
  """|x|^exponent, exponent > 0, with finite gradients (0 at x = 0 for x and the exponent)."""
  magnitude = jnp.abs(x)
  nonzero = magnitude > 0
  # The inner `where` keeps log(0) out of the backward pass of the branch that is not taken.
  safe = jnp.where(nonzero, magnitude, 1.0)
  return jnp.where(nonzero, jnp.exp(exponent * jnp.log(safe)), 0.0)


def signed_power(x: jax.Array, exponent: jax.Array) -> jax.Array:
  """sign(x) |x|^exponent: odd and, for exponent > 0, strictly increasing."""
  return jnp.sign(x) * safe_abs_power(x, exponent)


class FractalActivation(nnx.Module):
  """sigma(x) = sign(x) |x|^s for |x| < 1 and sign(x) |x|^l otherwise, s = |s~| + 1, l = |l~| + 1.

  Both exponents start near 1 (the identity); learning them lets the network snowflake (s, l
  move apart) a distance. Odd and increasing, so it preserves |a - b| ordering of magnitudes.
  """

  def __init__(self, *, small_init: float = 1e-6, large_init: float = 1e-3):
    self.small = nnx.Param(jnp.asarray(small_init, jnp.float32))
    self.large = nnx.Param(jnp.asarray(large_init, jnp.float32))

  def exponents(self) -> tuple[jax.Array, jax.Array]:
    return jnp.abs(self.small[...]) + 1.0, jnp.abs(self.large[...]) + 1.0

  def __call__(self, x: jax.Array) -> jax.Array:
    small, large = self.exponents()
    exponent = jnp.where(jnp.abs(x) < 1, small, large)
    return signed_power(x, exponent.astype(x.dtype))


class PowerActivation(nnx.Module):
  """sigma(x) = sign(x) |x|^|s~|: odd, increasing, learnable exponent (0.5 at init)."""

  def __init__(self, *, exponent_init: float = 0.5):
    self.exponent = nnx.Param(jnp.asarray(exponent_init, jnp.float32))

  def __call__(self, x: jax.Array) -> jax.Array:
    return signed_power(x, jnp.abs(self.exponent[...]).astype(x.dtype))


def _uniform(low: float, high: float) -> Initializer:
  return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, low, high)


class PositiveLinear(nnx.Module):
  """x @ (|W~| + |lambda| I) (+ b): every weight >= 0, so the map is non-decreasing in x.

  I is the rectangular identity; lambda (0.1 at init) keeps the diagonal away from 0 so the map
  does not collapse coordinates. W~ ~ U(0, weight_scale) (default 1 / (fan_in * fan_out)).
  """

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = False,
               weight_scale: float | None = None, diagonal_init: float = 0.1,
               rngs: nnx.Rngs):
    scale = 1.0 / (in_features * out_features) if weight_scale is None else weight_scale
    self.in_features, self.out_features = in_features, out_features
    self.raw_weight = nnx.Param(_uniform(0.0, scale)(rngs.params(), (in_features, out_features),
                                                     jnp.float32))
    self.diagonal = nnx.Param(jnp.asarray(diagonal_init, jnp.float32))
    self.bias = (nnx.Param(_uniform(0.0, 1.0)(rngs.params(), (out_features,), jnp.float32))
                 if use_bias else None)

  def kernel(self) -> jax.Array:
    identity = jnp.eye(self.in_features, self.out_features, dtype=self.raw_weight.dtype)
    return jnp.abs(self.raw_weight[...]) + jnp.abs(self.diagonal[...]) * identity

  def __call__(self, x: jax.Array) -> jax.Array:
    y = x @ self.kernel().astype(x.dtype)
    if self.bias is not None:
      y = y + self.bias[...].astype(x.dtype).reshape((1,) * (y.ndim - 1) + (-1,))
    return y


class NeuralQuasiMetric(nnx.Module):
  """d(x, y) >= 0 for x, y [..., features] -> [...]; d(x, y) = d(y, x), d(x, x) = 0.

  u_0 = |sigma_0(x) - sigma_0(y)|, u_j = sigma_j(u_{j-1}) W_j for j = 1..depth, with positive
  W_j (features -> hidden -> ... -> 1). Symmetry and the zero diagonal hold by construction;
  non-negativity because u_0 >= 0, the activations map [0, inf) to itself and W_j >= 0.
  """

  def __init__(self, features: int, *, depth: int = 4, hidden: int = 10, rngs: nnx.Rngs):
    if depth < 2:
      raise ValueError(f"NeuralQuasiMetric needs depth >= 2, got {depth}")
    widths = [features] + [hidden] * (depth - 1) + [1]
    self.activations = nnx.List([FractalActivation() for _ in range(depth + 1)])
    self.weights = nnx.List([PositiveLinear(a, b, rngs=rngs)
                             for a, b in zip(widths[:-1], widths[1:])])

  def __call__(self, x: jax.Array, y: jax.Array) -> jax.Array:
    first = self.activations[0]
    u = jnp.abs(first(x) - first(y))
    for activation, weight in zip(self.activations[1:], self.weights):
      u = weight(activation(u))
    return u[..., 0]


class NeuralPartialOrder(nnx.Module):
  """T(t) [..., features] -> [..., features], non-decreasing in every coordinate.

  z_j = sigma_j(LeakyReLU(z_{j-1})) V_j + b_j with positive V_j (features -> hidden -> ... ->
  features): each stage is a composition of coordinatewise increasing maps and a non-negative
  linear map, so u <= v coordinatewise implies T(u) <= T(v).
  """

  def __init__(self, features: int, *, depth: int = 4, hidden: int = 10,
               negative_slope: float = 0.01, rngs: nnx.Rngs):
    if depth < 2:
      raise ValueError(f"NeuralPartialOrder needs depth >= 2, got {depth}")
    widths = [features] + [hidden] * (depth - 1) + [features]
    self.negative_slope = negative_slope
    self.activations = nnx.List([PowerActivation() for _ in range(depth)])
    self.weights = nnx.List([PositiveLinear(a, b, use_bias=True, weight_scale=1.0, rngs=rngs)
                             for a, b in zip(widths[:-1], widths[1:])])

  def __call__(self, t: jax.Array) -> jax.Array:
    z = t
    for activation, weight in zip(self.activations, self.weights):
      z = weight(activation(jax.nn.leaky_relu(z, self.negative_slope)))
    return z


def precedes(time_a: jax.Array, time_b: jax.Array) -> jax.Array:
  """The product order: a <= b in every time coordinate. [..., T], [..., T] -> bool [...]."""
  return jnp.all(time_a <= time_b, axis=-1)


def minkowski_interval(space_a: jax.Array, time_a: jax.Array, space_b: jax.Array,
                       time_b: jax.Array) -> jax.Array:
  """||s_a - s_b||^2 - ||t_a - t_b||^2: the squared interval of flat spacetime (may be < 0)."""
  return (jnp.sum(jnp.square(space_a - space_b), axis=-1)
          - jnp.sum(jnp.square(time_a - time_b), axis=-1))


def de_sitter_point(space: jax.Array, time: jax.Array, radius: float = 1.0) -> jax.Array:
  """Lifts (space direction, time) onto the de Sitter hyperboloid ||s||^2 - ||t||^2 = r^2:
  s -> sqrt(r^2 + ||t||^2) s / ||s||."""
  norm = jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(space), axis=-1, keepdims=True), 1e-24))
  return jnp.sqrt(radius**2 + jnp.sum(jnp.square(time), axis=-1, keepdims=True)) * space / norm


def de_sitter_distance(space_a: jax.Array, time_a: jax.Array, space_b: jax.Array,
                       time_b: jax.Array, radius: float = 1.0) -> jax.Array:
  """The de Sitter pseudo-distance between the lifted points.

  With <a, b> = s_a . s_b - t_a . t_b: r^2 acosh(<a, b> / r^2)^2 when <a, b> > r^2 (spacelike
  separation, a squared geodesic length), else 2 (<a, b> - r^2) (<= 0).
  """
  r2 = radius**2
  lifted_a = de_sitter_point(space_a, time_a, radius)
  lifted_b = de_sitter_point(space_b, time_b, radius)
  inner = jnp.sum(lifted_a * lifted_b, axis=-1) - jnp.sum(time_a * time_b, axis=-1)
  spacelike = inner > r2
  # acosh'(1) is infinite: feed the untaken branch a safe argument so its gradient stays finite.
  safe_ratio = jnp.where(spacelike, inner / r2, 2.0)
  return jnp.where(spacelike, r2 * jnp.square(jnp.arccosh(safe_ratio)), 2.0 * (inner - r2))
