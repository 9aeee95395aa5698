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
