"""neural_spacetimes training: one compile, exact resume, device-count invariance, a tiny DAG."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.core import parallel
from jaxlab.core import replicas
from jaxlab.data import dags
from jaxlab.methods.neural_spacetimes import models
from jaxlab.methods.neural_spacetimes import objective
from jaxlab.methods.neural_spacetimes import training

SPEC = models.SpacetimeSpec("nst", 2, encoder_depth=2, encoder_width=16, head_width=6)


def tiny_graphs(count=1):
  sources, targets = dags.random_dag_edges(8, 0.5, seed=0)
  features, layout = dags.draw(8, sources, targets, "generations")
  graph = dags.WeightedDag("tiny", features, sources, targets,
                           np.linspace(0.2, 1.0, len(sources)).astype(np.float32), layout)
  return objective.graph_arrays([graph] * count)


def keys(count):
  return jax.random.split(jax.random.key(0), count)


def test_chunk_traces_once_across_chunks_and_a_ragged_end():
  schedule = training.Schedule(epochs=0, chunk_epochs=3, ckpt_every=0)
  counted = chex.assert_max_traces(training.replica_chunk(SPEC, schedule), n=1)
  chunk = training.vectorize(counted)
  state = training.init_function(SPEC, schedule)(keys(2))
  graphs = tiny_graphs(2)
  for start, stop in ((0, 3), (3, 6), (6, 7)):   # the last chunk runs 1 of its 3 epochs
    state, metrics = chunk(state, graphs, jnp.asarray(start), jnp.asarray(stop))
  assert np.all(np.isfinite(metrics["train/loss"]))
  chex.clear_trace_counter()


def test_fit_compiles_the_chunk_once():
  schedule = training.Schedule(epochs=7, chunk_epochs=3, ckpt_every=3)
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  training.fit(SPEC, tiny_graphs(2), keys(2), schedule, mesh=mesh, progress=False)
  compiled = training.chunk_function(  # pylint: disable-next=protected-access
      SPEC, training._compiled_schedule(schedule), replicas.replica_sharding(2, mesh))
  assert compiled._cache_size() == 1  # pylint: disable=protected-access


def test_resumed_fit_ends_with_the_same_parameters(tmp_path):
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  schedule = training.Schedule(epochs=6, chunk_epochs=2, ckpt_every=2)
  whole = training.fit(SPEC, tiny_graphs(2), keys(2), schedule, mesh=mesh, progress=False)
  training.fit(SPEC, tiny_graphs(2), keys(2), training.Schedule(epochs=4, chunk_epochs=2,
                                                               ckpt_every=2),
               mesh=mesh, workdir=tmp_path, progress=False)
  resumed = training.fit(SPEC, tiny_graphs(2), keys(2), schedule, mesh=mesh, workdir=tmp_path,
                         progress=False)
  assert resumed.earlier_s > 0 and [h["step"] for h in resumed.history] == [6]
  chex.assert_trees_all_close(resumed.params, whole.params, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(resumed.metrics["distortion_mean"],
                             whole.metrics["distortion_mean"], rtol=1e-5)


def test_eight_devices_fit_like_one():
  schedule = training.Schedule(epochs=4, chunk_epochs=2, ckpt_every=2)
  one = training.fit(SPEC, tiny_graphs(8), keys(8), schedule,
                     mesh=parallel.make_mesh(devices=jax.devices()[:1]), progress=False)
  eight = training.fit(SPEC, tiny_graphs(8), keys(8), schedule, mesh=parallel.make_mesh(),
                       progress=False)
  assert len(jax.devices()) == 8
  # Replica r runs alone on device r instead of in a batch of 8: float32 reductions may differ
  # in the last bits, which Adam's normalised steps carry along.
  chex.assert_trees_all_close(jax.device_get(eight.params), jax.device_get(one.params),
                              rtol=1e-4, atol=1e-4)


def test_a_tiny_dag_is_embedded_with_every_edge_ordered():
  schedule = training.Schedule(epochs=1000, chunk_epochs=500, learning_rate=3e-3)
  fit = training.fit(SPEC, tiny_graphs(4), keys(4), schedule,
                     mesh=parallel.make_mesh(devices=jax.devices()[:1]), progress=False)
  np.testing.assert_array_equal(fit.metrics["directionality"], 1.0)   # every seed
  assert np.all(np.abs(fit.metrics["distortion_mean"] - 1.0) < 0.2)
  assert fit.history[-1]["train/loss"] < fit.history[0]["train/loss"]
