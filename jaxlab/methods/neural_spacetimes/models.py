"""Spacetime embeddings of graph nodes: one encoder, three geometries.

A node's features (its 2-d drawing coordinates) go through the encoder MLP (J = 10 blocks of
Linear -> LayerNorm -> SiLU, width 100, then Linear to D + T) and are split into space [D] and
time [T] coordinates. Then:

* `nst` (Neural SpaceTime): distance = NeuralQuasiMetric(space_u, space_v); causality from the
  product order of NeuralPartialOrder(time). D = T = dim.
* `minkowski`: distance = ||ds||^2 - ||dt||^2; causality from the raw time coordinate. D = dim,
  T = 1 (the paper's baseline).
* `de_sitter`: the de Sitter pseudo-distance (radius 1) of the lifted points; D = dim + 1, T = 1.
"""
from __future__ import annotations

import dataclasses

from flax import nnx
import jax

from jaxlab.zoo import functional
from jaxlab.zoo import geometry
from jaxlab.zoo import mlp

MODELS = ("nst", "minkowski", "de_sitter")


@dataclasses.dataclass(frozen=True)
class SpacetimeSpec:
  kind: str                    # one of MODELS
  dim: int                     # the paper's "dimension": D = T = dim for nst
  input_dim: int = 2
  encoder_depth: int = 10
  encoder_width: int = 100
  metric_depth: int = 4        # J of the quasi-metric
  order_depth: int = 4         # J of the partial order
  head_width: int = 10

  def __post_init__(self):
    if self.kind not in MODELS:
      raise ValueError(f"unknown model {self.kind!r}; choose one of {MODELS}")
    if self.dim < 1:
      raise ValueError(f"dim must be >= 1, got {self.dim}")

  @property
  def space_dim(self) -> int:
    return self.dim + 1 if self.kind == "de_sitter" else self.dim

  @property
  def time_dim(self) -> int:
    return self.dim if self.kind == "nst" else 1


class Spacetime(nnx.Module):
  """embed(features [..., F]) -> (space [..., D], time [..., T]); distance and order_time act
  on embedded nodes."""

  def __init__(self, spec: SpacetimeSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    features = ([spec.input_dim] + [spec.encoder_width] * spec.encoder_depth
                + [spec.space_dim + spec.time_dim])
    self.encoder = mlp.MLP(features, activation="silu", torch_init=True, layer_norm=True,
                           rngs=rngs)
    if spec.kind == "nst":
      self.metric = geometry.NeuralQuasiMetric(spec.space_dim, depth=spec.metric_depth,
                                               hidden=spec.head_width, rngs=rngs)
      self.order = geometry.NeuralPartialOrder(spec.time_dim, depth=spec.order_depth,
                                               hidden=spec.head_width, rngs=rngs)

  def embed(self, features: jax.Array) -> tuple[jax.Array, jax.Array]:
    z = self.encoder(features)
    return z[..., :self.spec.space_dim], z[..., self.spec.space_dim:]

  def distance(self, space_u: jax.Array, time_u: jax.Array, space_v: jax.Array,
               time_v: jax.Array) -> jax.Array:
    if self.spec.kind == "nst":
      return self.metric(space_u, space_v)
    if self.spec.kind == "minkowski":
      return geometry.minkowski_interval(space_u, time_u, space_v, time_v)
    return geometry.de_sitter_distance(space_u, time_u, space_v, time_v)

  def order_time(self, time: jax.Array) -> jax.Array:
    """The coordinates whose product order encodes causality."""
    return self.order(time) if self.spec.kind == "nst" else time


def spacetime(spec: SpacetimeSpec) -> functional.Functional:
  return functional.Functional(lambda rngs: Spacetime(spec, rngs=rngs))
