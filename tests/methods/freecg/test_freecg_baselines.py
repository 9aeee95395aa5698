"""freecg.baselines: SchNet and NequIPLike are O(3)-, translation- and permutation-invariant,
their forces rotate with the atoms, padded atoms are inert, and they run functionally under jit.

Tiny sizes (C = 16, 2 layers, 2 systems of 5 atoms, one padded) and one compile per model and
check, so the file runs in seconds on CPU.
"""
from __future__ import annotations

import functools

import e3nn_jax as e3nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.freecg import baselines
from jaxlab.methods.freecg.settings import ModelSettings
from jaxlab.zoo import equivariant
from jaxlab.zoo import functional

SETTINGS = ModelSettings(channels=16, layers=2, num_rbf=8, cutoff=4.0, max_neighbours=32)
BATCH, ATOMS = 2, 5
PADDED = (0, ATOMS - 1)          # system 0's last atom is padding


def make_system(seed: int = 0):
  rng = np.random.default_rng(seed)
  positions = rng.normal(size=(BATCH, ATOMS, 3)).astype(np.float32) * 1.3
  numbers = rng.choice([13, 29, 47, 79], size=(BATCH, ATOMS)).astype(np.int32)
  mask = np.ones((BATCH, ATOMS), bool)
  mask[PADDED] = False
  numbers[PADDED] = 0
  return jnp.asarray(positions), jnp.asarray(numbers), jnp.asarray(mask)


def random_reflection(seed: int = 1) -> jax.Array:
  """A random orthogonal matrix with determinant -1 (a rotation times a reflection)."""
  rng = np.random.default_rng(seed)
  q, r = np.linalg.qr(rng.normal(size=(3, 3)))
  q = q * np.sign(np.diag(r))
  if np.linalg.det(q) > 0:
    q = -q
  return jnp.asarray(q, jnp.float32)


@functools.lru_cache(maxsize=None)
def build(name: str):
  """(Functional, params) of a baseline, shared by the tests (building NequIPLike eagerly costs
  seconds)."""
  cls = getattr(baselines, name)
  fn = functional.Functional(lambda rngs: cls(SETTINGS, rngs=rngs))
  return fn, jax.jit(fn.init)(jax.random.key(0))


@pytest.fixture(scope="module", params=["SchNet", "NequIPLike"])
def model(request):
  fn, params = build(request.param)

  @jax.jit
  def energies_and_forces(params, positions, numbers, mask):
    def total(x):
      per_atom = fn.apply(params, x, numbers, mask)
      return per_atom.sum(), per_atom
    (_, per_atom), grad = jax.value_and_grad(total, has_aux=True)(positions)
    return per_atom, -grad

  return request.param, fn, params, lambda *args: energies_and_forces(params, *args)


def test_o3_and_translation_invariance_and_force_equivariance(model):
  _, _, _, run = model
  positions, numbers, mask = make_system()
  q = random_reflection()
  shift = jnp.array([[[0.7, -1.9, 3.1]]])
  energies, forces = run(positions, numbers, mask)
  energies2, forces2 = run(positions @ q.T + shift, numbers, mask)
  np.testing.assert_allclose(energies2.sum(-1), energies.sum(-1), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(energies2, energies, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(forces2, forces @ q.T, rtol=1e-4, atol=1e-4)
  assert float(jnp.abs(forces).max()) > 1e-3    # the check is not vacuous


def test_permutation_invariance(model):
  _, _, _, run = model
  positions, numbers, mask = make_system()
  perm = jnp.array([3, 0, 4, 1, 2])
  energies, forces = run(positions, numbers, mask)
  energies2, forces2 = run(positions[:, perm], numbers[:, perm], mask[:, perm])
  np.testing.assert_allclose(energies2.sum(-1), energies.sum(-1), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(energies2, energies[:, perm], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(forces2, forces[:, perm], rtol=1e-4, atol=1e-4)


def test_padded_atom_is_inert_and_forces_finite(model):
  _, _, _, run = model
  positions, numbers, mask = make_system()
  energies, forces = run(positions, numbers, mask)
  assert np.all(np.isfinite(energies)) and np.all(np.isfinite(forces))
  assert float(energies[PADDED]) == 0.0
  np.testing.assert_array_equal(forces[PADDED], 0.0)
  # Far away, or on top of a real atom (a zero distance): nothing changes, nothing is NaN.
  for where in (jnp.array([50.0, -20.0, 10.0]), positions[0, 0]):
    moved = positions.at[PADDED].set(where)
    energies2, forces2 = run(moved, numbers, mask)
    assert np.all(np.isfinite(forces2))
    np.testing.assert_allclose(energies2, energies, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(forces2, forces, rtol=1e-5, atol=1e-6)


def test_atoms_beyond_the_cutoff_are_independent(model):
  """A system split in two far-apart halves has the energy of the halves on their own."""
  _, _, _, run = model
  positions, numbers, mask = make_system()
  far = positions.at[1, 3:].add(jnp.array([[40.0, 0.0, 0.0]]))
  alone_a = mask.at[1, 3:].set(False)
  alone_b = mask.at[1, :3].set(False)
  together, forces = run(far, numbers, mask)
  first, _ = run(far, numbers, alone_a)
  second, _ = run(far, numbers, alone_b)
  np.testing.assert_allclose(together[1], first[1] + second[1], rtol=1e-5, atol=1e-6)
  assert np.all(np.isfinite(forces))


def test_split_merge_under_jit_matches_functional(model):
  name, fn, params, run = model
  positions, numbers, mask = make_system()
  graphdef, state = nnx.split(fn.module(params))
  energy = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x, numbers, mask))(state, positions)
  expected, _ = run(positions, numbers, mask)
  np.testing.assert_allclose(energy, expected, rtol=1e-5, atol=1e-6)
  n_params = functional.count_params(params)
  assert n_params == sum(x.size for x in jax.tree.leaves(state)), name
  grads = jax.jit(jax.grad(lambda p: fn.apply(p, positions, numbers, mask).sum()))(params)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_nequip_node_features_are_equivariant():
  fn, params = build("NequIPLike")
  positions, numbers, mask = make_system(seed=3)
  features = jax.jit(lambda x: fn.apply(params, x, numbers, mask, method="node_features").array)
  irreps = e3nn.Irreps(fn.module(params).node_irreps)
  assert irreps == e3nn.Irreps("8x0e+4x1o+2x2e")
  q = random_reflection(seed=4)
  before = features(positions)
  after = features(positions @ q.T + jnp.array([[[1.0, 2.0, -0.5]]]))
  np.testing.assert_allclose(after, before @ irreps.D_from_matrix(q).T, rtol=1e-4, atol=1e-4)
  # The 1o part on its own: each of its channels rotates with the reflection matrix itself.
  vectors = irreps.slices()[1]
  as_vectors = lambda f: f[..., vectors].reshape(BATCH, ATOMS, 4, 3)
  np.testing.assert_allclose(as_vectors(after), as_vectors(before) @ q.T, rtol=1e-4, atol=1e-4)
  assert float(jnp.abs(as_vectors(before)[mask]).max()) > 1e-3


def test_gaussian_rbf_and_polynomial_cutoff():
  d = jnp.array([0.0, 2.5, 5.0, 6.0])
  rbf = equivariant.gaussian_rbf(d, 5.0, 11)
  assert rbf.shape == (4, 11)
  np.testing.assert_allclose(rbf[0, 0], 1.0)
  np.testing.assert_allclose(rbf[1, 5], 1.0)
  np.testing.assert_allclose(rbf[1, 6], np.exp(-0.5), rtol=1e-6)    # width = spacing
  envelope = equivariant.polynomial_cutoff(d, 5.0)
  np.testing.assert_allclose(envelope, [1.0, envelope[1], 0.0, 0.0], atol=1e-6)
  assert 0.0 < float(envelope[1]) < 1.0
