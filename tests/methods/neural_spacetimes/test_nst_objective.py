"""neural_spacetimes loss and metrics: hand-checked distortion, directionality and time term."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.data import dags
from jaxlab.methods.neural_spacetimes import models
from jaxlab.methods.neural_spacetimes import objective


def small_spec(kind, dim=2):
  return models.SpacetimeSpec(kind, dim, encoder_depth=2, encoder_width=8, head_width=4)


def diamond(num_padding=0):
  graph = dags.WeightedDag(
      name="diamond", features=np.array([[0.5, 1.0], [0.0, 0.5], [1.0, 0.5], [0.5, 0.0]],
                                        np.float32),
      sources=np.array([0, 0, 1, 2], np.int32), targets=np.array([1, 2, 3, 3], np.int32),
      weights=np.array([0.5, 0.7, 0.9, 1.1], np.float32), layout="generations")
  return graph


def test_graph_arrays_pad_and_mask():
  small = dags.WeightedDag("a", diamond().features, np.array([0], np.int32),
                           np.array([1], np.int32), np.array([0.3], np.float32), "generations")
  arrays = objective.graph_arrays([diamond(), small])
  assert arrays.sources.shape == (2, 4)
  np.testing.assert_array_equal(arrays.mask, [[1, 1, 1, 1], [1, 0, 0, 0]])


def test_evaluate_matches_a_hand_computation_and_ignores_padding():
  spec = small_spec("minkowski")
  model = models.spacetime(spec)
  params = model.init(jax.random.key(0))
  short = dags.WeightedDag("a", diamond().features, np.array([0, 1], np.int32),
                           np.array([1, 3], np.int32), np.array([0.5, 0.9], np.float32),
                           "generations")
  arrays = objective.graph_arrays([short, diamond()])
  padded = jax.tree.map(lambda a: a[0], arrays)   # `short`, padded to 4 edges
  metrics = objective.evaluate(model, params, padded)

  space, time = model.apply(params, jnp.asarray(diamond().features), method="embed")
  space, time = np.asarray(space, np.float64), np.asarray(time, np.float64)
  src, dst = np.array([0, 1]), np.array([1, 3])
  interval = (np.sum((space[src] - space[dst])**2, -1) - np.sum((time[src] - time[dst])**2, -1))
  ratio = np.array([0.5, 0.9]) / interval
  np.testing.assert_allclose(metrics["distortion_mean"], ratio.mean(), rtol=1e-4)
  np.testing.assert_allclose(metrics["distortion_std"], ratio.std(ddof=1), rtol=1e-4)
  np.testing.assert_allclose(metrics["distortion_max"], ratio.max(), rtol=1e-4)
  ordered = np.all(time[src] <= time[dst], axis=-1).mean()
  np.testing.assert_allclose(metrics["directionality"], ordered)


def test_time_term_follows_the_edge_direction_and_vanishes_when_ordered():
  mask = jnp.array([True, True])
  before, after = jnp.array([[0.0], [0.0]]), jnp.array([[1.0], [-1.0]])
  np.testing.assert_allclose(objective.ordered_fraction(before, after, mask), 0.5)
  np.testing.assert_allclose(objective.ordered_fraction(before, after, jnp.array([True, False])),
                             1.0)

  # With every edge ordered the time term is exactly 0 (its scale 1 - fraction is 0).
  spec = small_spec("minkowski", dim=1)
  model = models.spacetime(spec)
  params = model.init(jax.random.key(1))
  graph = jax.tree.map(lambda a: a[0], objective.graph_arrays([diamond()]))
  _, time = model.apply(params, graph.features, method="embed")
  order = np.argsort(np.argsort(np.asarray(time[:, 0])))
  # Re-point every edge from the earlier to the later node of the current embedding.
  src, dst = np.asarray(graph.sources), np.asarray(graph.targets)
  forward = order[src] < order[dst]
  ordered_graph = graph._replace(sources=jnp.where(forward, src, dst),
                                 targets=jnp.where(forward, dst, src))
  _, aux = objective.loss_fn(model, params, ordered_graph)
  assert float(aux["directionality"]) == 1.0 and float(aux["time_loss"]) == 0.0
  reversed_graph = graph._replace(sources=ordered_graph.targets, targets=ordered_graph.sources)
  _, aux = objective.loss_fn(model, params, reversed_graph)
  assert float(aux["directionality"]) == 0.0 and float(aux["time_loss"]) > 0.5


def test_nst_distance_is_symmetric_and_spec_dimensions():
  assert small_spec("nst", 4).time_dim == 4 and small_spec("minkowski", 4).time_dim == 1
  assert small_spec("de_sitter", 4).space_dim == 5
  model = models.spacetime(small_spec("nst"))
  params = model.init(jax.random.key(2))
  module = model.module(params)
  space, time = module.embed(jnp.asarray(diamond().features))
  forward = module.distance(space[:2], time[:2], space[2:], time[2:])
  backward = module.distance(space[2:], time[2:], space[:2], time[:2])
  np.testing.assert_allclose(forward, backward, rtol=1e-6)
  assert np.all(np.asarray(forward) > 0)
