"""Diffusion UNet: shapes, zero-initialised output, conditioning on t and label, argument checks,
gradients through `Functional`, batch independence, input widening, the sinusoidal embedding and
the parameter count.

Tiny sizes (8 base channels, 16x16 and 32x32 images); test data come from NumPy and each check is
one `jax.jit`. Most checks use perturbed parameters: at init the output conv is zero, so the
output is 0 whatever the input and would hide nearly any bug.
"""
from __future__ import annotations

import math

import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import functional
from jaxlab.zoo import unet

BASE, GROUPS, HEADS = 8, 4, 2


def model(*, in_channels=3, out_channels=3, channel_multipliers=(1, 2, 2), num_embeddings=None,
          blocks_per_level=1):
  return functional.Functional(lambda rngs: unet.UNet(
      in_channels=in_channels, out_channels=out_channels, base_channels=BASE,
      channel_multipliers=channel_multipliers, blocks_per_level=blocks_per_level,
      num_heads=HEADS, groups=GROUPS, num_embeddings=num_embeddings, rngs=rngs))


def normal(shape, seed):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def perturbed(params, seed=0):
  """Init plus noise on every leaf, so the zero output conv (and zero biases) come alive."""
  leaves, treedef = jax.tree.flatten(params)
  return jax.tree.unflatten(treedef, [np.asarray(leaf) + 0.1 * normal(leaf.shape, seed + i)
                                      for i, leaf in enumerate(leaves)])


def test_shapes_and_zero_initialised_output():
  for size, in_channels, out_channels in ((16, 3, 5), (32, 6, 2)):
    net = model(in_channels=in_channels, out_channels=out_channels)
    params = net.init(jax.random.key(0))
    x = normal((2, size, size, in_channels), 1)
    t = np.array([0, 999])
    run = jax.jit(net.apply)
    fresh = run(params, x, t)
    chex.assert_shape(fresh, (2, size, size, out_channels))
    np.testing.assert_array_equal(fresh, 0.0)
    alive = run(perturbed(params), x, t)
    chex.assert_shape(alive, (2, size, size, out_channels))
    assert np.all(np.isfinite(alive))
    assert np.std(alive) > 1e-2
  # A float timestep shared by the batch is accepted too.
  chex.assert_shape(jax.eval_shape(net.apply, params, x, 0.5), (2, 32, 32, 2))


def test_output_depends_on_time_and_label():
  net = model(num_embeddings=3)
  params = perturbed(net.init(jax.random.key(0)))
  x = np.repeat(normal((1, 16, 16, 3), 2), 4, axis=0)
  t = np.array([10, 500, 10, 10])
  label = np.array([0, 0, 2, 0])
  y = jax.jit(net.apply)(params, x, t, label)
  # Rows 0 and 3 are the same example; 1 differs in t only, 2 in label only.
  np.testing.assert_allclose(y[3], y[0], rtol=1e-6, atol=1e-6)
  assert np.max(np.abs(y[1] - y[0])) > 1e-2
  assert np.max(np.abs(y[2] - y[0])) > 1e-2


def test_arguments_are_checked():
  labelled = model(num_embeddings=3)
  labelled_params = jax.eval_shape(labelled.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((2, 16, 16, 3), jnp.float32)
  t = jax.ShapeDtypeStruct((2,), jnp.int32)
  with pytest.raises(ValueError, match="pass label"):
    jax.eval_shape(labelled.apply, labelled_params, x, t)
  plain = model()
  plain_params = jax.eval_shape(plain.init, jax.random.key(0))
  with pytest.raises(ValueError, match="do not pass a label"):
    jax.eval_shape(plain.apply, plain_params, x, t, t)
  # Three levels halve twice: 16 works, 18 (= 2 * 9) does not, in either dimension.
  for shape in ((2, 18, 16, 3), (2, 16, 18, 3)):
    with pytest.raises(ValueError, match="divisible by 2"):
      jax.eval_shape(plain.apply, plain_params, jax.ShapeDtypeStruct(shape, jnp.float32), t)
  with pytest.raises(ValueError, match="expected x of shape"):
    jax.eval_shape(plain.apply, plain_params, jax.ShapeDtypeStruct((2, 16, 16, 4), jnp.float32),
                   t)
  with pytest.raises(ValueError, match="divisible by groups"):
    unet.UNet(in_channels=3, out_channels=3, base_channels=6, groups=4,
              rngs=nnx.Rngs(0))


def test_gradients_are_finite_and_reach_the_input_conv():
  net = model(num_embeddings=2, blocks_per_level=2, channel_multipliers=(1, 2))
  fresh = net.init(jax.random.key(0))
  x = normal((2, 16, 16, 3), 3)
  target = normal((2, 16, 16, 3), 4)
  t, label = np.array([3, 700]), np.array([1, 0])

  @jax.jit
  def grad(params):
    return jax.grad(lambda p: jnp.mean(jnp.square(net.apply(p, x, t, label) - target)))(params)

  # At init only the output conv gets a gradient (everything else is behind its zero kernel)...
  at_init = grad(fresh)
  assert np.any(at_init["output_conv"]["kernel"] != 0)
  np.testing.assert_array_equal(at_init["input_conv"]["kernel"], 0.0)
  # ... and once it has moved, every parameter does.
  grads = grad(perturbed(fresh))
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    assert np.all(np.isfinite(g)), jax.tree_util.keystr(path)
    assert np.any(g != 0), jax.tree_util.keystr(path)
  assert np.max(np.abs(grads["input_conv"]["kernel"])) > 1e-6


def test_examples_do_not_interact_across_the_batch():
  net = model()
  params = perturbed(net.init(jax.random.key(0)))
  run = jax.jit(net.apply)
  x = normal((2, 16, 16, 3), 5)
  changed = x.copy()
  changed[1] = normal((16, 16, 3), 6)
  t = np.array([40, 40])
  y, y_changed = run(params, x, t), run(params, changed, t)
  np.testing.assert_allclose(y_changed[0], y[0], rtol=1e-6, atol=1e-6)
  assert np.max(np.abs(y_changed[1] - y[1])) > 1e-2


def test_widened_input_on_repeated_channels_equals_the_original():
  narrow, wide = model(in_channels=3), model(in_channels=6)
  params = perturbed(narrow.init(jax.random.key(0)))
  original_kernel = params["input_conv"]["kernel"].copy()
  widened = unet.widen_input_channels(params, 6)
  chex.assert_shape(widened["input_conv"]["kernel"], (3, 3, 6, BASE))
  np.testing.assert_array_equal(params["input_conv"]["kernel"], original_kernel)  # not modified
  chex.assert_trees_all_equal_shapes(widened, jax.eval_shape(wide.init, jax.random.key(0)))
  x, t = normal((2, 16, 16, 3), 7), np.array([5, 250])

  @jax.jit
  def run(params, widened):
    return narrow.apply(params, x, t), wide.apply(widened, jnp.concatenate([x, x], -1), t)

  y, y_wide = run(params, widened)
  assert np.std(y) > 1e-2
  np.testing.assert_allclose(y_wide, y, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="multiple"):
    unet.widen_input_channels(params, 4)


def test_sinusoidal_embedding_matches_a_hand_computation():
  t = np.array([0.0, 3.0, 250.5], np.float32)
  embedding = np.asarray(unet.sinusoidal_embedding(jnp.asarray(t), 8))
  chex.assert_shape(embedding, (3, 8))
  # dim 8: frequencies 10000^(-i/4) = 1, 0.1, 0.01, 0.001; cos block, then sin block.
  frequencies = [1.0, 0.1, 0.01, 0.001]
  expected = [math.cos(3.0 * f) for f in frequencies] + [math.sin(3.0 * f) for f in frequencies]
  np.testing.assert_allclose(embedding[1], expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(embedding[0], [1, 1, 1, 1, 0, 0, 0, 0], atol=1e-7)
  odd = np.asarray(unet.sinusoidal_embedding(jnp.array([7, 9]), 5, max_period=100.0))
  chex.assert_shape(odd, (2, 5))
  # dim 5: half 2, frequencies 100^0 and 100^(-1/2); the fifth column is padding.
  np.testing.assert_allclose(odd[0], [math.cos(7), math.cos(0.7), math.sin(7), math.sin(0.7), 0],
                             rtol=1e-5, atol=1e-6)


def test_parameter_count_is_stable():
  count = lambda net: functional.count_params(jax.eval_shape(net.init, jax.random.key(0)))
  assert count(model()) == 67_963
  assert count(model(num_embeddings=10, blocks_per_level=2)) == 98_595
  # All three agree with a layer-by-layer count by hand; the last is the default-sized model.
  default = functional.Functional(lambda rngs: unet.UNet(
      in_channels=6, out_channels=3, base_channels=32, channel_multipliers=(1, 2, 2),
      rngs=rngs))
  assert count(default) == 1_064_515
