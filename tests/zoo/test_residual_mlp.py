"""zoo ResidualMLP: shapes, zero output at init, time conditioning, input checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import functional
from jaxlab.zoo import residual_mlp


def make(width=16, blocks=2):
  return functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=6, out_features=4, width=width, num_blocks=blocks, rngs=rngs))


def test_fresh_model_predicts_zero_and_has_the_output_shape():
  model = make()
  params = model.init(jax.random.key(0))
  out = model.apply(params, jax.random.normal(jax.random.key(1), (3, 6)), jnp.arange(3))
  assert out.shape == (3, 4)
  np.testing.assert_array_equal(out, 0.0)


def test_output_depends_on_time_and_a_scalar_time_is_broadcast():
  model = make()
  params = jax.tree.map(lambda p: p + 0.1, model.init(jax.random.key(0)))
  x = jax.random.normal(jax.random.key(1), (2, 6))
  early, late = model.apply(params, x, jnp.array([1, 1])), model.apply(params, x, jnp.array([9, 9]))
  assert not np.allclose(early, late)
  np.testing.assert_allclose(model.apply(params, x, 9), late, rtol=1e-6)


def test_wrong_input_width_is_rejected():
  model = make()
  with pytest.raises(ValueError, match=r"\[B, 6\]"):
    model.apply(model.init(jax.random.key(0)), jnp.zeros((2, 5)), jnp.zeros((2,), jnp.int32))
