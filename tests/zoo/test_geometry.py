"""Geometry: quasi-metric axioms, monotone partial orders, finite gradients at 0, closed forms.

Test data and parameter noise come from NumPy and each model check is one `jax.jit`, as in
test_flows.py. Expected values of the closed-form geometries are computed independently in NumPy.
"""
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.zoo import functional
from jaxlab.zoo import geometry


def normal(shape, seed, scale=1.0):
  return jnp.asarray(scale * np.random.default_rng(seed).normal(size=shape), jnp.float32)


def perturbed(model, seed=0, scale=0.5):
  """Init params plus N(0, scale^2) noise on every leaf (weights, diagonals, biases, exponents)."""
  params = model.init(jax.random.key(seed))
  leaves, treedef = jax.tree.flatten(params)
  return jax.tree.unflatten(treedef, [leaf + normal(leaf.shape, seed + 100 + i, scale)
                                      for i, leaf in enumerate(leaves)])


def all_finite(tree):
  return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


def quasi_metric():
  return functional.Functional(lambda rngs: geometry.NeuralQuasiMetric(3, rngs=rngs))


def partial_order():
  return functional.Functional(lambda rngs: geometry.NeuralPartialOrder(2, rngs=rngs))


def test_quasi_metric_is_symmetric_non_negative_and_zero_on_the_diagonal():
  """d(x, y) = d(y, x) >= 0 and d(x, x) = 0, batched [B, D] -> [B], at init and perturbed."""
  model = quasi_metric()
  check = jax.jit(lambda params, x, y: (model.apply(params, x, y), model.apply(params, y, x),
                                        model.apply(params, x, x)))
  x, y = normal((64, 3), seed=1, scale=2.0), normal((64, 3), seed=2, scale=0.5)
  for params in (model.init(jax.random.key(0)), perturbed(model, 0), perturbed(model, 7)):
    forward, backward, diagonal = check(params, x, y)
    assert forward.shape == (64,) and diagonal.shape == (64,)
    np.testing.assert_allclose(forward, backward, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(forward) >= 0)
    assert np.all(np.asarray(forward) > 0)  # distinct random points: strictly positive
    np.testing.assert_array_equal(diagonal, np.zeros(64, np.float32))


def test_quasi_metric_keeps_leading_axes():
  """[2, 5, D] inputs give a [2, 5] distance, equal to the flattened batch's."""
  model = quasi_metric()
  params = perturbed(model, 3)
  x, y = normal((2, 5, 3), seed=4), normal((2, 5, 3), seed=5)
  d = jax.jit(model.apply)(params, x, y)
  assert d.shape == (2, 5)
  flat = jax.jit(model.apply)(params, x.reshape(10, 3), y.reshape(10, 3))
  np.testing.assert_allclose(d.reshape(10), flat, rtol=1e-6)


def test_partial_order_is_monotone():
  """u <= v coordinatewise => T(u) <= T(v) coordinatewise, at init and perturbed (per point)."""
  model = partial_order()
  # One point at a time: the batched call is covered by test_partial_order_batched_shape.
  apply = jax.jit(jax.vmap(model.apply, in_axes=(None, 0)))
  u = normal((256, 2), seed=11, scale=2.0)
  delta = jnp.abs(normal((256, 2), seed=12, scale=1.0))
  delta = delta.at[:64, 0].set(0.0).at[64:128, 1].set(0.0)  # moves along a single axis too
  v = u + delta
  # Negating every leaf is a valid parameter set too (weights and exponents go through |.|).
  flipped = jax.tree.map(jnp.negative, perturbed(model, 2))
  for params in (model.init(jax.random.key(0)), perturbed(model, 1), flipped):
    tu, tv = apply(params, u), apply(params, v)
    assert tu.shape == (256, 2)
    slack = 1e-5 * (1.0 + np.abs(np.asarray(tu)))
    assert np.all(np.asarray(tv) >= np.asarray(tu) - slack)
    # Not trivially constant: a strictly larger input moves some output.
    assert np.any(np.asarray(tv) > np.asarray(tu) + 1e-4)
    np.testing.assert_array_equal(geometry.precedes(tu, tv + slack), np.ones(256, bool))


def test_partial_order_batched_shape():
  """T of a batch [B, T] is [B, T] and matches T applied point by point."""
  model = partial_order()
  params = perturbed(model, 1)
  t = normal((6, 2), seed=13)
  batched = jax.jit(model.apply)(params, t)
  single = jax.jit(jax.vmap(model.apply, in_axes=(None, 0)))(params, t)
  assert batched.shape == (6, 2)
  np.testing.assert_allclose(batched, single, rtol=1e-5)


def test_power_gradients_are_finite_at_zero():
  """d/dx and d/dp of signed_power and safe_abs_power are finite at x = 0, for p = 0.5 and 1."""
  x = jnp.asarray([0.0, 0.0, 0.3, -0.7, 2.0, -0.0], jnp.float32)
  for fn in (geometry.signed_power, geometry.safe_abs_power):
    check = jax.jit(lambda x, p, fn=fn: (fn(x, p), jax.grad(lambda x, p: jnp.sum(fn(x, p)),
                                                            argnums=(0, 1))(x, p)))
    for p in (0.5, 1.0):
      value, (grad_x, grad_p) = check(x, jnp.asarray(p, jnp.float32))
      assert all_finite((grad_x, grad_p)), (fn.__name__, p, grad_x, grad_p)
      np.testing.assert_array_equal(value[np.asarray([0, 1, 5])], np.zeros(3, np.float32))


def test_safe_abs_power_matches_the_power_and_its_gradient_off_zero():
  """|x|^p and d/dx = p |x|^(p-1) sign(x), d/dp = |x|^p log|x|, for x != 0; signed_power is odd."""
  x = np.asarray([0.01, 0.3, -0.7, 1.0, 2.5, -4.0], np.float32)
  @jax.jit
  def check(x, p):
    grads = jax.vmap(jax.grad(geometry.safe_abs_power, argnums=(0, 1)), in_axes=(0, None))(x, p)
    return geometry.safe_abs_power(x, p), grads, geometry.signed_power(x, p)

  for p in (0.5, 1.0, 1.7):
    value, (grad_x, grad_p), signed = check(jnp.asarray(x), jnp.asarray(p, jnp.float32))
    np.testing.assert_allclose(value, np.abs(x) ** p, rtol=1e-5)
    np.testing.assert_allclose(grad_x, p * np.abs(x) ** (p - 1) * np.sign(x), rtol=1e-5)
    np.testing.assert_allclose(grad_p, np.abs(x) ** p * np.log(np.abs(x)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(signed, np.sign(x) * np.abs(x) ** p, rtol=1e-5)


def test_quasi_metric_gradients_are_finite_on_the_diagonal():
  """At x = y (u_0 = 0 exactly) the parameter gradient is finite (and 0: d = 0 for all params);
  with some equal coordinates it is finite too, as is the gradient in x."""
  model = quasi_metric()
  x = normal((8, 3), seed=21)
  y = x.at[:, 1].set(normal((8,), seed=22))  # coordinates 0 and 2 coincide
  x = x.at[0].set(0.0)
  y = y.at[0].set(0.0)

  @jax.jit
  def grads(params):
    loss = lambda params, a, b: jnp.sum(model.apply(params, a, b))
    return (jax.grad(loss)(params, x, x), jax.grad(loss, argnums=(0, 1))(params, x, y))

  for params in (model.init(jax.random.key(0)), perturbed(model, 4)):
    diagonal, (partial, dx) = grads(params)
    assert all_finite(diagonal) and all_finite(partial) and all_finite(dx)
    for leaf in jax.tree.leaves(diagonal):
      np.testing.assert_array_equal(leaf, np.zeros_like(leaf))
    assert any(np.any(np.asarray(leaf) != 0) for leaf in jax.tree.leaves(partial))


def test_partial_order_gradients_are_finite_at_zero():
  """Parameter and input gradients of T at t = 0 (where |t|^0.5 has an infinite slope) are finite."""
  model = partial_order()

  @jax.jit
  def grads(params):
    loss = lambda params, t: jnp.sum(model.apply(params, t))
    return jax.grad(loss, argnums=(0, 1))(params, jnp.zeros((2,), jnp.float32))

  for params in (model.init(jax.random.key(0)), perturbed(model, 5)):
    assert all_finite(grads(params))


def test_fractal_activation_exponents():
  """Identity-like at init; with s = 1.5, l = 2 it is sign(x)|x|^1.5 inside (-1, 1), ^2 outside."""
  init = geometry.FractalActivation()
  small, large = init.exponents()
  np.testing.assert_allclose([small, large], [1.0, 1.0], atol=2e-3)
  x = jnp.asarray([-3.0, -0.5, 0.0, 0.2, 0.9, 1.0, 4.0], jnp.float32)
  np.testing.assert_allclose(init(x), x, rtol=5e-3, atol=1e-6)

  act = geometry.FractalActivation(small_init=0.5, large_init=1.0)
  small, large = act.exponents()
  np.testing.assert_allclose([small, large], [1.5, 2.0], rtol=1e-6)
  np.testing.assert_allclose(act(jnp.asarray(0.25)), 0.125, rtol=1e-6)  # 0.25^1.5
  np.testing.assert_allclose(act(jnp.asarray(-2.0)), -4.0, rtol=1e-6)   # -(2^2)
  np.testing.assert_allclose(act(jnp.asarray(-0.25)), -0.125, rtol=1e-6)
  np.testing.assert_allclose(act(jnp.asarray(3.0)), 9.0, rtol=1e-6)
  np.testing.assert_allclose(act(jnp.asarray(1.0)), 1.0, rtol=1e-6)  # continuous at |x| = 1
  # Negative raw exponents count through |.|: the same function.
  flipped = geometry.FractalActivation(small_init=-0.5, large_init=-1.0)
  np.testing.assert_allclose(flipped(x), act(x), rtol=1e-6)


def test_positive_linear_kernel_is_non_negative():
  """kernel = |W~| + |lambda| I (rectangular), >= 0 even for negative raw weights; y = x K + b."""
  layer = geometry.PositiveLinear(2, 3, use_bias=True, rngs=nnx.Rngs(0))
  raw = np.asarray([[-1.0, 0.5, -0.25], [2.0, -3.0, 0.0]], np.float32)
  layer.raw_weight[...] = jnp.asarray(raw)
  layer.diagonal[...] = jnp.asarray(-0.3, jnp.float32)
  bias = np.asarray([0.1, -0.2, 0.3], np.float32)
  layer.bias[...] = jnp.asarray(bias)
  expected = np.asarray([[1.3, 0.5, 0.25], [2.0, 3.3, 0.0]], np.float32)
  kernel = layer.kernel()
  assert kernel.shape == (2, 3)
  assert np.all(np.asarray(kernel) >= 0)
  np.testing.assert_allclose(kernel, expected, rtol=1e-6)
  x = np.asarray([0.5, -2.0], np.float32)
  np.testing.assert_allclose(layer(jnp.asarray(x)), x @ expected + bias, rtol=1e-6)

  init = geometry.PositiveLinear(4, 3, rngs=nnx.Rngs(1))
  kernel = np.asarray(init.kernel())
  assert np.all(kernel >= 0) and init.bias is None
  np.testing.assert_allclose(np.diag(kernel) - np.diag(np.abs(np.asarray(init.raw_weight[...]))),
                             0.1, rtol=1e-5)


def test_minkowski_interval():
  """||s_a - s_b||^2 - ||t_a - t_b||^2 by hand; timelike separations are negative; batched."""
  value = geometry.minkowski_interval(jnp.asarray([1.0, 2.0]), jnp.asarray([0.5]),
                                      jnp.asarray([0.0, 0.0]), jnp.asarray([2.0]))
  np.testing.assert_allclose(value, 5.0 - 1.5**2, rtol=1e-6)  # 2.75
  timelike = geometry.minkowski_interval(jnp.asarray([0.0, 1.0]), jnp.asarray([0.0, 0.0]),
                                         jnp.asarray([0.0, 1.5]), jnp.asarray([1.0, -1.0]))
  np.testing.assert_allclose(timelike, 0.25 - 2.0, rtol=1e-6)
  assert timelike < 0
  sa, ta, sb, tb = (np.asarray(normal((5, d), seed=30 + i)) for i, d in enumerate((3, 2, 3, 2)))
  batched = geometry.minkowski_interval(*map(jnp.asarray, (sa, ta, sb, tb)))
  assert batched.shape == (5,)
  np.testing.assert_allclose(
      batched, ((sa - sb) ** 2).sum(-1) - ((ta - tb) ** 2).sum(-1), rtol=1e-5, atol=1e-6)


def de_sitter_by_hand(space_a, time_a, space_b, time_b, radius=1.0):
  """NumPy (float64): lift s -> sqrt(r^2 + |t|^2) s/|s|, <a,b> = s_a.s_b - t_a.t_b, then
  r^2 acosh(<a,b>/r^2)^2 if <a,b> > r^2 else 2 (<a,b> - r^2)."""
  lift = lambda s, t: np.sqrt(radius**2 + t @ t) * s / np.linalg.norm(s)
  a, b = (np.asarray(v, np.float64) for v in (space_a, space_b))
  ta, tb = (np.asarray(v, np.float64) for v in (time_a, time_b))
  inner = lift(a, ta) @ lift(b, tb) - ta @ tb
  r2 = radius**2
  return (r2 * np.arccosh(inner / r2) ** 2 if inner > r2 else 2.0 * (inner - r2)), inner


def test_de_sitter_distance_matches_hand_computation():
  """Timelike/null case (<a,b> = 0 -> -2) and a spacelike one (<a,b> ~ 2.99 -> acosh^2)."""
  cases = [
      ([1.0, 0.0], [0.0], [0.0, 1.0], [0.0], 1.0),
      ([1.0, 0.0], [1.0], [1.0, 0.1], [-1.0], 1.0),
      ([3.0, 4.0], [0.5, -1.0], [1.0, 1.0], [2.0, 0.0], 1.0),
      ([1.0, 0.0], [1.0], [-1.0, 0.2], [-1.0], 2.0),
      ([2.0, 1.0], [0.5], [-1.0, 3.0], [0.0], 2.0),
      ([1.0, 0.0], [2.0], [1.0, 0.3], [-2.0], 2.0),
  ]
  inners = []
  for space_a, time_a, space_b, time_b, radius in cases:
    expected, inner = de_sitter_by_hand(space_a, time_a, space_b, time_b, radius)
    inners.append(inner / radius**2)
    value = geometry.de_sitter_distance(*map(jnp.asarray, (space_a, time_a, space_b, time_b)),
                                        radius=radius)
    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(de_sitter_by_hand(*cases[0][:4])[0], -2.0)
  assert inners[1] > 1 and de_sitter_by_hand(*cases[1][:4])[0] > 0  # a spacelike case is covered
  assert any(i < 1 for i in inners[2:]) and any(i > 1 for i in inners[2:])
  assert inners[-1] > 1 and cases[-1][-1] != 1  # spacelike with radius != 1
  # The lifted points lie on ||s||^2 - ||t||^2 = r^2.
  space, time = normal((4, 3), seed=40), normal((4, 2), seed=41)
  lifted = geometry.de_sitter_point(space, time, radius=2.0)
  np.testing.assert_allclose(jnp.sum(lifted**2, -1) - jnp.sum(time**2, -1), 4.0, rtol=1e-5)


def test_de_sitter_distance_gradient_is_finite_near_inner_one():
  """At identical points (<a,b> = 1 up to rounding, where acosh' blows up) and just around them,
  the gradient in all four inputs is finite; the distance there is ~0."""
  space, time = normal((16, 3), seed=50), normal((16, 2), seed=51)
  time = time.at[0].set(0.0)
  loss = lambda sa, ta, sb, tb: jnp.sum(geometry.de_sitter_distance(sa, ta, sb, tb))
  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  np.testing.assert_allclose(geometry.de_sitter_distance(space, time, space, time),
                             np.zeros(16), atol=1e-4)
  assert all_finite(grad(space, time, space, time))
  for eps in (1e-6, 1e-4):
    assert all_finite(grad(space, time, space + eps * normal((16, 3), seed=52), time))
    assert all_finite(grad(space, time, space, time + eps * normal((16, 2), seed=53)))


def test_precedes():
  """The product order: every time coordinate <=; batched."""
  assert bool(geometry.precedes(jnp.asarray([0.0, 1.0]), jnp.asarray([1.0, 1.0])))
  assert not bool(geometry.precedes(jnp.asarray([0.0, 2.0]), jnp.asarray([1.0, 1.0])))
  a = jnp.asarray([[0.0, 1.0], [0.0, 2.0], [1.0, 1.0], [2.0, 0.0]])
  b = jnp.asarray([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
  np.testing.assert_array_equal(geometry.precedes(a, b), [True, False, True, False])
