"""Force-field training as in the official FreeCG (torchmd-net) loop, seeds as vmapped replicas.

    E = std * sum_i e_i + mean      (mean, std of the training energies; not trained)
    F = -dE/dpositions              (jax.grad)
    L = 0.05 L_E + 0.95 L_F,  L_F = MSE(F),  L_E = 0.05 MSE(E) + 0.95 L_E(previous step)
    AdamW(lr 2e-4, no weight decay); lr ramps linearly over the first 1000 steps; after that
    ReduceLROnPlateau on the validation loss (factor 0.8, patience 30 epochs, min 1e-7)

One chunk is one epoch (`steps_per_epoch` batches of a fresh per-seed permutation, remainder
dropped) in a `lax.scan`, then the validation loss and the plateau rule; every seed of a model
is a replica of one `jit(vmap(...))` that traces once. Models differ in parameters, so each
model trains in its own run (workdir/<model>/), resumable.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxlab.core import metrics as metrics_lib
from jaxlab.core import replicas
from jaxlab.methods.freecg import baselines
from jaxlab.methods.freecg import model as model_lib
from jaxlab.methods.freecg.settings import ModelSettings
from jaxlab.zoo import functional

PyTree = Any
MEV = 1000.0

# name -> (module class, settings overrides); every FreeCG variant changes one switch.
MODELS: dict[str, tuple[type, dict[str, Any]]] = {
    "freecg": (model_lib.FreeCG, {}),
    "freecg_no_shuffle": (model_lib.FreeCG, {"shuffle": False}),
    "freecg_no_enhancer": (model_lib.FreeCG, {"attention_enhancer": False}),
    "freecg_dense": (model_lib.FreeCG, {"cg": "dense"}),
    "visnet": (model_lib.FreeCG, {"cg": "none"}),
    "schnet": (baselines.SchNet, {}),
    "nequip": (baselines.NequIPLike, {}),
}


def model_settings(model_config: ml_collections.ConfigDict, name: str = "freecg"
                   ) -> ModelSettings:
  """The config's `model` group with a named model's switches applied."""
  if name not in MODELS:
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
  m = model_config
  if m.groups * m.edges_per_group != m.channels:
    raise ValueError(f"model.groups x model.edges_per_group must equal model.channels: "
                     f"{m.groups} x {m.edges_per_group} != {m.channels}")
  base = ModelSettings(channels=m.channels, layers=m.layers, num_rbf=m.num_rbf,
                       cutoff=m.cutoff, max_neighbours=m.max_neighbours,
                       num_heads=m.num_heads, groups=m.groups, shuffle=m.shuffle,
                       attention_enhancer=m.attention_enhancer,
                       smooth_cutoff=m.smooth_cutoff, vecnorm_type=m.vecnorm_type,
                       tp_implementation=m.tp_implementation)
  return dataclasses.replace(base, **MODELS[name][1])


@functools.lru_cache(maxsize=None)
def network(name: str, settings: ModelSettings) -> functional.Functional:
  cls = MODELS[name][0]
  return functional.Functional(lambda rngs: cls(settings, rngs=rngs))


def check_inputs(positions: Any, numbers: Any, mask: Any, settings: ModelSettings) -> None:
  """Shape and element checks that run before anything compiles."""
  if len(np.shape(positions)) != 3 or np.shape(positions)[-1] != 3:
    raise ValueError(f"positions must be [B, N, 3], got shape {np.shape(positions)}")
  if np.shape(numbers) != np.shape(positions)[:2] or np.shape(mask) != np.shape(numbers):
    raise ValueError(f"numbers and mask must be [B, N] = {np.shape(positions)[:2]}, got "
                     f"{np.shape(numbers)} and {np.shape(mask)}")
  if not isinstance(numbers, jax.core.Tracer) and not isinstance(mask, jax.core.Tracer):
    real = np.asarray(numbers)[np.asarray(mask, bool)]
    bad = real[(real < 1) | (real >= settings.max_z)]
    if bad.size:
      raise ValueError(f"unknown element(s) {sorted(set(bad.tolist()))}: atomic numbers must "
                       f"be in 1..{settings.max_z - 1}")


def init(config: ml_collections.ConfigDict, key: jax.Array, name: str = "freecg", *,
         energy_mean: float = 0.0, energy_std: float = 1.0) -> PyTree:
  """{"net": network parameters, "standardize": {"mean", "std"}} (the latter never trained)."""
  return initial_params(name, model_settings(config.model, name), key, energy_mean, energy_std)


def initial_params(name: str, settings: ModelSettings, key: jax.Array, energy_mean: float,
                   energy_std: float) -> PyTree:
  return {"net": network(name, settings).init(key),
          "standardize": {"mean": jnp.asarray(energy_mean, jnp.float32),
                          "std": jnp.asarray(energy_std, jnp.float32)}}


def energy_and_forces(params: PyTree, config: ml_collections.ConfigDict, positions: jax.Array,
                      numbers: jax.Array, mask: jax.Array, name: str = "freecg"
                      ) -> tuple[jax.Array, jax.Array]:
  """(E [B], F [B, N, 3]): total energies (eV) and forces -dE/dpositions (eV/A)."""
  settings = model_settings(config.model, name)
  check_inputs(positions, numbers, mask, settings)
  return _energy_and_forces(network(name, settings).apply, params, positions, numbers, mask)


def _energy_and_forces(apply, params, positions, numbers, mask):
  scale = jax.lax.stop_gradient(params["standardize"])

  def total_energy(positions):
    per_atom = apply(params["net"], positions, numbers, mask)
    energies = scale["std"] * jnp.sum(per_atom, axis=-1) + scale["mean"]
    return jnp.sum(energies), energies

  gradient, energies = jax.grad(total_energy, has_aux=True)(positions)
  return energies, -gradient


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """What the replicas of one model share (static: a change compiles anew)."""
  name: str
  model: ModelSettings
  batch_size: int = 4
  learning_rate: float = 2e-4
  warmup_steps: int = 1000
  plateau_factor: float = 0.8
  plateau_patience: int = 30
  plateau_threshold: float = 1e-4    # torch's default relative threshold
  min_learning_rate: float = 1e-7
  energy_weight: float = 0.05
  force_weight: float = 0.95
  energy_ema: float = 0.05           # loss_scale_y: the weight of the current energy MSE


def learning_rate(settings: TrainSettings, step: jax.Array, plateau_scale: jax.Array
                  ) -> jax.Array:
  """Warm-up overrides the plateau scale (the official loop sets lr directly while step <
  warmup); afterwards lr * scale, never below the minimum."""
  warm = settings.learning_rate * jnp.minimum(1.0, (step + 1) / settings.warmup_steps)
  decayed = jnp.maximum(settings.learning_rate * plateau_scale, settings.min_learning_rate)
  return jnp.where(step < settings.warmup_steps, warm, decayed)


def plateau_update(plateau: Mapping[str, jax.Array], value: jax.Array,
                   settings: TrainSettings) -> dict[str, jax.Array]:
  """torch's ReduceLROnPlateau (mode min, relative threshold, no cooldown) on one value."""
  improved = value < plateau["best"] * (1.0 - settings.plateau_threshold)
  bad = jnp.where(improved, 0, plateau["bad_epochs"] + 1)
  reduce = bad > settings.plateau_patience
  return {"best": jnp.where(improved, value, plateau["best"]),
          "bad_epochs": jnp.where(reduce, 0, bad),
          "scale": jnp.where(reduce, plateau["scale"] * settings.plateau_factor,
                             plateau["scale"])}


def optimizer() -> optax.GradientTransformation:
  return optax.inject_hyperparams(optax.adamw)(learning_rate=0.0, weight_decay=0.0)


def init_replica(settings: TrainSettings, energy_mean: float, energy_std: float,
                 raw_key: jax.Array) -> PyTree:
  key = jax.random.wrap_key_data(raw_key)
  params = initial_params(settings.name, settings.model, jax.random.fold_in(key, 0),
                          energy_mean, energy_std)
  return {"params": params, "opt_state": optimizer().init(params),
          "energy_loss_ema": jnp.asarray(jnp.nan, jnp.float32),
          "plateau": {"best": jnp.asarray(jnp.inf, jnp.float32),
                      "bad_epochs": jnp.asarray(0, jnp.int32),
                      "scale": jnp.asarray(1.0, jnp.float32)},
          "key": raw_key}


def _errors(apply, params, positions, numbers, mask, energy, forces):
  predicted_energy, predicted_forces = _energy_and_forces(apply, params, positions, numbers,
                                                          mask)
  atoms = mask[..., None].astype(positions.dtype)
  force_error = (predicted_forces - forces) * atoms
  count = jnp.sum(atoms) * 3
  return {"energy_mse": jnp.mean((predicted_energy - energy) ** 2),
          "force_mse": jnp.sum(force_error ** 2) / count,
          "energy_mae": jnp.mean(jnp.abs(predicted_energy - energy)),
          "force_mae": jnp.sum(jnp.abs(force_error)) / count}


def make_train_step(settings: TrainSettings):
  """(state, batch, step index) -> (state, metrics): one AdamW step of one replica on a batch
  {positions, numbers, mask, energy, forces}."""
  apply = network(settings.name, settings.model).apply
  tx = optimizer()

  def train_step(state, batch, index):
    def objective(params):
      errors = _errors(apply, params, batch["positions"], batch["numbers"], batch["mask"],
                       batch["energy"], batch["forces"])
      previous = jnp.where(jnp.isnan(state["energy_loss_ema"]), errors["energy_mse"],
                           state["energy_loss_ema"])
      energy_loss = (settings.energy_ema * errors["energy_mse"]
                     + (1 - settings.energy_ema) * jax.lax.stop_gradient(previous))
      loss = settings.energy_weight * energy_loss + settings.force_weight * errors["force_mse"]
      return loss, (errors, energy_loss)

    (loss, (errors, energy_loss)), grads = jax.value_and_grad(objective, has_aux=True)(
        state["params"])
    opt_state = state["opt_state"]
    lr = learning_rate(settings, index, state["plateau"]["scale"])
    opt_state.hyperparams["learning_rate"] = lr
    updates, opt_state = tx.update(grads, opt_state, state["params"])
    state = {**state, "params": optax.apply_updates(state["params"], updates),
             "opt_state": opt_state, "energy_loss_ema": jax.lax.stop_gradient(energy_loss)}
    return state, {"train/loss": loss, "train/energy_mae_mev": errors["energy_mae"] * MEV,
                   "train/force_mae_mev_a": errors["force_mae"] * MEV, "train/lr": lr}

  return train_step


def replica_chunk(settings: TrainSettings, steps_per_epoch: int):
  """(state, train, val, start, stop) -> (state, metrics): one epoch of one replica, then the
  validation loss (official weights, no EMA) drives the plateau rule."""
  apply = network(settings.name, settings.model).apply
  train_step = make_train_step(settings)
  batch_size = settings.batch_size

  def epoch_step(state, index, data):
    key = jax.random.wrap_key_data(state["key"])
    epoch, position = index // steps_per_epoch, index % steps_per_epoch
    order = jax.random.permutation(jax.random.fold_in(key, 1_000_000 + epoch),
                                   data["energy"].shape[0])
    rows = jax.lax.dynamic_slice_in_dim(order, position * batch_size, batch_size)
    return train_step(state, jax.tree.map(lambda column: column[rows], data), index)

  def one_replica(state, train, val, start, stop):
    state, metrics = replicas.scan_chunk(lambda s, i: epoch_step(s, i, train), state, start,
                                         stop, steps_per_epoch)
    val_errors = jax.lax.map(
        lambda b: _errors(apply, state["params"], b["positions"], b["numbers"], b["mask"],
                          b["energy"], b["forces"]), val)
    val_errors = jax.tree.map(jnp.mean, val_errors)
    val_loss = (settings.energy_weight * val_errors["energy_mse"]
                + settings.force_weight * val_errors["force_mse"])
    plateau = plateau_update(state["plateau"], val_loss, settings)
    # The official scheduler steps once per epoch: a ragged last chunk does not count as one.
    full_epoch = (stop - start) == steps_per_epoch
    state = {**state, "plateau": jax.tree.map(lambda new, old: jnp.where(full_epoch, new, old),
                                              plateau, state["plateau"])}
    return state, {**metrics, "val/loss": val_loss,
                   "val/energy_mae_mev": val_errors["energy_mae"] * MEV,
                   "val/force_mae_mev_a": val_errors["force_mae"] * MEV}

  return one_replica


TRACE_COUNTS: collections.Counter = collections.Counter()


@functools.lru_cache(maxsize=None)
def chunk_function(settings: TrainSettings, steps_per_epoch: int,
                   sharding: jax.sharding.Sharding | None = None):
  """jit(vmap(one replica's epoch)) over seeds; raises if it traces twice.

  The count is per settings (`TRACE_COUNTS`): `chex.assert_max_traces` keys a function by its
  source, so it would count every model's chunk as one function.
  """
  one_replica = replica_chunk(settings, steps_per_epoch)

  def traced(*args):
    TRACE_COUNTS[settings] += 1
    if TRACE_COUNTS[settings] > 1:
      raise AssertionError(f"the {settings.name} training chunk traced "
                           f"{TRACE_COUNTS[settings]} times; it should compile once")
    return one_replica(*args)

  return jax.jit(jax.vmap(traced, in_axes=(0, None, None, None, None)), donate_argnums=0,
                 out_shardings=(sharding, None))


def batched(arrays: Mapping[str, np.ndarray], batch: int) -> dict[str, jax.Array]:
  """[F, ...] -> [F // batch, batch, ...] (the remainder dropped) for `lax.map`."""
  count = (len(arrays["energy"]) // batch) * batch
  if count == 0:
    raise ValueError(f"need at least {batch} frames, got {len(arrays['energy'])}")
  return {k: jnp.asarray(v[:count].reshape((count // batch, batch) + v.shape[1:]))
          for k, v in arrays.items()}


def device_arrays(frames: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
  """MD frames (float64 from the data) as float32 device arrays with an all-true atom mask."""
  num_frames, num_atoms = frames["numbers"].shape
  return {"positions": jnp.asarray(frames["positions"], jnp.float32),
          "forces": jnp.asarray(frames["forces"], jnp.float32),
          "energy": jnp.asarray(frames["energy"], jnp.float32),
          "numbers": jnp.asarray(frames["numbers"], jnp.int32),
          "mask": jnp.ones((num_frames, num_atoms), bool)}


@dataclasses.dataclass
class TrainResult:
  state: PyTree                         # replica-stacked final state
  curve_steps: np.ndarray               # [K] steps that ended an epoch chunk
  curves: dict[str, np.ndarray]         # val/force_mae_mev_a etc.: [R, K]
  ms_per_step: float                    # wall per training step of all replicas, compile excluded
  wall_s: float
  earlier_s: float


def train(settings: TrainSettings, seeds: list[int], train_frames: Mapping[str, np.ndarray],
          val_frames: Mapping[str, np.ndarray], *, steps: int, mesh: jax.sharding.Mesh,
          workdir: str | os.PathLike | None = None, ckpt_every_epochs: int = 2,
          progress: bool = True) -> TrainResult:
  """Trains one model for `steps` steps with one replica per seed, resumable from `workdir`
  (also with more steps; the curves of earlier calls come from `workdir/metrics.jsonl`)."""
  train_data = device_arrays(train_frames)
  num_train = int(train_data["energy"].shape[0])
  steps_per_epoch = num_train // settings.batch_size
  if steps_per_epoch < 1:
    raise ValueError(f"data.batch_size {settings.batch_size} exceeds the {num_train} training "
                     "frames")
  val_data = batched(device_arrays(val_frames), min(len(val_frames["energy"]), 25))
  energies = np.asarray(train_frames["energy"], np.float64)
  mean, std = float(energies.mean()), float(energies.std())
  keys = jax.random.key_data(jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32)))
  keys = replicas.place(keys, mesh)
  sharding = replicas.replica_sharding(len(seeds), mesh)
  chunk = chunk_function(settings, steps_per_epoch, sharding)
  timings: list[tuple[int, float]] = []

  def timed_chunk(state, start, stop):
    began = time.perf_counter()
    state, metrics = chunk(state, train_data, val_data, start, stop)
    jax.block_until_ready(state)
    timings.append((int(stop) - int(start), time.perf_counter() - began))
    return state, metrics

  init_fn = jax.jit(jax.vmap(functools.partial(init_replica, settings, mean, std)))
  run = replicas.run_chunks(
      lambda: init_fn(keys), timed_chunk, steps=steps, chunk_steps=steps_per_epoch,
      ckpt_every=steps_per_epoch * ckpt_every_epochs, mesh=mesh, workdir=workdir,
      desc=f"{settings.name} steps", progress=progress, summarize=per_replica)
  history = metrics_lib.read_jsonl(workdir) if workdir is not None else run.history
  curve_steps, curves = validation_curves(history, steps)
  # The first chunk of a call compiles; later ones time the steps alone.
  steady = timings[1:] or timings
  ms = (1e3 * sum(t for _, t in steady) / max(1, sum(n for n, _ in steady))
        if steady else float("nan"))
  return TrainResult(state=run.state, curve_steps=curve_steps, curves=curves, ms_per_step=ms,
                     wall_s=run.wall_s, earlier_s=run.earlier_s)


def per_replica(metrics: dict[str, np.ndarray]) -> dict[str, list[float]]:
  """A chunk's metrics kept per replica (the seeds' curves are plotted with their spread)."""
  return {name: np.asarray(value, np.float64).round(6).tolist()
          for name, value in metrics.items()}


CURVES = ("val/force_mae_mev_a", "val/energy_mae_mev", "train/lr")


def validation_curves(history, steps: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  by_step = {int(r["step"]): r for r in history if "val/loss" in r and r["step"] <= steps}
  curve_steps = np.asarray(sorted(by_step), np.int64)
  return curve_steps, {name: np.asarray([by_step[s][name] for s in curve_steps],
                                        np.float64).T for name in CURVES}


@functools.lru_cache(maxsize=None)
def evaluation_function(settings: TrainSettings):
  """jit(vmap over replicas): test-set MAEs (meV, meV/A), batched with `lax.map`."""
  apply = network(settings.name, settings.model).apply

  def one_replica(params, test):
    errors = jax.lax.map(lambda b: _errors(apply, params, b["positions"], b["numbers"],
                                           b["mask"], b["energy"], b["forces"]), test)
    return {"energy_mae_mev": jnp.mean(errors["energy_mae"]) * MEV,
            "force_mae_mev_a": jnp.mean(errors["force_mae"]) * MEV}

  return jax.jit(jax.vmap(one_replica, in_axes=(0, None)))


def random_orthogonal(key: jax.Array) -> jax.Array:
  """A random O(3) matrix with determinant -1 (a rotation times a reflection)."""
  q, r = jnp.linalg.qr(jax.random.normal(key, (3, 3)))
  q = q * jnp.sign(jnp.diagonal(r))[None, :]
  return q * jnp.where(jnp.linalg.det(q) > 0, -1.0, 1.0)


@functools.lru_cache(maxsize=None)
def equivariance_function(settings: TrainSettings):
  """jit(vmap over replicas): max relative change of E and of the rotated F under a random
  O(3) transform plus a translation of each frame."""
  apply = network(settings.name, settings.model).apply

  def one_replica(params, frames, key):
    q = random_orthogonal(key)
    shift = jax.random.normal(jax.random.fold_in(key, 1), (3,))
    positions, numbers, mask = frames["positions"], frames["numbers"], frames["mask"]
    energy, forces = _energy_and_forces(apply, params, positions, numbers, mask)
    moved = positions @ q.T + shift[None, None, :]
    energy_moved, forces_moved = _energy_and_forces(apply, params, moved, numbers, mask)
    energy_error = jnp.max(jnp.abs(energy_moved - energy)) / jnp.max(jnp.abs(energy))
    force_error = (jnp.max(jnp.abs(forces_moved - forces @ q.T))
                   / jnp.max(jnp.abs(forces)))
    return jnp.maximum(energy_error, force_error)

  return jax.jit(jax.vmap(one_replica, in_axes=(0, None, None)))


def parameter_count(state: PyTree) -> int:
  """Trainable parameters of one replica (the standardisation constants excluded)."""
  return functional.count_params(replicas.take(state["params"]["net"], 0))

