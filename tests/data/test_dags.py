"""Weighted DAGs: random DAG edges, cycle condensation, layered drawings, edge weights, DREAM5."""
import numpy as np
import pytest

from jaxlab.data import dags


def test_random_dag_edges_point_forward_and_follow_p():
  sources, targets = dags.random_dag_edges(30, 1.0, seed=0)
  assert len(sources) == 30 * 29 // 2 and np.all(sources < targets)
  sources, targets = dags.random_dag_edges(200, 0.3, seed=1)
  assert np.all(sources < targets)
  assert abs(len(sources) / (200 * 199 / 2) - 0.3) < 0.02
  again = dags.random_dag_edges(200, 0.3, seed=1)
  np.testing.assert_array_equal(again[0], sources)
  assert not np.array_equal(dags.random_dag_edges(200, 0.3, seed=2)[1][:50], targets[:50])


def test_topological_generations_and_cycles():
  # 0 -> 1 -> 3, 0 -> 2 -> 3, 3 -> 4, 2 -> 4
  sources, targets = np.array([0, 1, 0, 2, 3, 2]), np.array([1, 3, 2, 3, 4, 4])
  np.testing.assert_array_equal(dags.topological_generations(5, sources, targets),
                                [0, 1, 1, 2, 3])
  with pytest.raises(ValueError, match="cycle"):
    dags.topological_generations(3, np.array([0, 1, 2]), np.array([1, 2, 0]))


def test_condense_cycles_merges_strongly_connected_components():
  # A 3-cycle 0 -> 1 -> 2 -> 0 with a tail 2 -> 3 -> 4, a 2-cycle 4 <-> 5, and 1 -> 3 twice.
  sources = np.array([0, 1, 2, 2, 3, 4, 5, 1])
  targets = np.array([1, 2, 0, 3, 4, 5, 4, 3])
  count, new_sources, new_targets, component = dags.condense_cycles(6, sources, targets)
  assert count == 3
  assert len(set(component[[0, 1, 2]])) == 1 and len(set(component[[4, 5]])) == 1
  edges = set(zip(new_sources.tolist(), new_targets.tolist()))
  assert edges == {(component[0], component[3]), (component[3], component[4])}
  dags.topological_generations(count, new_sources, new_targets)   # a DAG: no error


def test_generation_layout_is_layered_deterministic_and_normalised():
  sources, targets = dags.random_dag_edges(20, 0.3, seed=3)
  first, layout = dags.draw(20, sources, targets, "generations")
  second, _ = dags.draw(20, sources, targets, "generations")
  assert layout == "generations"
  np.testing.assert_array_equal(first, second)
  assert first.min() >= 0.0 and first.max() <= 1.0 and first.shape == (20, 2)
  generation = dags.topological_generations(20, sources, targets)
  # Sources are drawn on top: y decreases strictly with the generation.
  for g in range(generation.max()):
    assert first[generation == g, 1].min() > first[generation == g + 1, 1].max()


@pytest.mark.skipif(not dags.dot_available(), reason="Graphviz dot is not installed")
def test_dot_layout_draws_parents_above_children(tmp_path):
  sources, targets = np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3])
  coords, layout = dags.draw(4, sources, targets, "dot", cache_dir=tmp_path)
  assert layout == "dot" and list(tmp_path.iterdir())
  assert np.all(coords[sources, 1] > coords[targets, 1])
  cached, _ = dags.draw(4, sources, targets, "dot", cache_dir=tmp_path)
  np.testing.assert_array_equal(cached, coords)


def test_metric_weights_match_their_formulas():
  e = np.array([0.25, 0.5, 1.3])
  np.testing.assert_allclose(dags.metric_weight(e, "type1"), np.sqrt(e * np.log(1 + e)))
  np.testing.assert_allclose(dags.metric_weight(e, "type2"), e**0.1 * np.log(1 + e)**0.9)
  np.testing.assert_allclose(dags.metric_weight(e, "type3"), 1 - 1 / (1 + np.sqrt(e)))
  np.testing.assert_allclose(dags.metric_weight(np.array([0.5]), "type4"),
                             [1 - np.exp(0.5 / np.log(0.5))])
  np.testing.assert_allclose(dags.metric_weight(e, "type5"),
                             1 - 1 / (1 + e**0.2 + e**0.5))
  with pytest.raises(ValueError, match="type6"):
    dags.metric_weight(e, "type6")


def test_synthetic_dag_weights_are_the_metric_of_the_drawing(tmp_path):
  graph = dags.synthetic_dag("type1", num_nodes=15, p=0.4, seed=7, layout="generations",
                             data_dir=str(tmp_path))
  assert graph.layout == "generations" and graph.num_nodes == 15
  distance = np.linalg.norm(graph.features[graph.sources] - graph.features[graph.targets],
                            axis=-1)
  np.testing.assert_allclose(graph.weights, dags.metric_weight(distance, "type1"), rtol=1e-5)
  assert np.all(graph.sources < graph.targets)


def test_dream5_network_becomes_a_weighted_dag(tmp_path):
  names, raw_sources, _ = dags.read_dream5_edges("e_coli")
  graph = dags.dream5_dag("e_coli", layout="generations", data_dir=str(tmp_path))
  assert graph.num_nodes < len(names)          # E. coli has cycles to condense
  assert 0 < graph.num_edges <= len(raw_sources)
  dags.topological_generations(graph.num_nodes, graph.sources, graph.targets)
  assert np.all(graph.sources != graph.targets)
  assert graph.weights.min() >= 0.01 - 1e-7 and graph.weights.max() <= 1.0 + 1e-6
  with pytest.raises(ValueError, match="e_coli"):
    dags.load("dream5_nowhere")
