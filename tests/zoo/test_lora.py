"""zoo LoRA: adapters leave a network unchanged at init, add exactly scale * A @ B, and train."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import functional
from jaxlab.zoo import lora
from jaxlab.zoo import mlp
from jaxlab.zoo import unet


def small_unet():
  return functional.Functional(lambda rngs: unet.UNet(
      in_channels=3, out_channels=3, base_channels=8, channel_multipliers=(1,),
      blocks_per_level=1, attention_at_lowest=False, groups=4, rngs=rngs))


def test_adapters_cover_dense_and_conv_kernels_and_start_as_the_identity():
  model = small_unet()
  params = model.init(jax.random.key(0))
  adapters = lora.init(params, rank=2, key=jax.random.key(1))
  shapes = {name: params_leaf.shape for name, params_leaf in (
      (lora.kernel_name(lora._path_names(path)), leaf)  # pylint: disable=protected-access
      for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0])}
  assert any(len(shapes[name]) == 4 for name in adapters)     # conv kernels
  assert any(len(shapes[name]) == 2 for name in adapters)     # dense kernels (time embedding)
  assert all(isinstance(name, str) for name in adapters)
  merged = lora.merge(params, adapters, scale=4.0)
  x = jax.random.normal(jax.random.key(2), (2, 8, 8, 3))
  t = jnp.array([3, 7])
  apply = jax.jit(model.apply)
  np.testing.assert_array_equal(apply(merged, x, t), apply(params, x, t))


def test_merge_adds_scale_times_the_low_rank_product():
  params = {"dense": {"kernel": jnp.ones((6, 4)), "bias": jnp.zeros(4)},
            "conv": {"kernel": jnp.ones((3, 3, 2, 5))}}
  adapters = lora.init(params, rank=2, key=jax.random.key(0))
  assert set(adapters) == {"dense/kernel", "conv/kernel"}
  assert adapters["conv/kernel"]["a"].shape == (18, 2)
  adapters = jax.tree.map(lambda x: x + 0.5, adapters)
  merged = lora.merge(params, adapters, scale=0.25)
  expected = params["conv"]["kernel"] + 0.25 * (
      adapters["conv/kernel"]["a"] @ adapters["conv/kernel"]["b"]).reshape(3, 3, 2, 5)
  np.testing.assert_allclose(merged["conv"]["kernel"], expected, rtol=1e-6)
  np.testing.assert_array_equal(merged["dense"]["bias"], params["dense"]["bias"])
  assert lora.count(adapters) == 6 * 2 + 2 * 4 + 18 * 2 + 2 * 5


def test_gradient_reaches_the_adapters_and_one_step_changes_the_output():
  model = functional.Functional(lambda rngs: mlp.MLP([4, 16, 3], rngs=rngs))
  params = model.init(jax.random.key(0))
  adapters = lora.init(params, rank=2, key=jax.random.key(1))
  x = jax.random.normal(jax.random.key(2), (8, 4))

  def loss(adapters):
    return jnp.mean((model.apply(lora.merge(params, adapters, 1.0), x) - 1.0) ** 2)
  loss = jax.jit(loss)
  grads = jax.jit(jax.grad(loss))(adapters)
  # With B = 0 the gradient flows to every B (through A), not yet to A.
  assert all(float(jnp.abs(g["b"]).max()) > 0 for g in grads.values())
  assert all(float(jnp.abs(g["a"]).max()) == 0 for g in grads.values())
  stepped = jax.tree.map(lambda p, g: p - 0.1 * g, adapters, grads)
  assert float(loss(stepped)) < float(loss(adapters))


def test_bad_rank_and_foreign_adapters_fail_clearly():
  params = {"dense": {"kernel": jnp.ones((6, 4))}}
  with pytest.raises(ValueError, match="rank 5 exceeds"):
    lora.init(params, rank=5, key=jax.random.key(0))
  with pytest.raises(ValueError, match="at least 1"):
    lora.init(params, rank=0, key=jax.random.key(0))
  with pytest.raises(ValueError, match="matches the LoRA filter"):
    lora.init({"bias": jnp.ones(3)}, rank=1, key=jax.random.key(0))
  adapters = lora.init(params, rank=2, key=jax.random.key(0))
  with pytest.raises(ValueError, match="do not have"):
    lora.merge({"other": {"kernel": jnp.ones((6, 4))}}, adapters, 1.0)


def test_cap_rank_gives_thin_kernels_a_full_rank_adapter():
  params = {"thin": {"kernel": jnp.ones((2, 16))}, "wide": {"kernel": jnp.ones((16, 16))}}
  adapters = lora.init(params, rank=4, key=jax.random.key(0), cap_rank=True)
  assert adapters["thin/kernel"]["a"].shape == (2, 2)
  assert adapters["thin/kernel"]["b"].shape == (2, 16)
  assert adapters["wide/kernel"]["a"].shape == (16, 4)
