"""Token flows on [B, N, C]: exact inverses, log-dets equal to the Jacobian's, identity at init,
the spatial split patterns, frozen permutations and gradients through `Functional`.

Tiny sizes (N = 4 tokens on a 2 x 2 grid, C = 4 channels, one-block conditioners); data and
parameter noise come from NumPy and each check is one `jax.jit`, as in test_flows.py.
"""
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import flows
from jaxlab.zoo import functional

NUM_TOKENS, CHANNELS, BATCH = 4, 4, 3
CONDITIONER = dict(width=8, depth=1, num_heads=2)


def normal(shape, seed, dtype=jnp.float64):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def perturbed(model, seed=0):
  """Init params plus N(0, 0.3^2) noise on every leaf: init is the identity, which tests nothing."""
  params = model.init(jax.random.key(seed))
  leaves, treedef = jax.tree.flatten(params)
  return jax.tree.unflatten(treedef, [leaf + 0.3 * normal(leaf.shape, seed + i, leaf.dtype)
                                      for i, leaf in enumerate(leaves)])


def tokens(dtype=jnp.float64, seed=1):
  return normal((BATCH, NUM_TOKENS, CHANNELS), seed, dtype)


def affine_vit(param_dtype):
  """The generic AffineCoupling over channels with a token-mixing conditioner."""
  def make(rngs):
    conditioner = flows.ViTConditioner(CHANNELS // 2, 6, NUM_TOKENS, param_dtype=param_dtype,
                                       rngs=rngs, **CONDITIONER)
    return flows.AffineCoupling(CHANNELS, conditioner, 6, param_dtype=param_dtype, rngs=rngs)
  return make


def channel(param_dtype):
  return lambda rngs: flows.ChannelCoupling(NUM_TOKENS, CHANNELS, seed=3,
                                            param_dtype=param_dtype, rngs=rngs, **CONDITIONER)


def token_split(pattern):
  return lambda param_dtype: lambda rngs: flows.TokenSplitCoupling(
      NUM_TOKENS, CHANNELS, pattern=pattern, param_dtype=param_dtype, rngs=rngs, **CONDITIONER)


def jet(param_dtype):
  # channels, spatial (checkerboard), channels, spatial (checkerboard-inv).
  return lambda rngs: flows.Jet(
      NUM_TOKENS, CHANNELS, depth=4, kinds=("channels", "spatial"), width=8,
      conditioner_depth=1, num_heads=2, seed=1, param_dtype=param_dtype, rngs=rngs)


LAYERS = {"affine_vit": affine_vit, "channel": channel, "jet": jet,
          **{f"token_{p}": token_split(p) for p in flows.SPATIAL_PATTERNS}}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_inverse_and_per_example_logdet_match_the_jacobian(name):
  with jax.enable_x64(True):
    model = functional.Functional(LAYERS[name](jnp.float64))
    params = perturbed(model)

    @jax.jit
    def check(params, x):
      y, logdet = model.apply(params, x, method="forward")
      # One example is one event: flatten its [N, C] to N*C for the Jacobian.
      single = lambda flat: model.apply(params, flat.reshape(1, NUM_TOKENS, CHANNELS),
                                        method="forward")[0].reshape(-1)
      jacobians = jax.vmap(jax.jacfwd(single))(x.reshape(BATCH, -1))
      return y, logdet, model.apply(params, y, method="inverse"), jnp.linalg.slogdet(jacobians)

    x = tokens()
    y, logdet, back, (sign, jacobian_logdet) = check(params, x)
    assert y.shape == x.shape
    if name == "affine_vit":   # per-token terms, meaningful only summed over tokens
      assert logdet.shape == (BATCH, NUM_TOKENS)
      logdet = logdet.sum(-1)
    assert logdet.shape == (BATCH,)
    np.testing.assert_allclose(back, x, rtol=0, atol=1e-9)
    assert np.all(sign != 0)
    assert not np.allclose(y, x, atol=1e-3), "perturbed params should move points"
    np.testing.assert_allclose(logdet, jacobian_logdet, rtol=1e-9, atol=1e-9)
    if name.startswith("token_"):   # the conditioning half passes through, the other moves
      order = flows.token_split_order(NUM_TOKENS, name.removeprefix("token_"))
      first, second = order[:NUM_TOKENS // 2], order[NUM_TOKENS // 2:]
      np.testing.assert_array_equal(y[:, first], x[:, first])
      assert np.all(np.abs(np.asarray(y - x)[:, second]).max(axis=-1) > 1e-3)


def test_every_layer_and_jet_start_as_the_identity():
  models = [functional.Functional(factory(jnp.float32)) for factory in LAYERS.values()]

  @jax.jit
  def forward_all(params, x):
    return [model.apply(p, x, method="forward") for model, p in zip(models, params)]

  x = tokens(jnp.float32)
  outputs = forward_all([model.init(jax.random.key(0)) for model in models], x)
  for name, (y, logdet) in zip(LAYERS, outputs):
    np.testing.assert_allclose(y, x, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(logdet, 0, atol=1e-6, err_msg=name)


def test_spatial_patterns_split_the_grid_as_named():
  side = 4
  rows, cols = np.divmod(np.arange(side * side), side)
  first_halves = {"checkerboard": (rows + cols) % 2 == 0, "vstripes": cols % 2 == 0,
                  "hstripes": rows % 2 == 0}
  for pattern in flows.SPATIAL_PATTERNS:
    order = flows.token_split_order(side * side, pattern)
    assert sorted(order.tolist()) == list(range(side * side)), pattern
    expected = first_halves[pattern.removesuffix("-inv")]
    if pattern.endswith("-inv"):
      expected = ~expected
    first, second = order[:side * side // 2], order[side * side // 2:]
    assert set(first.tolist()) == set(np.flatnonzero(expected).tolist()), pattern
    assert set(second.tolist()) == set(np.flatnonzero(~expected).tolist()), pattern
  # A 2 x 2 grid spelled out: tokens 0 1 / 2 3.
  np.testing.assert_array_equal(flows.token_split_order(4, "checkerboard"), [0, 3, 1, 2])
  np.testing.assert_array_equal(flows.token_split_order(4, "vstripes-inv"), [1, 3, 0, 2])
  np.testing.assert_array_equal(flows.token_split_order(4, "hstripes"), [0, 1, 2, 3])
  for bad_tokens, bad_pattern in [(9, "checkerboard"), (8, "vstripes"), (4, "diagonal")]:
    with pytest.raises(ValueError):
      flows.token_split_order(bad_tokens, bad_pattern)
  with pytest.raises(ValueError):   # odd channels cannot be reshaped to C/2
    flows.TokenSplitCoupling(4, 3, pattern="checkerboard", rngs=nnx.Rngs(0), **CONDITIONER)


def test_permutations_are_frozen_buffers_and_conditioners_get_gradients():
  model = functional.Functional(jet(jnp.float32))
  params = perturbed(model)
  assert all(jnp.issubdtype(leaf.dtype, jnp.floating) for leaf in jax.tree.leaves(params))
  frozen = [leaf for leaf in jax.tree.leaves(model.rest)
            if jnp.issubdtype(leaf.dtype, jnp.integer)]
  assert len(frozen) == 2 * 4   # an order and its inverse for each of the 4 layers
  module = model.module(params)
  spatial = [layer for layer in module.layers if isinstance(layer, flows.TokenSplitCoupling)]
  assert [layer.pattern for layer in spatial] == ["checkerboard", "checkerboard-inv"]
  for layer in spatial:
    np.testing.assert_array_equal(layer.order[...],
                                  flows.token_split_order(NUM_TOKENS, layer.pattern))
  # Channel layers split the channels differently (checked on 8 channels: 4 leave too few orders).
  wide = functional.Functional(lambda rngs: flows.Jet(
      NUM_TOKENS, 8, depth=3, width=8, conditioner_depth=0, num_heads=1, rngs=rngs))
  orders = [tuple(layer.permutation.permutation[...].tolist())
            for layer in wide.module(wide.init(jax.random.key(0))).layers]
  assert len(set(orders)) == 3

  @jax.jit
  def grads(params, x):
    def negative_log_likelihood(params):
      z, logdet = model.apply(params, x, method="forward")
      return jnp.mean(0.5 * jnp.sum(z**2, axis=(1, 2)) - logdet)
    return jax.grad(negative_log_likelihood)(params)

  g = grads(params, tokens(jnp.float32))
  assert jax.tree.structure(g) == jax.tree.structure(params)
  flat = jax.tree_util.tree_flatten_with_path(g)[0]
  assert all(np.isfinite(leaf).all() for _, leaf in flat)
  conditioner_leaves = [(jax.tree_util.keystr(path), leaf) for path, leaf in flat
                        if "conditioner" in jax.tree_util.keystr(path)]
  assert len(conditioner_leaves) > 10
  for path, leaf in conditioner_leaves:
    assert np.abs(leaf).max() > 0, path
