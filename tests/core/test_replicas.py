"""core.replicas: the chunked outer loop over many replicas (ragged end, checkpoints, resume)."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.core import checkpoint
from jaxlab.core import metrics
from jaxlab.core import parallel
from jaxlab.core import replicas

CHUNK = 4


def counting_chunk(state, start, stop):
  """Adds the step index of every active step to each replica's running total."""
  steps = start + jnp.arange(CHUNK)
  added = jnp.sum(jnp.where(steps < stop, steps, 0))
  state = {"total": state["total"] + added * state["scale"], "scale": state["scale"]}
  return state, {"total": state["total"], "nan_for_first": jnp.where(
      jnp.arange(state["total"].shape[0]) == 0, jnp.nan, 1.0)}


def init():
  return {"total": jnp.zeros(3), "scale": jnp.arange(1.0, 4.0)}


def test_run_chunks_ragged_end_checkpoints_and_resume(tmp_path):
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  chunk = jax.jit(counting_chunk)
  first = replicas.run_chunks(init, chunk, steps=6, chunk_steps=CHUNK, ckpt_every=CHUNK,
                              mesh=mesh, workdir=tmp_path, progress=False)
  np.testing.assert_allclose(first.state["total"], sum(range(6)) * np.arange(1.0, 4.0))
  assert [h["step"] for h in first.history] == [4, 6]
  assert checkpoint.Checkpointer(tmp_path / "checkpoints").all_steps() == [4, 6]
  # The NaN of replica 0 is ignored by the summary mean.
  assert first.history[-1]["nan_for_first"] == 1.0

  resumed = replicas.run_chunks(init, chunk, steps=11, chunk_steps=CHUNK, ckpt_every=CHUNK,
                                mesh=mesh, workdir=tmp_path, progress=False)
  np.testing.assert_allclose(resumed.state["total"], sum(range(11)) * np.arange(1.0, 4.0))
  assert [h["step"] for h in resumed.history] == [10, 11] and resumed.earlier_s > 0
  assert [r["step"] for r in metrics.read_jsonl(tmp_path)] == [4, 6, 10, 11]

  done = replicas.run_chunks(init, chunk, steps=11, chunk_steps=CHUNK, ckpt_every=CHUNK,
                             mesh=mesh, workdir=tmp_path, progress=False)
  assert done.history == [] and done.last_metrics is None
  np.testing.assert_allclose(done.state["total"], resumed.state["total"])


def test_replica_sharding_splits_only_when_replicas_divide_the_devices():
  mesh = parallel.make_mesh()
  assert replicas.replica_sharding(8, mesh) == parallel.data_sharded(mesh)
  assert replicas.replica_sharding(3, mesh) == parallel.replicated(mesh)
  placed = replicas.place({"a": np.zeros((16, 2))}, mesh)
  assert placed["a"].sharding == parallel.data_sharded(mesh)


def test_replica_stacked_tree_helpers():
  tree = {"w": jnp.arange(6.0).reshape(3, 2), "b": jnp.arange(3.0)}
  assert replicas.num_replicas(tree) == 3
  second = replicas.take(tree, 1)
  np.testing.assert_array_equal(second["w"], [2.0, 3.0])
  assert float(second["b"]) == 1.0


def test_pad_repeats_the_first_replicas_up_to_a_multiple_of_the_mesh():
  mesh = parallel.make_mesh()
  size = mesh.devices.size
  tree = {"a": np.arange(size + 1), "b": np.ones((size + 1, 2))}
  padded = replicas.pad(tree, mesh)
  assert replicas.num_replicas(padded) == replicas.padded_count(size + 1, mesh) == 2 * size
  np.testing.assert_array_equal(padded["a"][:size + 1], tree["a"])
  np.testing.assert_array_equal(padded["a"][size + 1:], tree["a"][:size - 1])
  assert replicas.pad({"a": np.arange(size)}, mesh)["a"].shape == (size,)


def _layer_loss(weights, inputs, shift):
  return jnp.sum(jnp.tanh(inputs @ weights["kernel"] + shift) ** 2)


def test_map_replicas_matches_vmap_in_value_gradient_and_forward_mode():
  keys = jax.random.split(jax.random.key(0), 3)
  weights = {"kernel": jax.vmap(lambda k: jax.random.normal(k, (4, 5)))(keys)}
  inputs = jax.random.normal(jax.random.key(1), (3, 6, 4))
  shift = jnp.float32(0.3)   # shared by every replica (in_axes None)
  step = jax.value_and_grad(_layer_loss)
  expected = jax.vmap(step, in_axes=(0, 0, None))(weights, inputs, shift)
  got = jax.jit(replicas.map_replicas(step, in_axes=(0, 0, None)))(weights, inputs, shift)
  chex_close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  jax.tree.map(chex_close, got, expected)
  # Forward mode goes through the sequential form too (jacfwd of a replica-mapped function).
  loss_of_shift = lambda s: replicas.map_replicas(_layer_loss, in_axes=(0, 0, None))(
      weights, inputs, s).sum()
  np.testing.assert_allclose(jax.jacfwd(loss_of_shift)(shift), jax.grad(loss_of_shift)(shift),
                             rtol=1e-5)
  assert replicas.runs_replicas_in_turn() == (jax.device_count() == 1)
  mapped = replicas.map_replicas(step, in_axes=(0, 0, None))
  in_turn = "scan" in str(jax.make_jaxpr(mapped)(weights, inputs, shift))
  assert in_turn == replicas.runs_replicas_in_turn()


def test_map_replicas_rejects_mismatched_axes():
  with np.testing.assert_raises(ValueError):
    replicas.map_replicas(lambda a, b: a + b, in_axes=(0,))(jnp.zeros(2), jnp.zeros(2))
