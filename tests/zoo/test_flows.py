"""Flow layers: exact inverses, log-dets equal to the Jacobian's, identity at init, masks, dropout.

Test data and parameter noise come from NumPy and each check is one `jax.jit`: compiling
jax.random and many small eager ops would dominate the runtime of these tiny models.
"""
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import flows
from jaxlab.zoo import functional
from jaxlab.zoo import mlp


def normal(shape, seed, dtype=jnp.float64):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def perturbed(model, seed=0):
  """Init params plus N(0, 0.5^2) noise on every leaf: init is the identity, which tests nothing."""
  params = model.init(jax.random.key(seed))
  leaves, treedef = jax.tree.flatten(params)
  return jax.tree.unflatten(treedef, [leaf + 0.5 * normal(leaf.shape, seed + i, leaf.dtype)
                                      for i, leaf in enumerate(leaves)])


def mas(features, *, param_dtype=jnp.float64, **kwargs):
  return lambda rngs: flows.MaskedAutoregressiveSpline(
      features, hidden=6, num_bins=4, bound=3.0, param_dtype=param_dtype, rngs=rngs, **kwargs)


def coupling(features, transformed=None, *, param_dtype=jnp.float64):
  num_conditioning = features // 2 if transformed is None else features - sum(transformed)
  def make(rngs):
    conditioner = mlp.MLP([num_conditioning, 8, 5], activation="tanh", param_dtype=param_dtype,
                          rngs=rngs)
    return flows.AffineCoupling(features, conditioner, 5, transformed=transformed,
                                param_dtype=param_dtype, rngs=rngs)
  return make


LAYERS = {
    "mas_1": (1, mas(1)),
    "mas_3": (3, mas(3)),
    "coupling_4": (4, coupling(4)),
    "coupling_5_mask": (5, coupling(5, [True, False, True, True, False])),
    "permutation_5": (5, lambda rngs: flows.Permutation(5, seed=3)),
    "chain_mas": (3, lambda rngs: flows.Chain(
        [mas(3)(rngs), flows.Permutation(3, seed=1), mas(3)(rngs)])),
    "chain_coupling": (4, lambda rngs: flows.Chain(
        [coupling(4)(rngs), flows.Permutation(4, seed=2), coupling(4)(rngs)])),
}


def events(features, dtype=jnp.float64):
  """[2, 4, features]: two leading batch axes, values both inside and outside [-3, 3]."""
  x = 2.5 * normal((2, 4, features), seed=1, dtype=dtype)
  return x.at[0, 0].set(7.0).at[1, 3].set(-9.0).at[0, 1, 0].set(12.0)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_inverse_and_logdet_match_the_jacobian(name):
  features, factory = LAYERS[name]
  with jax.enable_x64(True):
    model = functional.Functional(factory)
    params = perturbed(model)

    @jax.jit
    def check(params, x):
      y, logdet = model.apply(params, x, method="forward")
      single = lambda event: model.apply(params, event, method="forward")[0]
      jacobians = jax.vmap(jax.jacfwd(single))(x.reshape(-1, features))
      return y, logdet, model.apply(params, y, method="inverse"), jnp.linalg.slogdet(jacobians)[1]

    x = events(features)
    y, logdet, back, jacobian_logdet = check(params, x)
    assert y.shape == x.shape and logdet.shape == x.shape[:-1]
    np.testing.assert_allclose(back, x, rtol=0, atol=1e-9)
    if name != "permutation_5":
      assert not np.allclose(y, x, atol=1e-3), "perturbed params should move points"
    np.testing.assert_allclose(logdet.reshape(-1), jacobian_logdet, rtol=1e-9, atol=1e-9)


IDENTITY_AT_INIT = {
    "mas_3": (3, mas(3, param_dtype=jnp.float32)),
    "coupling_4": (4, coupling(4, param_dtype=jnp.float32)),
    "coupling_5_mask": (5, coupling(5, [True, False, True, True, False],
                                    param_dtype=jnp.float32)),
    "chain": (4, lambda rngs: flows.Chain([
        flows.MaskedAutoregressiveSpline(4, rngs=rngs), coupling(4, param_dtype=jnp.float32)(rngs),
        flows.MaskedAutoregressiveSpline(4, rngs=rngs)])),
}


@pytest.mark.parametrize("name", sorted(IDENTITY_AT_INIT))
def test_trainable_layers_start_as_the_identity(name):
  features, factory = IDENTITY_AT_INIT[name]
  model = functional.Functional(factory)
  x = events(features, dtype=jnp.float32)
  y, logdet = jax.jit(lambda p, x: model.apply(p, x, method="forward"))(
      model.init(jax.random.key(0)), x)
  np.testing.assert_allclose(y, x, atol=1e-5)
  np.testing.assert_allclose(logdet, 0, atol=1e-5)


def random_spline_params(shape, num_bins, seed=0, dtype=jnp.float64):
  return (normal(shape + (num_bins,), seed, dtype), normal(shape + (num_bins,), seed + 1, dtype),
          normal(shape + (num_bins - 1,), seed + 2, dtype))


def test_spline_inverts_and_its_logdet_is_the_derivative():
  with jax.enable_x64(True):
    params = random_spline_params((6, 3), 5)
    x = jnp.linspace(-4.0, 4.0, 18, dtype=jnp.float64).reshape(6, 3)   # bound 2.5: some outside

    @jax.jit
    def check(x, params):
      y, logabsdet = flows.rational_quadratic_spline(x, *params, bound=2.5)
      back = flows.rational_quadratic_spline_inverse(y, *params, bound=2.5)
      event = lambda x_event, w, h, d: flows.rational_quadratic_spline(
          x_event, w, h, d, bound=2.5)[0]
      jacobians = jax.vmap(jax.jacfwd(event))(x, *params)   # [6, 3, 3], diagonal
      return y, logabsdet, back, jnp.linalg.slogdet(jacobians)[1]

    y, logabsdet, back, expected = check(x, params)
    np.testing.assert_allclose(back, x, rtol=0, atol=1e-9)
    np.testing.assert_allclose(logabsdet.sum(-1), expected, rtol=1e-10, atol=1e-10)
    assert not np.allclose(y, x, atol=1e-3)


def test_spline_is_the_identity_outside_monotone_inside_and_zero_params_are_identity():
  with jax.enable_x64(True):
    bound = 2.0
    params = random_spline_params((), 6, seed=1)
    zeros = tuple(jnp.zeros_like(p) for p in params)
    x = jnp.concatenate([jnp.linspace(-5.0, 5.0, 2001, dtype=jnp.float64),
                         jnp.array([-bound, bound])])
    spline = jax.jit(lambda x, params: flows.rational_quadratic_spline(x, *params, bound=bound))
    y, logabsdet = spline(x, params)
    outside = np.abs(np.asarray(x)) > bound
    np.testing.assert_array_equal(y[outside], x[outside])
    np.testing.assert_array_equal(logabsdet[outside], 0)
    assert np.all(np.diff(np.asarray(y[:-2])) > 0)
    np.testing.assert_allclose(y[-2:], [-bound, bound], atol=1e-12)   # the ends are fixed
    assert np.abs(np.asarray(y - x)[~outside]).max() > 0.05  # the spline bends inside

    y0, logabsdet0 = spline(x, zeros)
    np.testing.assert_allclose(y0, x, atol=1e-12)
    np.testing.assert_allclose(logabsdet0, 0, atol=1e-12)


def test_spline_gradients_are_finite_outside_and_on_the_boundary():
  params = random_spline_params((), 4, seed=2, dtype=jnp.float32)
  x = jnp.array([-30.0, -3.0, -1.0, 0.4, 1.0, 3.0, 1e6])

  @jax.jit
  def gradients(x, params):
    def loss(x, params):
      y, logabsdet = flows.rational_quadratic_spline(x, *params, bound=1.0)
      return jnp.sum(y**2 + logabsdet)
    inverse_sum = lambda y: flows.rational_quadratic_spline_inverse(y, *params, bound=1.0).sum()
    return jax.grad(loss, argnums=(0, 1))(x, params), jax.grad(inverse_sum)(x)

  (grad_x, grad_params), grad_inverse = gradients(x, params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves((grad_x, grad_params, grad_inverse)))
  tails = np.array([0, 1, 5])
  np.testing.assert_allclose(grad_x[tails], 2 * x[tails])  # identity tails: d(y^2)/dx
  np.testing.assert_array_equal(grad_inverse[tails], 1)


def test_spline_inverse_is_stable_for_sharp_splines():
  """Large raw parameters give bins with slopes ~1e-7: the quadratic's root must be taken in
  its cancellation-free form, and its discriminant, ~0 there, must not give a NaN gradient."""
  def round_trip_residual_in_ulps(y, params):
    x = flows.rational_quadratic_spline_inverse(y, *params, bound=8.0)
    y_again, logabsdet = flows.rational_quadratic_spline(x, *params, bound=8.0)
    # Rounding x alone moves y by ~eps |x| dy/dx, so measure the residual in those units.
    unit = jnp.finfo(y.dtype).eps * (jnp.abs(y) + jnp.abs(x) * jnp.exp(logabsdet))
    return jnp.abs(y_again - y) / unit

  def inverse_gradients(y, params):
    inverse_sum = lambda y, params: flows.rational_quadratic_spline_inverse(
        y, *params, bound=8.0).sum()
    return jax.grad(inverse_sum, argnums=(0, 1))(y, params)

  with jax.enable_x64(True):
    params = tuple(10 * p for p in random_spline_params((4000,), 8, seed=4))
    y = jnp.linspace(-8.0, 8.0, 4000, dtype=jnp.float64)
    assert jax.jit(round_trip_residual_in_ulps)(y, params).max() < 256  # unstable root: ~3000
  params32 = tuple(p.astype(jnp.float32) for p in params)
  x = jnp.linspace(-9.0, 9.0, 4000, dtype=jnp.float32)
  y32 = jax.jit(lambda x, params: flows.rational_quadratic_spline(x, *params, bound=8.0)[0])(
      x, params32)
  grads = jax.jit(inverse_gradients)(y32, params32)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_masked_autoregressive_jacobian_is_lower_triangular():
  with jax.enable_x64(True):
    model = functional.Functional(mas(4, depth=1, activation="tanh"))  # no dead ReLUs
    params = perturbed(model, seed=5)

    @jax.jit
    def jacobians(params, x):
      forward = lambda x: model.apply(params, x, method="forward")[0]
      conditioner = lambda x: jnp.concatenate(
          model.apply(params, x, method="spline_parameters"), axis=-1)
      return jax.jacfwd(forward)(x), jax.jacfwd(conditioner)(x)

    jacobian, conditioner_jacobian = jacobians(params, normal((4,), seed=2))
    np.testing.assert_array_equal(np.triu(jacobian, 1), 0)
    assert np.all(np.abs(np.diag(jacobian)) > 0)
    assert np.abs(np.tril(jacobian, -1)).max() > 1e-3   # not trivially diagonal

    # The conditioner itself: row i's spline parameters see only x_{<i} (row 0 sees nothing).
    dependence = np.abs(conditioner_jacobian).sum(axis=1)  # [features out, features in]
    np.testing.assert_array_equal(np.triu(dependence), 0)
    assert np.all(dependence[np.tril_indices(4, -1)] > 0)


def test_permutation_is_not_trainable_and_accepts_an_explicit_order():
  model = functional.Functional(lambda rngs: flows.Permutation(5, seed=7))
  assert jax.tree.leaves(model.init(jax.random.key(0))) == []
  assert jax.tree.leaves(model.rest)   # it lives in the non-trainable rest instead
  chain = functional.Functional(lambda rngs: flows.Chain(
      [mas(3, param_dtype=jnp.float32)(rngs), flows.Permutation(3)]))
  leaves = jax.tree.leaves(chain.init(jax.random.key(0)))
  assert leaves and all(jnp.issubdtype(leaf.dtype, jnp.floating) for leaf in leaves)

  explicit = flows.Permutation(3, permutation=[2, 0, 1])
  y, logdet = explicit.forward(jnp.array([[10.0, 20.0, 30.0]]))
  np.testing.assert_array_equal(y, [[30.0, 10.0, 20.0]])
  np.testing.assert_array_equal(logdet, [0.0])
  np.testing.assert_array_equal(explicit.inverse(y), [[10.0, 20.0, 30.0]])
  with pytest.raises(ValueError):
    flows.Permutation(3, permutation=[0, 0, 1])


def test_dropout_needs_an_rng_and_without_one_is_deterministic():
  model = functional.Functional(lambda rngs: flows.Chain(
      [mas(3, param_dtype=jnp.float32, dropout=0.5)(rngs), flows.Permutation(3)]))
  params = perturbed(model)
  forward = jax.jit(lambda p, x, rng=None: model.apply(p, x, method="forward", rng=rng))
  x = normal((8, 3), seed=3, dtype=jnp.float32)
  same = lambda a, b: all(np.array_equal(u, v) for u, v in zip(a, b))
  plain = forward(params, x)
  assert same(plain, forward(params, x))
  dropped = forward(params, x, jax.random.key(4))
  assert not np.allclose(dropped[0], plain[0], atol=1e-4)
  assert same(dropped, forward(params, x, jax.random.key(4)))
  assert not np.allclose(dropped[0], forward(params, x, jax.random.key(5))[0], atol=1e-4)


def test_layers_compose_with_jit_vmap_and_grad_through_functional():
  model = functional.Functional(lambda rngs: flows.Chain(
      [mas(3, param_dtype=jnp.float32)(rngs), flows.Permutation(3),
       coupling(3, param_dtype=jnp.float32)(rngs)]))
  params = perturbed(model)

  @jax.jit
  def grads_and_both_batchings(params, x):
    def negative_log_likelihood(params):
      z, logdet = model.apply(params, x, method="forward")
      return jnp.mean(0.5 * jnp.sum(z**2, axis=-1) - logdet)
    per_event = jax.vmap(lambda e: model.apply(params, e, method="forward"))(x)
    return jax.grad(negative_log_likelihood)(params), per_event, model.apply(
        params, x, method="forward")

  grads, per_event, batched = grads_and_both_batchings(params, normal((5, 3), 6, jnp.float32))
  assert jax.tree.structure(grads) == jax.tree.structure(params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))
  for a, b in zip(per_event, batched):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
