"""The EMT molecular-dynamics TFDS builder: splits, physics of the stored frames, determinism."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from ase import Atoms
from ase.calculators.emt import EMT

from jaxlab.data import md_emt

SPLITS = ("train", "validation", "test")


def tiny_config(seed: int = 0) -> md_emt.MdEmtConfig:
  # 10 equilibration steps and 12 frames: a whole build takes well under a second of MD.
  return md_emt.md_emt_config("cu13", num_frames=12, num_train=6, num_val=3, seed=seed,
                              equilibration_ps=0.02)


def load_all(config, data_dir) -> dict[str, dict[str, np.ndarray]]:
  return {split: md_emt.load_arrays(split, config, str(data_dir)) for split in SPLITS}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return load_all(tiny_config(), tmp_path_factory.mktemp("md_emt"))


def test_shapes_dtypes_and_rmd17_style_split(tiny):
  sizes = {split: len(arrays["frame"]) for split, arrays in tiny.items()}
  assert sizes == {"train": 6, "validation": 3, "test": 3}
  for arrays in tiny.values():
    f = len(arrays["frame"])
    assert arrays["positions"].shape == (f, 13, 3) and arrays["positions"].dtype == np.float64
    assert arrays["forces"].shape == (f, 13, 3) and arrays["forces"].dtype == np.float64
    assert arrays["energy"].shape == (f,) and arrays["energy"].dtype == np.float64
    assert arrays["numbers"].shape == (f, 13) and arrays["numbers"].dtype == np.int32
    assert np.all(arrays["numbers"] == 29)
    assert np.all(np.diff(arrays["frame"]) > 0)   # sorted by frame index
  frames = np.concatenate([arrays["frame"] for arrays in tiny.values()])
  np.testing.assert_array_equal(np.sort(frames), np.arange(12))   # disjoint and covering
  expected = md_emt.split_frames(12, 6, 3, seed=0)
  for split in SPLITS:
    np.testing.assert_array_equal(tiny[split]["frame"], expected[split])


def test_frames_are_distinct_snapshots_of_a_moving_cluster(tiny):
  arrays = tiny["train"]
  steps = np.linalg.norm(np.diff(arrays["positions"], axis=0), axis=-1)
  assert np.all(steps.max(axis=-1) > 1e-3)   # atoms move between recorded frames
  radius = np.linalg.norm(arrays["positions"] - arrays["positions"].mean(1, keepdims=True),
                          axis=-1)
  assert radius.max() < 4.0   # still one 13-atom cluster, nothing evaporated


def test_stored_energy_and_forces_are_emt_of_stored_positions(tiny):
  arrays = tiny["validation"]
  for i in range(len(arrays["frame"])):
    atoms = Atoms(numbers=arrays["numbers"][i], positions=arrays["positions"][i], pbc=False)
    atoms.calc = EMT()
    np.testing.assert_allclose(atoms.get_potential_energy(), arrays["energy"][i],
                               rtol=0, atol=1e-10)
    np.testing.assert_allclose(atoms.get_forces(), arrays["forces"][i], rtol=0, atol=1e-10)


def test_forces_are_minus_energy_gradient(tiny):
  arrays = tiny["test"]
  positions, forces = arrays["positions"][0], arrays["forces"][0]
  atom, axis = np.unravel_index(np.argmax(np.abs(forces)), forces.shape)
  h = 1e-5

  def energy(shift: float) -> float:
    moved = positions.copy()
    moved[atom, axis] += shift
    atoms = Atoms(numbers=arrays["numbers"][0], positions=moved, pbc=False)
    atoms.calc = EMT()
    return atoms.get_potential_energy()

  derivative = (energy(h) - energy(-h)) / (2 * h)
  assert abs(forces[atom, axis]) > 1e-2   # a component large enough to test a relative error
  np.testing.assert_allclose(forces[atom, axis], -derivative, rtol=1e-5)


def test_structures():
  cu38 = md_emt.build_atoms("cu38")
  assert len(cu38) == 38 and set(cu38.get_chemical_symbols()) == {"Cu"}
  assert not cu38.pbc.any()
  counts = collections.Counter(md_emt.build_atoms("aupt38", seed=0).get_chemical_symbols())
  assert counts == {"Au": 19, "Pt": 19}
  # The seed picks which sites are Pt; the geometry is the same truncated octahedron.
  a, b = md_emt.build_atoms("aupt38", seed=0), md_emt.build_atoms("aupt38", seed=1)
  np.testing.assert_array_equal(a.positions, b.positions)
  assert np.any(a.numbers != b.numbers)
  np.testing.assert_array_equal(a.numbers, md_emt.build_atoms("aupt38", seed=0).numbers)
  assert len(md_emt.build_atoms("cu13")) == 13


def test_generation_is_deterministic_and_seeded(tiny, tmp_path):
  again = load_all(tiny_config(), tmp_path / "again")
  for split in SPLITS:
    for key, value in tiny[split].items():
      np.testing.assert_array_equal(again[split][key], value, err_msg=f"{split}/{key}")
  other = md_emt.load_arrays("train", tiny_config(seed=1), str(tmp_path / "other"))
  assert not np.allclose(other["positions"][0], tiny["train"]["positions"][0])


def test_config_validation_and_names():
  with pytest.raises(ValueError, match="cu38"):
    md_emt.md_emt_config("cu55")
  with pytest.raises(ValueError, match="test split"):
    md_emt.md_emt_config("cu13", num_frames=10, num_train=6, num_val=4)
  names = {md_emt.md_emt_config("cu13", num_frames=12, num_train=6, num_val=3).name,
           tiny_config().name, tiny_config(seed=1).name,
           md_emt.md_emt_config("cu13", num_frames=12, num_train=6, num_val=3,
                                temperature_k=300.0).name}
  assert len(names) == 4
  assert all("." not in name for name in names)
