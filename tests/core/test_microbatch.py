"""Microbatched gradients equal whole-batch gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import microbatch


def mean_loss(params, batch):
  prediction = jnp.tanh(batch["x"] @ params["w"]) @ params["v"]
  return jnp.mean(jnp.square(prediction - batch["y"]))


def problem():
  keys = jax.random.split(jax.random.key(0), 4)
  params = {"w": jax.random.normal(keys[0], (3, 8), jnp.float64),
            "v": jax.random.normal(keys[1], (8,), jnp.float64)}
  batch = {"x": jax.random.normal(keys[2], (24, 3), jnp.float64),
           "y": jax.random.normal(keys[3], (24,), jnp.float64)}
  return params, batch


@pytest.mark.parametrize("size", [None, 0, 4, 8, 24, 48])
def test_microbatched_value_and_gradient_equal_the_whole_batch(size):
  with jax.enable_x64(True):
    params, batch = problem()
    want_loss, want_grads = jax.value_and_grad(mean_loss)(params, batch)
    loss, grads = jax.jit(microbatch.value_and_grad(mean_loss, size))(params, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-13)
    for name in params:
      np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-12, atol=1e-14)


def test_a_batch_that_does_not_split_evenly_is_refused():
  with jax.enable_x64(True):
    params, batch = problem()
    with pytest.raises(ValueError, match="microbatches of 5"):
      microbatch.value_and_grad(mean_loss, 5)(params, batch)


def test_microbatches_are_strided_so_a_sharded_batch_splits_on_each_device():
  batch = {"x": jnp.arange(12)}
  chunks = microbatch.split_batch(batch, 3)["x"]
  np.testing.assert_array_equal(chunks, [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]])


def test_microbatched_gradient_of_a_batch_sharded_over_devices_equals_the_whole_batch():
  devices = jax.devices()   # the test suite simulates 8
  mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  with jax.enable_x64(True):
    params, batch = problem()
    # 24 rows per device, two microbatches: each device splits its own rows into two of 12.
    batch = {k: jnp.concatenate([v] * len(devices)) for k, v in batch.items()}
    want_loss, want_grads = jax.value_and_grad(mean_loss)(params, batch)
    fn = jax.jit(microbatch.value_and_grad(mean_loss, batch["y"].shape[0] // 2))
    loss, grads = fn(params, jax.device_put(batch, sharded))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-13)
    for name in params:
      np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-12, atol=1e-14)
