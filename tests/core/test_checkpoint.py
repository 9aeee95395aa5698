"""Checkpoint round trip with shardings, data-iterator state and metadata."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.core import checkpoint
from jaxlab.core import parallel
from jaxlab.data import pipeline


def test_roundtrip_keeps_values_structure_and_sharding(tmp_path):
  mesh = parallel.make_mesh()
  params = {"layers": {0: {"w": jnp.arange(6.0).reshape(2, 3)}, 1: {"w": jnp.ones(4)}}}
  state = parallel.replicate({"params": params, "opt": optax.adam(1e-3).init(params)}, mesh)
  source = pipeline.InMemorySource({"x": np.arange(40)})
  it = pipeline.grain_pipeline(source, batch_size=8, seed=1)
  next(it)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(7, state, data_state=it.get_state(), meta={"note": "x"})
  expected_next = next(it)["x"]
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 7
    restored, data_state, meta = ckpt.restore(
        7, checkpoint.abstract_like(state, parallel.replicated(mesh)))
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  np.testing.assert_array_equal(restored["params"]["layers"][0]["w"],
                                params["layers"][0]["w"])
  assert restored["params"]["layers"][1]["w"].sharding == parallel.replicated(mesh)
  assert meta == {"note": "x"}
  fresh = pipeline.grain_pipeline(source, batch_size=8, seed=1)
  fresh.set_state(data_state)
  np.testing.assert_array_equal(next(fresh)["x"], expected_next)


def test_latest_step_of_missing_directory_is_none(tmp_path):
  assert checkpoint.latest_step(tmp_path / "nothing") is None
