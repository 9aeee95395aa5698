"""The equivariant zoo: pairs, radial bases, harmonics, the grouped CG product, vector layers."""
import math

import e3nn_jax as e3nn
from e3nn_jax import legacy as e3nn_legacy
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import equivariant as eq


def random_orthogonal(seed: int, reflect: bool = True) -> np.ndarray:
  q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
  q = q * np.sign(np.diag(r))[None, :]
  if (np.linalg.det(q) > 0) == reflect:
    q = -q
  return q


def rotate_features(vectors, matrix):
  """[..., 8, C] features transformed by an O(3) matrix."""
  return jnp.einsum("ij,...jc->...ic", eq.rotation_matrix(jnp.asarray(matrix)), vectors)


def test_spherical_harmonics_equal_the_official_hand_written_basis():
  units = np.random.default_rng(0).normal(size=(64, 3))
  units /= np.linalg.norm(units, axis=-1, keepdims=True)
  x, y, z = units.T
  s3 = math.sqrt(3.0)
  official = np.stack([x, y, z, s3 * x * z, s3 * x * y, y ** 2 - 0.5 * (x ** 2 + z ** 2),
                       s3 * y * z, s3 / 2 * (z ** 2 - x ** 2)], axis=-1)
  np.testing.assert_allclose(eq.spherical_harmonics(jnp.asarray(units, jnp.float32)), official,
                             atol=2e-7)
  assert np.all(np.asarray(eq.spherical_harmonics(jnp.zeros((2, 3)))) == 0)


def test_harmonics_transform_with_the_irreps_matrix():
  units = jax.random.normal(jax.random.key(0), (16, 3))
  units = units / jnp.linalg.norm(units, axis=-1, keepdims=True)
  q = random_orthogonal(1)
  rotated = eq.spherical_harmonics(units @ jnp.asarray(q, jnp.float32).T)
  expected = eq.spherical_harmonics(units) @ eq.rotation_matrix(jnp.asarray(q)).T
  np.testing.assert_allclose(rotated, expected, atol=1e-5)


@pytest.mark.parametrize("groups,edges", [(2, 3), (1, 4), (4, 2)])
def test_grouped_contraction_equals_the_e3nn_reference(groups, edges):
  keys = jax.random.split(jax.random.key(groups * 10 + edges), 3)
  weights = jax.random.normal(keys[0], (groups, eq.tp_weight_count(edges)))
  x1 = jax.random.normal(keys[1], (2, 5, 8, groups * edges))
  x2 = jax.random.normal(keys[2], (2, 5, 8, groups * edges))
  fast = eq.grouped_tp(weights, x1, x2, groups, edges)
  reference = eq.grouped_tp_reference(weights, x1.reshape(10, 8, -1), x2.reshape(10, 8, -1),
                                      groups, edges).reshape(fast.shape)
  np.testing.assert_allclose(fast, reference, atol=1e-5 * float(jnp.max(jnp.abs(reference))))


def test_tp_has_the_four_parity_allowed_paths():
  assert [(l1, l2, l3) for l1, l2, l3, _ in eq.tp_paths(3)] == [(1, 1, 2), (1, 2, 1), (2, 1, 1),
                                                                (2, 2, 2)]
  assert eq.tp_weight_count(8) == 2048


def test_one_group_is_the_dense_fully_connected_product():
  """G = 1: one e3nn fully connected product over all channels, in e3nn's own layout."""
  edges = 4
  module = eq.GroupedTensorProduct(1, edges, rngs=nnx.Rngs(0))
  keys = jax.random.split(jax.random.key(3), 2)
  x1 = jax.random.normal(keys[0], (3, 8, edges))
  x2 = jax.random.normal(keys[1], (3, 8, edges))
  irreps = f"{edges}x1o+{edges}x2e"
  tp = e3nn_legacy.FunctionalFullyConnectedTensorProduct(irreps, irreps, irreps)

  def to_irreps(x):   # [8, E] components first -> e3nn mul-major [E 3 + E 5]
    return jnp.concatenate([x[:3].T.reshape(-1), x[3:].T.reshape(-1)])

  weight = module.weight[...][0, 0]
  for n in range(3):
    dense = tp.left_right(weight, e3nn.IrrepsArray(irreps, to_irreps(x1[n])),
                          e3nn.IrrepsArray(irreps, to_irreps(x2[n]))).array
    np.testing.assert_allclose(to_irreps(module(x1, x2)[n]), dense, atol=1e-5)


def test_grouped_product_initialisation_is_xavier_over_1_g_numel():
  module = eq.GroupedTensorProduct(8, 2, rngs=nnx.Rngs(0))
  numel = eq.tp_weight_count(2)
  bound = math.sqrt(6.0 / (8 * numel + numel))
  weight = np.asarray(module.weight[...])
  assert weight.shape == (1, 8, numel)
  assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.8 * bound


def test_vector_modules_commute_with_rotations_and_reflections():
  rngs = nnx.Rngs(0)
  channels, groups = 8, 2
  keys = jax.random.split(jax.random.key(4), 4)
  x = jax.random.normal(keys[0], (5, channels))
  v1 = jax.random.normal(keys[1], (5, 8, channels))
  v2 = jax.random.normal(keys[2], (5, 8, channels))
  direction = eq.spherical_harmonics(jax.random.normal(keys[3], (5, 3)) / 1.7)
  tp = eq.GroupedTensorProduct(groups, channels // groups, rngs=rngs)
  linear = eq.VectorLinear(channels, 3, rngs=rngs)
  gated = eq.GatedEquivariantBlock(channels, 4, scalar_activation=True, rngs=rngs)
  norms = [eq.VecLayerNorm(channels, kind) for kind in ("none", "max_min", "rms")]
  for reflect in (False, True):
    q = random_orthogonal(5, reflect)
    r = lambda v: rotate_features(v, q)  # noqa: E731
    np.testing.assert_allclose(tp(r(v1), r(v2)), r(tp(v1, v2)), atol=1e-5)
    np.testing.assert_allclose(linear(r(v1)), r(linear(v1)), atol=1e-5)
    # The direction is an 8-vector of harmonics: it rotates with the same matrix.
    d_rot = direction @ eq.rotation_matrix(jnp.asarray(q)).T
    np.testing.assert_allclose(eq.vector_rejection(r(v1), d_rot),
                               r(eq.vector_rejection(v1, direction)), atol=1e-5)
    x_out, v_out = gated(x, v1)
    x_rot, v_rot = gated(x, r(v1))
    np.testing.assert_allclose(x_rot, x_out, atol=1e-5)
    np.testing.assert_allclose(v_rot, r(v_out), atol=1e-5)
    for norm in norms:
      np.testing.assert_allclose(norm(r(v1)), r(norm(v1)), atol=1e-5)


def test_rejection_removes_the_component_along_a_direction():
  v = jax.random.normal(jax.random.key(6), (4, 8, 3))
  d = jax.random.normal(jax.random.key(7), (4, 8))
  d = d / jnp.linalg.norm(d, axis=-1, keepdims=True)
  rejected = eq.vector_rejection(v, d)
  np.testing.assert_allclose(jnp.einsum("nmc,nm->nc", rejected, d), 0.0, atol=1e-5)


def test_neighbour_mask_cutoff_self_pairs_padding_and_rank():
  positions = jnp.asarray([[[0.0, 0, 0], [1.0, 0, 0], [2.5, 0, 0], [9.0, 0, 0]]])
  atom_mask = jnp.asarray([[True, True, True, False]])
  mask = np.asarray(eq.neighbour_mask(positions, atom_mask, cutoff=2.0))[0]
  expected = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(mask, expected)
  no_self = np.asarray(eq.neighbour_mask(positions, atom_mask, 2.0, self_pairs=False))[0]
  np.testing.assert_array_equal(no_self, expected & ~np.eye(4, dtype=bool))
  # Two neighbours each (the self pair ranks first): atom 1 keeps itself and the nearer atom 0.
  capped = np.asarray(eq.neighbour_mask(positions, atom_mask, 5.0, max_neighbours=2))[0]
  np.testing.assert_array_equal(capped[1], [True, True, False, False])
  assert capped.sum(axis=1).max() == 2


def test_pair_distances_are_zero_with_finite_gradients_on_self_pairs():
  positions = jax.random.normal(jax.random.key(8), (1, 4, 3))
  mask = eq.neighbour_mask(positions, jnp.ones((1, 4), bool), cutoff=10.0)

  def energy(p):
    distances, units = eq.pair_distances(p, mask)
    return jnp.sum(eq.expnorm_rbf(distances, 10.0, 4)) + jnp.sum(eq.spherical_harmonics(units))

  distances, units = eq.pair_distances(positions, mask)
  assert np.all(np.diagonal(np.asarray(distances)[0]) == 0)
  assert np.all(np.asarray(units)[0, np.arange(4), np.arange(4)] == 0)
  assert np.all(np.isfinite(np.asarray(jax.grad(energy)(positions))))


def test_radial_bases():
  means, betas = eq.expnorm_parameters(5.0, 4)
  start = math.exp(-5.0)
  np.testing.assert_allclose(means, np.linspace(start, 1.0, 4), rtol=1e-6)
  np.testing.assert_allclose(betas, (2 / 4 * (1 - start)) ** -2, rtol=1e-6)
  d = jnp.asarray([[0.0, 2.0, 5.0, 6.0]])
  assert np.all(np.asarray(eq.expnorm_rbf(d, 5.0, 4))[0, 2:] == 0)
  np.testing.assert_allclose(eq.cosine_cutoff(d, 5.0), [[1.0, 0.5 * (math.cos(0.4 * math.pi)
                                                                       + 1), 0.0, 0.0]],
                             atol=1e-6)
  bessel = np.asarray(eq.bessel_rbf(jnp.asarray([1e-4, 0.0]), 5.0, 3))
  np.testing.assert_allclose(bessel[1], bessel[0], rtol=1e-4)   # the d -> 0 limit
