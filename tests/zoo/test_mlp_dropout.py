"""The zoo MLP's dropout: off without a key, inverted dropout with one, a bad rate refused."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import functional
from jaxlab.zoo import mlp


def network(rate, hidden=(256, 256)):
  return functional.Functional(lambda rngs: mlp.MLP([8, *hidden, 4], activation="relu",
                                                    dropout=rate, rngs=rngs))


def test_without_a_key_dropout_changes_nothing():
  plain, dropped = network(0.0), network(0.75)
  params = plain.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (5, 8))
  np.testing.assert_array_equal(dropped.apply(params, x), plain.apply(params, x))


def test_with_a_key_hidden_units_drop_at_the_rate_and_the_mean_is_kept():
  net = network(0.75)
  params = net.init(jax.random.key(0))
  module = net.module(params)
  x = jax.random.normal(jax.random.key(1), (4096, 8))
  hidden = jax.nn.relu(module.layers[0](x))
  # The same draw the MLP makes for its first hidden layer (fold_in of layer index 0).
  keep = jax.random.bernoulli(jax.random.fold_in(jax.random.key(2), 0), 0.25, hidden.shape)
  assert abs(float(jnp.mean(keep)) - 0.25) < 0.01
  out = net.apply(params, x, dropout_key=jax.random.key(2))
  assert not np.allclose(out, net.apply(params, x))
  # Inverted dropout: with one hidden layer the output is linear in the dropped units, so its
  # mean over keys is the deterministic output.
  net = network(0.75, hidden=(256,))
  params = net.init(jax.random.key(0))
  outs = jax.vmap(lambda k: net.apply(params, x[:4], dropout_key=k))(
      jax.random.split(jax.random.key(3), 4000))
  np.testing.assert_allclose(jnp.mean(outs, 0), net.apply(params, x[:4]), atol=0.05)


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_a_rate_outside_zero_one_is_refused(rate):
  with pytest.raises(ValueError, match="dropout"):
    network(rate).init(jax.random.key(0))
