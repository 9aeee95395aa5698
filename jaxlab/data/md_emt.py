"""Molecular-dynamics trajectories of small metal clusters under ASE's EMT potential, as TFDS data.

Nothing is downloaded: each config runs its own trajectory with ASE's Effective Medium Theory
calculator. Three systems are built in, all non-periodic clusters centred in a vacuum box:

  cu38    the 38-atom Cu truncated octahedron (`ase.cluster.Octahedron("Cu", 4, cutoff=1)`);
  aupt38  the same geometry as a random 50/50 Au/Pt alloy (19 Pt atoms chosen by `seed`);
  cu13    the 13-atom Cu icosahedron (`ase.cluster.Icosahedron("Cu", noshells=2)`).

Dynamics: velocities drawn from Maxwell-Boltzmann at 500 K, then Langevin at 500 K with a 2 fs
step, friction 0.01/fs and `fixcm=False`, so the centre of mass is thermostatted like every other
degree of freedom and wanders slowly: models should not assume it fixed. 1 ps (500 steps) of
equilibration is discarded, then a frame is kept every 10 steps (20 fs) until 1500 frames.
Each frame stores positions [N, 3] (Angstrom), atomic numbers [N], the potential energy (eV) and
the forces [N, 3] (eV/Angstrom), all float64 so that forces match -dE/dx to finite-difference
precision. Frames are split as in rMD17: a seeded permutation of the frame indices gives 950
train, 50 validation and the rest (500) test.

EMT is parametrised for the fcc metals Al, Cu, Ag, Au, Ni, Pd and Pt only; ASE's H/C/N/O
parameters are a rough add-on not meant for real chemistry, so keep new systems to those metals.

Generation is deterministic given the config. A whole build of the 1500-frame defaults (15,500
EMT steps) took cu38 36 s, aupt38 37 s, cu13 14 s on a 2-core x86 VM.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from jaxlab.data import pipeline

NUM_ATOMS = {"cu38": 38, "aupt38": 38, "cu13": 13}
SYSTEMS = tuple(NUM_ATOMS)


@dataclasses.dataclass
class MdEmtConfig(tfds.core.BuilderConfig):
  system: str = "cu38"
  num_frames: int = 1500
  num_train: int = 950
  num_val: int = 50
  temperature_k: float = 500.0
  timestep_fs: float = 2.0
  friction_per_fs: float = 0.01
  equilibration_ps: float = 1.0
  stride: int = 10
  seed: int = 0


def _tag(value: float) -> str:
  # Config names become directory names; keep them free of dots and signs.
  return f"{value:g}".replace(".", "p").replace("-", "m")


def md_emt_config(system: str, *, num_frames: int = 1500, num_train: int = 950,
                  num_val: int = 50, seed: int = 0, temperature_k: float = 500.0,
                  timestep_fs: float = 2.0, friction_per_fs: float = 0.01,
                  equilibration_ps: float = 1.0, stride: int = 10) -> MdEmtConfig:
  """A validated config whose name is unique to its fields (non-default dynamics are appended)."""
  if system not in SYSTEMS:
    raise ValueError(f"unknown system {system!r}; choose one of {', '.join(SYSTEMS)}")
  if num_train < 1 or num_val < 1 or num_train + num_val >= num_frames:
    raise ValueError(f"need 1 <= num_train, 1 <= num_val and num_train + num_val < num_frames "
                     f"(a non-empty test split), got {num_train} + {num_val} vs {num_frames}")
  if stride < 1 or timestep_fs <= 0 or equilibration_ps < 0 or temperature_k < 0:
    raise ValueError("need stride >= 1, timestep_fs > 0, equilibration_ps >= 0, temperature_k >= 0")
  name = f"{system}_f{num_frames}_tr{num_train}_va{num_val}_s{seed}"
  defaults = {"T": (temperature_k, 500.0), "dt": (timestep_fs, 2.0),
              "g": (friction_per_fs, 0.01), "eq": (equilibration_ps, 1.0),
              "st": (stride, 10)}
  name += "".join(f"_{key}{_tag(value)}" for key, (value, default) in defaults.items()
                  if value != default)
  return MdEmtConfig(name=name, system=system, num_frames=num_frames, num_train=num_train,
                     num_val=num_val, temperature_k=temperature_k, timestep_fs=timestep_fs,
                     friction_per_fs=friction_per_fs, equilibration_ps=equilibration_ps,
                     stride=stride, seed=seed)


def build_atoms(system: str, seed: int = 0):
  """The starting `ase.Atoms` of a system: non-periodic, centred in a vacuum box, EMT attached."""
  # ase is imported lazily so that importing jaxlab.data stays cheap.
  from ase import cluster  # pylint: disable=g-import-not-at-top
  from ase.calculators.emt import EMT  # pylint: disable=g-import-not-at-top
  if system in ("cu38", "aupt38"):
    atoms = cluster.Octahedron("Cu" if system == "cu38" else "Au", length=4, cutoff=1)
    assert len(atoms) == NUM_ATOMS[system], len(atoms)
    if system == "aupt38":
      symbols = np.array(atoms.get_chemical_symbols())
      symbols[np.random.default_rng(seed).permutation(38)[:19]] = "Pt"
      atoms.set_chemical_symbols(symbols.tolist())
  elif system == "cu13":
    atoms = cluster.Icosahedron("Cu", noshells=2)
    assert len(atoms) == NUM_ATOMS[system], len(atoms)
  else:
    raise ValueError(f"unknown system {system!r}; choose one of {', '.join(SYSTEMS)}")
  atoms.pbc = False
  atoms.center(vacuum=8.0)
  atoms.calc = EMT()
  return atoms


def run_trajectory(config: MdEmtConfig) -> dict[str, np.ndarray]:
  """Runs the config's Langevin trajectory: positions, numbers, energy, forces per frame."""
  from ase import units  # pylint: disable=g-import-not-at-top
  from ase.md.langevin import Langevin  # pylint: disable=g-import-not-at-top
  from ase.md import velocitydistribution  # pylint: disable=g-import-not-at-top
  atoms = build_atoms(config.system, config.seed)
  # Separate legacy RandomStates (ase's rng protocol) for velocities and thermostat noise.
  velocitydistribution.MaxwellBoltzmannDistribution(
      atoms, temperature_K=config.temperature_k, rng=np.random.RandomState(config.seed))
  dynamics = Langevin(atoms, timestep=config.timestep_fs * units.fs,
                      temperature_K=config.temperature_k,
                      friction=config.friction_per_fs / units.fs, fixcm=False,
                      rng=np.random.RandomState(config.seed + 1))
  equilibration = int(round(config.equilibration_ps * 1000 / config.timestep_fs))
  if equilibration:
    dynamics.run(equilibration)
  n = len(atoms)
  frames = {"positions": np.empty((config.num_frames, n, 3)),
            "numbers": np.tile(atoms.numbers.astype(np.int32), (config.num_frames, 1)),
            "energy": np.empty(config.num_frames),
            "forces": np.empty((config.num_frames, n, 3))}
  for f in range(config.num_frames):
    dynamics.run(config.stride)
    frames["positions"][f] = atoms.positions
    frames["energy"][f] = atoms.get_potential_energy()
    frames["forces"][f] = atoms.get_forces()
  return frames


def split_frames(num_frames: int, num_train: int, num_val: int, seed: int
                 ) -> dict[str, np.ndarray]:
  """rMD17-style split: of a seeded permutation, num_train frames train, num_val validate."""
  order = np.random.default_rng(seed + 2).permutation(num_frames)
  return {"train": np.sort(order[:num_train]),
          "validation": np.sort(order[num_train:num_train + num_val]),
          "test": np.sort(order[num_train + num_val:])}


class MdEmt(tfds.core.GeneratorBasedBuilder):
  """Langevin MD frames (positions, numbers, energy, forces) of metal clusters under ASE's EMT."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [md_emt_config(system) for system in SYSTEMS]

  def _info(self) -> tfds.core.DatasetInfo:
    n = NUM_ATOMS[self.builder_config.system]
    # tf.train.Example keeps floats as float32 (a silent 1e-7 relative rounding); raw bytes keep
    # the float64 values that make forces and energies consistent.
    def float64(shape):
      return tfds.features.Tensor(shape=shape, dtype=np.float64,
                                  encoding=tfds.features.Encoding.BYTES)
    return tfds.core.DatasetInfo(
        builder=self, description=type(self).__doc__,
        features=tfds.features.FeaturesDict({
            "frame": tfds.features.Tensor(shape=(), dtype=np.int64),
            "positions": float64((n, 3)),
            "numbers": tfds.features.Tensor(shape=(n,), dtype=np.int32),
            "energy": float64(()),
            "forces": float64((n, 3))}))

  def _split_generators(self, dl_manager):
    del dl_manager   # simulated here, never downloaded
    config = self.builder_config
    frames = run_trajectory(config)
    splits = split_frames(config.num_frames, config.num_train, config.num_val, config.seed)
    return {name: self._generate_examples(frames, indices) for name, indices in splits.items()}

  def _generate_examples(self, frames, indices):
    for i in indices:
      yield int(i), {"frame": int(i), **{key: value[i] for key, value in frames.items()}}


def load(config: MdEmtConfig, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """Builds (once, cached under data_dir) and returns the prepared builder for a config."""
  return pipeline.build(MdEmt, config, data_dir)


def load_arrays(split: str, config: MdEmtConfig, data_dir: str | None = None
                ) -> dict[str, np.ndarray]:
  """A split's frame [F], positions [F, N, 3], numbers [F, N], energy [F], forces [F, N, 3].

  Rows are sorted by frame index (trajectory order).
  """
  source = pipeline.data_source(load(config, data_dir), split)
  batch = source.__getitems__(list(range(len(source))))
  order = np.argsort(batch["frame"], kind="stable")
  return {"frame": batch["frame"][order].astype(np.int64),
          "positions": batch["positions"][order].astype(np.float64),
          "numbers": batch["numbers"][order].astype(np.int32),
          "energy": batch["energy"][order].astype(np.float64),
          "forces": batch["forces"][order].astype(np.float64)}
