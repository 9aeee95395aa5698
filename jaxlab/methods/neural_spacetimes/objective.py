"""The training loss and the evaluation metrics of a spacetime embedding of a weighted DAG.

Convention (the paper's): an edge u -> v is correctly ordered when T(u) <= T(v) in every time
coordinate. (The official code calls its model as (target, source) and so trains the reverse
order; the two are mirror images.)

Loss, over edges only: MSE(distance(u, v), w_uv) + time term, where the time term is
mean over edges and time coordinates of sigmoid(10 (T(u)_t - T(v)_t)), scaled by
(1 - fraction of edges already correctly ordered); the fraction is a constant (stop_gradient),
so the term fades as the order is learnt.

Metrics: the distortion ratio w_uv / distance(u, v) over edges (mean, unbiased std as torch.std,
max; ideal 1) and directionality (the fraction of correctly ordered edges).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.data import dags
from jaxlab.zoo import functional

SIGMOID_SHARPNESS = 10.0


class GraphArrays(NamedTuple):
  """One graph, edges padded to a common length so graphs of one node count can be stacked."""
  features: jax.Array   # [N, F]
  sources: jax.Array    # [E] int32
  targets: jax.Array    # [E] int32
  weights: jax.Array    # [E]
  mask: jax.Array       # [E] bool, False on padding


def graph_arrays(graphs: list[dags.WeightedDag]) -> GraphArrays:
  """Stacks graphs with the same node count into [G, ...] arrays (edges padded and masked)."""
  if len({g.num_nodes for g in graphs}) != 1:
    raise ValueError("graphs stacked together must have the same number of nodes")
  num_edges = max(g.num_edges for g in graphs)

  def pad(array, value=0):
    return np.pad(array, (0, num_edges - len(array)), constant_values=value)

  return GraphArrays(
      features=np.stack([g.features for g in graphs]).astype(np.float32),
      sources=np.stack([pad(g.sources) for g in graphs]).astype(np.int32),
      targets=np.stack([pad(g.targets) for g in graphs]).astype(np.int32),
      weights=np.stack([pad(g.weights, 1.0) for g in graphs]).astype(np.float32),
      mask=np.stack([pad(np.ones(g.num_edges, bool), False) for g in graphs]))


def edge_geometry(model: functional.Functional, params, graph: GraphArrays
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(distance [E], ordered time of sources [E, T], of targets [E, T]).

  Each node is encoded once and gathered per edge (the official code encodes both endpoints of
  every one of the N^2 pairs; the result is the same).
  """
  module = model.module(params)
  space, time = module.embed(graph.features)
  order = module.order_time(time)
  src, dst = graph.sources, graph.targets
  distance = module.distance(space[src], time[src], space[dst], time[dst])
  return distance, order[src], order[dst]


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  return jnp.sum(jnp.where(mask, values, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def ordered_fraction(order_src: jax.Array, order_dst: jax.Array, mask: jax.Array) -> jax.Array:
  return _masked_mean(jnp.all(order_src <= order_dst, axis=-1).astype(order_src.dtype), mask)


def loss_fn(model: functional.Functional, params, graph: GraphArrays
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  distance, order_src, order_dst = edge_geometry(model, params, graph)
  space_loss = _masked_mean(jnp.square(distance - graph.weights), graph.mask)
  ordered = ordered_fraction(order_src, order_dst, graph.mask)
  violation = jnp.mean(jax.nn.sigmoid(SIGMOID_SHARPNESS * (order_src - order_dst)), axis=-1)
  time_loss = _masked_mean(violation, graph.mask) * (1.0 - jax.lax.stop_gradient(ordered))
  loss = space_loss + time_loss
  return loss, {"loss": loss, "space_loss": space_loss, "time_loss": time_loss,
                "directionality": ordered}


def evaluate(model: functional.Functional, params, graph: GraphArrays) -> dict[str, jax.Array]:
  """Distortion statistics over the (unpadded) edges and directionality."""
  distance, order_src, order_dst = edge_geometry(model, params, graph)
  ratio = graph.weights / distance
  count = jnp.sum(graph.mask)
  mean = _masked_mean(ratio, graph.mask)
  squares = jnp.sum(jnp.where(graph.mask, jnp.square(ratio - mean), 0.0))
  return {
      "distortion_mean": mean,
      "distortion_std": jnp.sqrt(squares / jnp.maximum(count - 1, 1)),
      "distortion_max": jnp.max(jnp.where(graph.mask, ratio, -jnp.inf)),
      "directionality": ordered_fraction(order_src, order_dst, graph.mask),
  }
