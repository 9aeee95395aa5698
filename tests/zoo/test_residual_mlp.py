"""zoo ResidualMLP: shapes, zero output at init, time conditioning, input checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import functional
from jaxlab.zoo import residual_mlp
from jaxlab.zoo import unet


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


def test_label_embedding_is_required_exactly_when_built_with_one():
  labelled = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=4, out_features=4, width=8, num_blocks=1, num_embeddings=3, rngs=rngs))
  params = labelled.init(jax.random.key(0))
  x, t = jnp.ones((2, 4)), jnp.array([1, 2])
  assert labelled.apply(params, x, t, jnp.array([0, 2])).shape == (2, 4)
  with pytest.raises(ValueError, match="embeds labels"):
    labelled.apply(params, x, t)
  plain = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=4, out_features=4, width=8, num_blocks=1, rngs=rngs))
  with pytest.raises(ValueError, match="has no label embedding"):
    plain.apply(plain.init(jax.random.key(0)), x, t, jnp.array([0, 1]))
  # The same checks on the scalar-time road.
  with pytest.raises(ValueError, match="embeds labels"):
    labelled.apply(params, x, 3)
  with pytest.raises(ValueError, match="has no label embedding"):
    plain.apply(plain.init(jax.random.key(0)), x, 3, jnp.array([0, 1]))


@pytest.mark.parametrize("num_embeddings", [None, 5])
def test_a_scalar_time_gives_the_per_row_values_and_gradients(num_embeddings):
  model = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=6, out_features=6, width=16, num_blocks=2, num_embeddings=num_embeddings,
      rngs=rngs))
  params = jax.tree.map(lambda p: p + 0.05 * jnp.cos(jnp.arange(p.size).reshape(p.shape)),
                        model.init(jax.random.key(0)))
  x = jax.random.normal(jax.random.key(1), (7, 6))
  labels = None if num_embeddings is None else jnp.array([0, 4, 2, 2, 1, 3, 0])
  loss = lambda p, t: jnp.sum(jnp.sin(model.apply(p, x, t, labels)))
  per_row, shared = jnp.full((7,), 413), jnp.asarray(413)
  np.testing.assert_allclose(model.apply(params, x, shared, labels),
                             model.apply(params, x, per_row, labels), rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(jax.grad(loss)(params, shared)),
                  jax.tree.leaves(jax.grad(loss)(params, per_row))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_add_label_embedding_keeps_a_pretrained_networks_output_for_every_label():
  def build(num_embeddings):
    return functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
        in_features=4, out_features=4, width=8, num_blocks=1, num_embeddings=num_embeddings,
        rngs=rngs))
  pretrained = build(None)
  # Perturbed so the zero-initialised output layer does not hide the embedding's effect.
  params = jax.tree.map(lambda p: p + 0.1, pretrained.init(jax.random.key(0)))
  widened = unet.add_label_embedding(params, num_labels=10)
  assert widened["label_embedding"]["embedding"].shape == (11, 8)   # the last row: null label
  labelled = build(11)
  x = jax.random.normal(jax.random.key(1), (11, 4))
  t = jnp.arange(11)
  expected = jax.jit(pretrained.apply)(params, x, t)
  apply = jax.jit(labelled.apply)
  np.testing.assert_allclose(apply(widened, x, t, jnp.arange(11)), expected, rtol=1e-6, atol=1e-7)
  # A trained (nonzero) table does change it: the check above can fail.
  trained = dict(widened, label_embedding={"embedding": jnp.ones((11, 8))})
  assert not np.allclose(apply(trained, x, t, jnp.arange(11)), expected)
  with pytest.raises(ValueError, match="already have"):
    unet.add_label_embedding(widened, 10)
