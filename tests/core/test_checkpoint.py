"""Checkpoint round trip with shardings, data-iterator state and metadata."""
import concurrent.futures
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


def test_managers_saving_from_several_threads_at_once_all_finish(tmp_path):
  # orbax's async saves share one process-wide operation id; concurrent saves from threads
  # once hung on each other's commit signals (flow_mi's parallel fits).
  def save_and_restore(index):
    state = {"w": jnp.full((4, 3), float(index))}
    with checkpoint.Checkpointer(tmp_path / f"run{index}") as checkpointer:
      for step in range(3):
        checkpointer.save(step, state, meta={"index": index})
      checkpointer.wait()
      restored, _, meta = checkpointer.restore(2, checkpoint.abstract_like(state))
    return float(restored["w"][0, 0]), meta["index"]

  with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    results = list(pool.map(save_and_restore, range(4)))
  assert results == [(float(index), index) for index in range(4)]
