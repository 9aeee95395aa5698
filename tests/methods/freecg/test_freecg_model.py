"""FreeCG / ViSNet: forces, symmetries, the official layout choices, the cutoff, bad inputs."""
import dataclasses

from ase.cluster import Icosahedron
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxlab.methods.freecg import model as model_lib
from jaxlab.methods.freecg import training
from jaxlab.methods.freecg.settings import ModelSettings

SMALL = ModelSettings(channels=8, layers=2, num_rbf=6, cutoff=4.0, max_neighbours=32,
                      num_heads=2, groups=2)


def small_config(**model_overrides) -> ml_collections.ConfigDict:
  model = dict(channels=8, layers=2, num_rbf=6, cutoff=4.0, max_neighbours=32, num_heads=2,
               groups=2, edges_per_group=4, shuffle=True, attention_enhancer=True,
               smooth_cutoff=False, vecnorm_type="none", tp_implementation="contraction")
  model.update(model_overrides)
  return ml_collections.ConfigDict({"model": model})


def cluster(batch: int = 2, noise: float = 0.1, seed: int = 0) -> np.ndarray:
  base = Icosahedron("Cu", 2).get_positions()[:6]
  rng = np.random.default_rng(seed)
  return np.stack([base + noise * rng.normal(size=base.shape) for _ in range(batch)])


def random_orthogonal(seed: int) -> np.ndarray:
  q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
  q = q * np.sign(np.diag(r))[None, :]
  return -q if np.linalg.det(q) > 0 else q     # determinant -1: includes a reflection


def perturbed(params, scale=0.3, seed=0):
  """Non-zero biases (they start at zero) so that every path of the network is exercised."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [leaf + scale * jax.random.normal(k, leaf.shape, leaf.dtype)
                                   for leaf, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def energy_forces():
  config = small_config()
  params = perturbed(training.init(config, jax.random.key(0), energy_std=2.0,
                                   energy_mean=-1.0))
  fn = jax.jit(lambda p, x, z, m: training.energy_and_forces(p, config, x, z, m))
  return config, params, fn


def test_forces_are_minus_the_finite_difference_gradient_in_float64():
  config = small_config()
  with jax.enable_x64(True):
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64),
                          perturbed(training.init(config, jax.random.key(1))))
    positions = jnp.asarray(cluster(1), jnp.float64)
    numbers = jnp.full((1, 6), 29, jnp.int32)
    mask = jnp.ones((1, 6), bool)
    fn = jax.jit(lambda x: training.energy_and_forces(params, config, x, numbers, mask))
    energy, forces = fn(positions)
    h = 1e-5
    for atom, axis in [(0, 0), (5, 1)]:
      step = jnp.zeros_like(positions).at[0, atom, axis].set(h)
      difference = (fn(positions + step)[0] - fn(positions - step)[0]) / (2 * h)
      np.testing.assert_allclose(-difference[0], forces[0, atom, axis], rtol=1e-6, atol=1e-8)
    assert energy.dtype == jnp.float64


def test_energy_invariant_and_forces_equivariant_under_o3_translation_and_order(
    energy_forces):
  config, params, fn = energy_forces
  positions = jnp.asarray(cluster(2), jnp.float32)
  numbers = jnp.asarray([[29, 29, 79, 29, 78, 29]] * 2, jnp.int32)
  mask = jnp.ones((2, 6), bool)
  energy, forces = fn(params, positions, numbers, mask)
  q = jnp.asarray(random_orthogonal(2), jnp.float32)
  moved = positions @ q.T + jnp.asarray([1.0, -2.0, 0.5])[None, None, :]
  energy_moved, forces_moved = fn(params, moved, numbers, mask)
  np.testing.assert_allclose(energy_moved, energy, rtol=1e-5)
  np.testing.assert_allclose(forces_moved, forces @ q.T, atol=1e-4 * float(jnp.abs(forces).max()))
  order = np.random.default_rng(3).permutation(6)
  energy_perm, forces_perm = fn(params, positions[:, order], numbers[:, order], mask)
  np.testing.assert_allclose(energy_perm, energy, rtol=1e-5)
  np.testing.assert_allclose(forces_perm, forces[:, order], atol=1e-4 * float(
      jnp.abs(forces).max()))


def test_padding_atoms_change_nothing(energy_forces):
  config, params, fn = energy_forces
  positions = np.asarray(cluster(1), np.float32)
  numbers = np.full((1, 6), 29, np.int32)
  energy, forces = fn(params, positions, numbers, np.ones((1, 6), bool))
  padded = np.concatenate([positions, positions[:, :1] + 0.3], axis=1)   # a ghost near atom 0
  energy_padded, forces_padded = fn(params, padded, np.concatenate(
      [numbers, numbers[:, :1]], 1), np.asarray([[True] * 6 + [False]]))
  np.testing.assert_allclose(energy_padded, energy, rtol=1e-5)
  np.testing.assert_allclose(forces_padded[:, :6], forces, atol=1e-5)
  assert np.all(np.asarray(forces_padded[:, 6]) == 0)


def test_shuffle_is_the_official_left_roll_by_g_plus_half_g():
  channels = np.arange(64)
  shift = model_lib.shuffle_shift(32)
  assert shift == 48
  official = np.concatenate([channels[shift:], channels[:shift]])   # dot[:, :, G+G/2:] first
  np.testing.assert_array_equal(np.roll(channels, -shift), official)
  assert model_lib.shuffle_shift(1) == 1


def test_variants_change_what_they_say():
  config = small_config()
  positions = jnp.asarray(cluster(1), jnp.float32)
  numbers = jnp.full((1, 6), 29, jnp.int32)
  mask = jnp.ones((1, 6), bool)
  key = jax.random.key(4)
  energies = {}
  for name in ("freecg", "freecg_no_shuffle", "visnet"):
    net = training.network(name, training.model_settings(config.model, name))
    params = perturbed(net.init(key))
    energies[name] = float(jax.jit(net.apply)(params, positions, numbers, mask).sum())
  assert len({round(e, 6) for e in energies.values()}) == 3
  dense = training.model_settings(config.model, "freecg_dense")
  assert (dense.groups_used, dense.edges) == (1, 8)
  assert training.model_settings(config.model, "visnet").cg == "none"


def _pair_energy(settings: ModelSettings, separations: np.ndarray) -> np.ndarray:
  """Energy of two atoms at each separation, with non-zero biases."""
  net = training.network("freecg", settings)
  params = perturbed(net.init(jax.random.key(5)), scale=0.5)
  positions = np.zeros((len(separations), 2, 3), np.float32)
  positions[:, 1, 0] = separations
  numbers = jnp.full((len(separations), 2), 29, jnp.int32)
  return np.asarray(jnp.sum(jax.jit(net.apply)(params, jnp.asarray(positions), numbers,
                                               jnp.ones((len(separations), 2), bool)), -1))


def test_official_cutoff_has_an_energy_step_and_the_smooth_flag_removes_it():
  separations = np.asarray([SMALL.cutoff - 1e-3, SMALL.cutoff + 1e-3], np.float32)
  official = _pair_energy(SMALL, separations)
  smooth = _pair_energy(dataclasses.replace(SMALL, smooth_cutoff=True), separations)
  official_step, smooth_step = abs(official[1] - official[0]), abs(smooth[1] - smooth[0])
  assert official_step > 1e-3, official_step
  assert smooth_step < 1e-2 * official_step, (smooth_step, official_step)


def test_bad_inputs_fail_before_compiling():
  config = small_config()
  params = training.init(config, jax.random.key(0))
  positions = jnp.asarray(cluster(1), jnp.float32)
  mask = jnp.ones((1, 6), bool)
  with pytest.raises(ValueError, match="groups x model.edges_per_group"):
    training.model_settings(small_config(edges_per_group=3).model)
  with pytest.raises(ValueError, match="unknown element"):
    training.energy_and_forces(params, config, positions, jnp.full((1, 6), 150, jnp.int32),
                               mask)
  with pytest.raises(ValueError, match=r"\[B, N, 3\]"):
    training.energy_and_forces(params, config, positions[0], jnp.full((6,), 29), mask[0])
  with pytest.raises(ValueError, match="unknown model"):
    training.model_settings(config.model, "painn")


def test_learning_rate_warms_up_then_follows_the_plateau_rule():
  settings = training.TrainSettings(name="freecg", model=SMALL, warmup_steps=10,
                                    plateau_patience=2, learning_rate=1e-3)
  np.testing.assert_allclose(training.learning_rate(settings, jnp.asarray(0), 1.0), 1e-4)
  np.testing.assert_allclose(training.learning_rate(settings, jnp.asarray(9), 0.5), 1e-3)
  np.testing.assert_allclose(training.learning_rate(settings, jnp.asarray(10), 0.5), 5e-4)
  np.testing.assert_allclose(training.learning_rate(settings, jnp.asarray(10), 1e-9), 1e-7)
  plateau = {"best": jnp.asarray(jnp.inf), "bad_epochs": jnp.asarray(0),
             "scale": jnp.asarray(1.0)}
  scales = []
  # torch's ReduceLROnPlateau(patience=2): it reduces on the third epoch without improvement.
  for value in (1.0, 0.5, 0.6, 0.6, 0.6, 0.7, 0.7, 0.7):
    plateau = training.plateau_update(plateau, jnp.asarray(value), settings)
    scales.append(float(plateau["scale"]))
  np.testing.assert_allclose(scales, [1, 1, 1, 1, 0.8, 0.8, 0.8, 0.64], rtol=1e-6)
