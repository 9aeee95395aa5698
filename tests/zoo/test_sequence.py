"""Zoo sequence models: shapes, causality, linear attention, long convolutions, last_only."""
import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import attention
from jaxlab.zoo import functional
from jaxlab.zoo import mlp
from jaxlab.zoo import sequence


def backbone(mixer, *, causal=True, **kwargs):
  return functional.Functional(lambda rngs: sequence.Backbone(
      d_in=3, d_out=2, width=16, depth=2, max_len=12, mixer=mixer, num_heads=4, causal=causal,
      rngs=rngs, **kwargs))


@pytest.mark.parametrize("mixer", sequence.MIXERS)
def test_backbone_shapes_without_compiling(mixer):
  model = backbone(mixer)
  params = jax.eval_shape(model.init, jax.random.key(0))
  out = jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((5, 12, 3), jnp.float32))
  chex.assert_shape(out, (5, 12, 2))
  chex.assert_shape(params["read_in"]["kernel"], (3, 16))


@pytest.mark.parametrize("mixer", sequence.MIXERS)
def test_causal_models_ignore_the_future(mixer):
  model = backbone(mixer, use_mlp=True)
  params = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (2, 10, 3))
  x_changed = x.at[:, 6:].add(1.0)
  y, y_changed = model.apply(params, x), model.apply(params, x_changed)
  np.testing.assert_allclose(y[:, :6], y_changed[:, :6], atol=1e-6)
  assert not np.allclose(y[:, 6:], y_changed[:, 6:], atol=1e-3)


def test_non_causal_attention_sees_the_future():
  model = backbone("linear_attention", causal=False)
  params = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (2, 10, 3))
  y, y_changed = model.apply(params, x), model.apply(params, x.at[:, 8:].add(1.0))
  assert not np.allclose(y[:, :6], y_changed[:, :6], atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length,head_dim", [(6, 8), (12, 2)])   # both code paths
def test_linear_attention_equals_its_quadratic_form(causal, length, head_dim):
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 3, length, head_dim)) for i in range(3))
  np.testing.assert_allclose(attention.linear_mix(q, k, v, causal),
                             attention.linear_mix_quadratic(q, k, v, causal),
                             rtol=1e-5, atol=1e-5)


def test_flat_dot_general_equals_dot_general_in_value_and_both_autodiff_modes():
  with jax.enable_x64(True):
    x = jax.random.normal(jax.random.key(0), (2, 3, 4), jnp.float64)
    w = jax.random.normal(jax.random.key(1), (4, 5), jnp.float64)
    numbers = (((2,), (0,)), ((), ()))
    flat = lambda x, w: jnp.sum(jnp.sin(mlp.flat_dot_general(x, w, numbers)))
    plain = lambda x, w: jnp.sum(jnp.sin(jax.lax.dot_general(x, w, numbers)))
    np.testing.assert_allclose(flat(x, w), plain(x, w), rtol=1e-13)
    for transform in (jax.grad, jax.jacfwd):
      for got, want in zip(transform(flat, argnums=(0, 1))(x, w),
                           transform(plain, argnums=(0, 1))(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def explicit_mix(q, k, v, softmax, causal):
  """The textbook formula on head-major [B, H, L, Dh], differentiated by autodiff."""
  scores = jnp.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(q.shape[-1])
  mask = np.tril(np.ones((q.shape[2], k.shape[2]), bool)) if causal else None
  if softmax:
    weights = jax.nn.softmax(scores if mask is None else jnp.where(mask, scores, -jnp.inf), -1)
  else:
    weights = scores if mask is None else jnp.where(mask, scores, 0.0)
  return jnp.einsum("bhts,bhsd->bhtd", weights, v)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("softmax", [True, False])
def test_attention_mix_value_and_gradient_match_the_explicit_formula(softmax, causal):
  with jax.enable_x64(True):
    q, k, v, cotangent = (jax.random.normal(jax.random.key(i), (2, 3, 7, 4), jnp.float64)
                          for i in range(4))
    mix = attention.softmax_mix if softmax else attention.linear_mix_quadratic
    loss = lambda f: lambda q, k, v: jnp.sum(cotangent * f(q, k, v))
    np.testing.assert_allclose(mix(q, k, v, causal), explicit_mix(q, k, v, softmax, causal),
                               rtol=1e-12, atol=1e-12)
    ours = jax.grad(loss(lambda *a: mix(*a, causal)), argnums=(0, 1, 2))(q, k, v)
    reference = jax.grad(loss(lambda *a: explicit_mix(*a, softmax, causal)),
                         argnums=(0, 1, 2))(q, k, v)
    for got, want in zip(ours, reference):
      np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_long_convolution_implementations_agree_and_match_a_loop():
  v = jax.random.normal(jax.random.key(0), (2, 9, 4))
  kernel = jax.random.normal(jax.random.key(1), (12, 4))
  loop = np.zeros((2, 9, 4))
  for t in range(9):
    for s in range(t + 1):
      loop[:, t] += np.asarray(kernel[t - s]) * np.asarray(v[:, s])
  np.testing.assert_allclose(sequence.toeplitz_causal_conv(v, kernel), loop, atol=1e-5)
  np.testing.assert_allclose(sequence.fft_causal_conv(v, kernel), loop, atol=1e-4)


@pytest.mark.parametrize("mixer", sequence.MIXERS)
def test_last_only_equals_the_last_row_of_the_full_output(mixer):
  for causal in ([True] if mixer == "baseconv" else [True, False]):
    model = backbone(mixer, causal=causal, use_mlp=True)
    params = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (3, 11, 3))
    np.testing.assert_allclose(model.apply(params, x, last_only=True)[:, 0],
                               model.apply(params, x)[:, -1], rtol=1e-5, atol=1e-6)


def test_baseconv_is_a_polynomial_of_degree_two_per_layer():
  """One BaseConv layer: scaling the input by s scales a bias-free output by s^2."""
  layer = sequence.BaseConv(8, 6, conv_residual=False, rngs=nnx.Rngs(0))
  layer.conv.bias[...] = jnp.zeros(8)
  for linear in (layer.in_proj, layer.gate_proj, layer.out_proj):
    linear.bias[...] = jnp.zeros(8)
  u = jax.random.normal(jax.random.key(1), (2, 6, 8))
  np.testing.assert_allclose(layer(3.0 * u), 9.0 * layer(u), rtol=1e-5, atol=1e-6)


def test_baseconv_initial_branch_weights_are_one_zero():
  layer = sequence.BaseConv(4, 5, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(layer.branch[...], [1.0, 0.0])


def test_gpt2_initialisation_scales_residual_projections():
  params = backbone("softmax_attention", use_mlp=True).init(jax.random.key(0))
  std_out = float(jnp.std(params["blocks"][0]["mixer"]["out"]["kernel"]))
  std_qkv = float(jnp.std(params["blocks"][0]["mixer"]["qkv"]["kernel"]))
  assert std_out < 0.7 * std_qkv


def test_unknown_names_raise():
  with pytest.raises(ValueError, match="unknown mixer 'rnn'"):
    sequence.mixer_factory("rnn", 8, 4)
  with pytest.raises(ValueError, match="unknown activation"):
    mlp.MLP([2, 3], activation="swish2", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="exceeds max_len"):
    backbone("baseconv").apply(backbone("baseconv").init(jax.random.key(0)),
                               jnp.ones((1, 13, 3)))


def test_float64_parameters_when_asked():
  with jax.enable_x64(True):
    model = functional.Functional(lambda rngs: sequence.Backbone(
        d_in=2, d_out=1, width=8, depth=1, max_len=4, param_dtype=jnp.float64, rngs=rngs))
    params = model.init(jax.random.key(0))
    assert all(x.dtype == jnp.float64 for x in jax.tree.leaves(params))
    assert model.apply(params, jnp.ones((1, 4, 2), jnp.float64)).dtype == jnp.float64


def test_functional_apply_is_pure_and_differentiable():
  model = functional.Functional(lambda rngs: mlp.MLP([3, 8, 1], rngs=rngs))
  params = model.init(jax.random.key(0))
  x = jnp.ones((4, 3))
  grads = jax.grad(lambda p: jnp.sum(model.apply(p, x)))(params)
  assert jax.tree.structure(grads) == jax.tree.structure(params)
  np.testing.assert_array_equal(model.apply(params, x), model.apply(params, x))
