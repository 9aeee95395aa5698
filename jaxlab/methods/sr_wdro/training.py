"""SR-WDRO training: every method and seed as one replica of one compiled chunk of epochs.

A replica trains an MLP on its own (possibly noisy) labels. Per minibatch it
1. perturbs the batch with the Wasserstein soft-ball attack (`attacks.linf.soft_ball_linf`:
   10 sign-gradient steps of eps/4 from a uniform random start; coordinates past eps are pulled
   back by lam times their excess, so lam = 1 is PGD's projection),
2. weighs the per-example adversarial losses by the KL worst case within radius r
   (`weights.kl_worst_case_weights`; r = 0 is the plain mean) and takes an SGD step on the
   weighted sum,
3. moves lam every `lam_period` iterations: lam -= lam_lr (eps - mean |delta|), the mean over
   the iterations since the last move (Eq. 19 of the paper; lam carries across epochs).

The methods differ only in traced per-replica numbers, so one `vmap` runs them all:
`erm` (eps 0), `at` (lam fixed at 1, r 0), `udr` (lam learned, r 0), `sr_wdro_r<r>` (lam learned,
radius r); `trades` / `sr_trades_r<r>` replace the loss by CE(clean) + beta KL(clean || adv)
(TRADES), reweighted the same way. `sr_wdro_stale_r<r>` is an ablation of what the official code
computes (its quirk (a)): the weights are solved once, on the replica's first batch, and reused
by batch position for every later batch. Every `eval_every` epochs a chunk ends with PGD-20 on a fixed
test subset, logged per replica (the curves are read back from `metrics.jsonl`, so a run may
be resumed with more epochs); the best epoch and its parameters live in the replica state.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.attacks import linf
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import replicas
from jaxlab.methods.sr_wdro import data as data_lib
from jaxlab.methods.sr_wdro import weights as weights_lib
from jaxlab.zoo import functional
from jaxlab.zoo import mlp

PyTree = Any
BOUNDS = (0.0, 1.0)
_RADIUS = re.compile(r"^(sr_wdro|sr_trades|sr_wdro_stale)_r([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)$")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  name: str
  adversarial: bool    # eps > 0 in training (erm trains on clean inputs)
  learn_lam: bool      # the soft ball's lam follows the rule; else it stays at lam_init = 1
  radius: float        # KL radius r of the reweighting (0: the plain mean)
  trades: bool         # CE(clean) + beta KL(clean || adv) instead of CE(adv)
  stale_weights: bool = False   # the first batch's weights, reused by position (official quirk)


def parse_method(name: str) -> MethodSpec:
  """`erm`, `at`, `udr`, `trades`, `sr_wdro_r<r>`, `sr_trades_r<r>` or `sr_wdro_stale_r<r>`
  (r > 0)."""
  fixed = {"erm": MethodSpec("erm", False, False, 0.0, False),
           "at": MethodSpec("at", True, False, 0.0, False),
           "udr": MethodSpec("udr", True, True, 0.0, False),
           "trades": MethodSpec("trades", True, False, 0.0, True)}
  if name in fixed:
    return fixed[name]
  match = _RADIUS.match(name)
  if not match or float(match.group(2)) <= 0:
    raise ValueError(f"unknown method {name!r}; choose erm, at, udr, trades, sr_wdro_r<r> or "
                     "sr_trades_r<r> or sr_wdro_stale_r<r> with a radius r > 0 "
                     "(e.g. sr_wdro_r0.1)")
  return MethodSpec(name, True, True, float(match.group(2)), match.group(1) == "sr_trades",
                    stale_weights=match.group(1) == "sr_wdro_stale")


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every replica shares (static: a change compiles anew)."""
  epsilon: float = 0.1
  attack_steps: int = 10
  step_fraction: float = 0.25          # attack step = eps / 4
  lam_init: float = 1.0
  lam_lr: float = 0.02
  lam_period: int = 10
  trades_beta: float = 6.0
  any_trades: bool = False             # compile the TRADES loss too
  hidden: tuple[int, ...] = (256, 256)
  batch_size: int = 100
  epochs: int = 200
  learning_rate: float = 0.1
  momentum: float = 0.9
  weight_decay: float = 5e-4
  lr_milestones: tuple[int, ...] = (100, 150)
  lr_factor: float = 0.1
  eval_every: int = 4
  eval_steps: int = 20
  weight_iterations: int = 64


@functools.lru_cache(maxsize=None)
def network(hidden: tuple[int, ...]) -> functional.Functional:
  """The zoo MLP 64-hidden-10, ReLU, initialised as torch.nn.Linear (the official code is
  PyTorch)."""
  return functional.Functional(lambda rngs: mlp.MLP(
      [data_lib.NUM_FEATURES, *hidden, data_lib.NUM_CLASSES], activation="relu",
      torch_init=True, rngs=rngs))


def optimizer(settings: Settings, steps_per_epoch: int) -> optax.GradientTransformation:
  """SGD with momentum, L2 as PyTorch's weight_decay, lr x lr_factor at each milestone epoch."""
  schedule = optax.piecewise_constant_schedule(
      settings.learning_rate,
      {m * steps_per_epoch: settings.lr_factor for m in settings.lr_milestones})
  return optax.chain(optax.add_decayed_weights(settings.weight_decay),
                     optax.sgd(schedule, momentum=settings.momentum))


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[B, C], [B] -> [B]."""
  return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)[:, 0]


def kl_clean_adv(clean_logits: jax.Array, adv_logits: jax.Array) -> jax.Array:
  """KL(softmax(clean) || softmax(adv)) per example, [B]."""
  clean = jax.nn.log_softmax(clean_logits)
  return jnp.sum(jnp.exp(clean) * (clean - jax.nn.log_softmax(adv_logits)), axis=1)


@dataclasses.dataclass(frozen=True)
class ReplicaInputs:
  """The per-replica numbers, stacked [R, ...] (traced: one compile for every method)."""
  epsilon: np.ndarray       # [R] training budget (0 for erm)
  learn_lam: np.ndarray     # [R] 1.0 / 0.0
  radius: np.ndarray        # [R]
  trades: np.ndarray        # [R] 1.0 / 0.0
  stale_weights: np.ndarray  # [R] 1.0 / 0.0
  key: np.ndarray           # [R] PRNG keys (init, shuffles, attack starts)
  train_labels: np.ndarray  # [R, N] the labels this replica trains on


jax.tree_util.register_dataclass(
    ReplicaInputs, data_fields=["epsilon", "learn_lam", "radius", "trades", "stale_weights",
                                "key",
                                "train_labels"], meta_fields=[])


def replica_inputs(specs: Sequence[MethodSpec], seeds: Sequence[int],
                   labels: Sequence[np.ndarray], settings: Settings) -> ReplicaInputs:
  """One replica per (spec, seed, labels) triple."""
  if not len(specs) == len(seeds) == len(labels):
    raise ValueError("specs, seeds and labels must have one entry per replica")
  return ReplicaInputs(
      epsilon=np.asarray([settings.epsilon if s.adversarial else 0.0 for s in specs],
                         np.float32),
      learn_lam=np.asarray([float(s.learn_lam) for s in specs], np.float32),
      radius=np.asarray([s.radius for s in specs], np.float32),
      trades=np.asarray([float(s.trades) for s in specs], np.float32),
      stale_weights=np.asarray([float(s.stale_weights) for s in specs], np.float32),
      key=jax.random.key_data(jnp.stack([jax.random.key(s) for s in seeds])),
      train_labels=np.stack([np.asarray(l, np.int32) for l in labels]))


def lam_rule(state: PyTree, distance: jax.Array, epsilon: jax.Array, learn: jax.Array, *,
             lr: float, period: int) -> dict[str, jax.Array]:
  """The soft ball's lam after one iteration (Eq. 19; the official `i % lamda_period == 0`).

  `distance` is this iteration's mean_i mean_j |delta_ij|; it joins the running sum. At every
  `period`-th iteration (counting from 0, so the first iteration moves) lam moves by
  -lr (eps - the mean distance since the last move) when `learn`, and the sum restarts. Returns
  the new {lam, distance_sum, distance_count}.
  """
  distance_sum = state["distance_sum"] + distance
  distance_count = state["distance_count"] + 1
  move = (state["iteration"] % period) == 0
  moved = state["lam"] - lr * (epsilon - distance_sum / distance_count)
  return {"lam": jnp.where(move & learn, moved, state["lam"]),
          "distance_sum": jnp.where(move, 0.0, distance_sum),
          "distance_count": jnp.where(move, 0, distance_count)}


def init_replica(settings: Settings, steps_per_epoch: int, raw_key: jax.Array) -> PyTree:
  params = network(settings.hidden).init(jax.random.fold_in(jax.random.wrap_key_data(raw_key),
                                                            0))
  return {"params": params,
          "opt_state": optimizer(settings, steps_per_epoch).init(params),
          "lam": jnp.float32(settings.lam_init),
          "distance_sum": jnp.float32(0.0), "distance_count": jnp.int32(0),
          "iteration": jnp.int32(0),
          "best_params": params, "best_robust": jnp.float32(-1.0),
          "best_epoch": jnp.int32(0),
          "first_batch_weights": jnp.full(settings.batch_size, 1.0 / settings.batch_size,
                                         jnp.float32)}


def robust_correct(params: PyTree, x: jax.Array, labels: jax.Array, key: jax.Array, *,
                   settings: Settings, num_steps: int, record_at: Sequence[int],
                   restarts: int = 1) -> jax.Array:
  """[len(record_at), N] bool: correct under PGD (eps, eps/4 steps, uniform random start) after
  each recorded step, for every one of `restarts` random starts."""
  apply = network(settings.hidden).apply

  def loss(x_adv, unused_key):
    return jnp.sum(cross_entropy(apply(params, x_adv), labels))

  def one_restart(restart_key):
    iterates = linf.pgd_linf_iterates(
        loss, x, linf.fixed_keys(restart_key, num_steps), epsilon=settings.epsilon,
        step_size=settings.epsilon * settings.step_fraction, bounds=BOUNDS,
        record_at=tuple(record_at), random_start=restart_key)
    return jax.vmap(lambda xa: jnp.argmax(apply(params, xa), -1) == labels)(iterates)

  correct = jax.vmap(one_restart)(jax.random.split(key, restarts))
  return jnp.all(correct, axis=0)


def replica_chunk(settings: Settings, steps_per_epoch: int):
  """(state, inputs, x_train, eval_x, eval_y, start, stop) -> (state, metrics) for one replica:
  `eval_every` epochs (those at or past `stop` are no-ops), then PGD-20 on the eval images."""
  apply = network(settings.hidden).apply
  tx = optimizer(settings, steps_per_epoch)
  batch = settings.batch_size

  def train_step(state, inputs: ReplicaInputs, x, labels):
    key = jax.random.fold_in(jax.random.wrap_key_data(inputs.key), state["iteration"] + 1)
    params = state["params"]
    epsilon = inputs.epsilon
    trades = inputs.trades > 0

    def attack_loss(x_adv):
      adv_logits = apply(params, x_adv)
      if not settings.any_trades:
        return jnp.sum(cross_entropy(adv_logits, labels))
      clean_logits = jax.lax.stop_gradient(apply(params, x))
      return jnp.sum(jnp.where(trades, kl_clean_adv(clean_logits, adv_logits),
                               cross_entropy(adv_logits, labels)))

    x_adv = jax.lax.stop_gradient(linf.soft_ball_linf(
        attack_loss, x, key, epsilon=epsilon, step_size=epsilon * settings.step_fraction,
        num_steps=settings.attack_steps, lam=state["lam"], bounds=BOUNDS))

    def objective(params):
      adv_logits = apply(params, x_adv)
      per_example = cross_entropy(adv_logits, labels)
      if settings.any_trades:
        clean_logits = apply(params, x)
        trades_loss = (cross_entropy(clean_logits, labels)
                       + settings.trades_beta * kl_clean_adv(clean_logits, adv_logits))
        per_example = jnp.where(trades, trades_loss, per_example)
      fresh = weights_lib.kl_worst_case_weights(per_example, inputs.radius,
                                                num_iterations=settings.weight_iterations)
      first_batch = jnp.where(state["iteration"] == 0, fresh, state["first_batch_weights"])
      weights = jnp.where(inputs.stale_weights > 0, first_batch, fresh)
      accuracy = jnp.mean(jnp.argmax(adv_logits, -1) == labels)
      return jnp.sum(weights * per_example), (jnp.mean(per_example), accuracy,
                                              jnp.max(weights), first_batch)

    grads, (mean_loss, accuracy, max_weight, first_batch) = jax.grad(objective, has_aux=True)(
        params)
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    lam_state = lam_rule(state, jnp.mean(jnp.abs(x_adv - x)), epsilon, inputs.learn_lam > 0,
                         lr=settings.lam_lr, period=settings.lam_period)
    state = {**state, **lam_state, "params": optax.apply_updates(params, updates),
             "opt_state": opt_state, "iteration": state["iteration"] + 1,
             "first_batch_weights": first_batch}
    return state, {"train/loss": mean_loss, "train/adv_accuracy": accuracy,
                   "train/max_weight": max_weight}

  def one_replica(state, inputs: ReplicaInputs, x_train, eval_x, eval_y, start, stop):
    def epoch(state, index):
      key = jax.random.fold_in(jax.random.wrap_key_data(inputs.key), 1_000_000 + index)
      order = jax.random.permutation(key, x_train.shape[0])[:steps_per_epoch * batch]
      xs = x_train[order].reshape(steps_per_epoch, batch, -1)
      ys = inputs.train_labels[order].reshape(steps_per_epoch, batch)
      state, metrics = jax.lax.scan(lambda s, b: train_step(s, inputs, *b), state, (xs, ys))
      return state, jax.tree.map(jnp.mean, metrics)

    state, metrics = replicas.scan_chunk(epoch, state, start, stop, settings.eval_every)
    eval_key = jax.random.fold_in(jax.random.wrap_key_data(inputs.key), 2_000_000 + stop)
    robust = jnp.mean(robust_correct(state["params"], eval_x, eval_y, eval_key,
                                     settings=settings, num_steps=settings.eval_steps,
                                     record_at=(settings.eval_steps,))[-1])
    clean = jnp.mean(jnp.argmax(apply(state["params"], eval_x), -1) == eval_y)
    better = robust > state["best_robust"]
    state = {**state,
             "best_robust": jnp.where(better, robust, state["best_robust"]),
             "best_epoch": jnp.where(better, stop, state["best_epoch"]),
             "best_params": jax.tree.map(lambda new, old: jnp.where(better, new, old),
                                         state["params"], state["best_params"])}
    return state, {**metrics, "eval/robust": robust, "eval/clean": clean,
                   "eval/lam": state["lam"]}

  return one_replica


@functools.lru_cache(maxsize=None)
def chunk_function(settings: Settings, steps_per_epoch: int,
                   sharding: jax.sharding.Sharding | None = None):
  """jit(vmap(one replica's chunk)): every method and seed in one compiled call."""
  return jax.jit(jax.vmap(replica_chunk(settings, steps_per_epoch),
                          in_axes=(0, 0, None, None, None, None, None)),
                 donate_argnums=0, out_shardings=(sharding, None))


@functools.lru_cache(maxsize=None)
def init_function(settings: Settings, steps_per_epoch: int):
  return jax.jit(jax.vmap(functools.partial(init_replica, settings, steps_per_epoch)))


def per_replica(metrics: dict[str, np.ndarray]) -> dict[str, list[float]]:
  """A chunk's metrics kept per replica (methods differ: a mean over them means nothing)."""
  return {name: np.asarray(value, np.float64).round(5).tolist()
          for name, value in metrics.items()}


@dataclasses.dataclass
class TrainResult:
  state: PyTree          # replica-stacked final state (best params and epoch inside)
  curve_epochs: np.ndarray            # [E] the epochs that ended an evaluation chunk
  curves: dict[str, np.ndarray]       # robust, clean, lam: [R, E] at those epochs
  wall_s: float
  earlier_s: float


CURVES = {"robust": "eval/robust", "clean": "eval/clean", "lam": "eval/lam"}


def evaluation_curves(history: Sequence[dict[str, Any]], epochs: int
                      ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """The per-replica evaluation records of a run (the last record of each epoch up to
  `epochs`) as ([E] epochs, {robust, clean, lam: [R, E]})."""
  by_epoch = {int(r["step"]): r for r in history if "eval/robust" in r and r["step"] <= epochs}
  curve_epochs = np.asarray(sorted(by_epoch), np.int64)
  return curve_epochs, {name: np.asarray([by_epoch[e][key] for e in curve_epochs],
                                         np.float64).T for name, key in CURVES.items()}


def train(inputs: ReplicaInputs, x_train: np.ndarray, eval_x: np.ndarray, eval_y: np.ndarray,
          settings: Settings, *, mesh: jax.sharding.Mesh,
          workdir: str | os.PathLike | None = None, ckpt_every: int | None = None,
          progress: bool = True) -> TrainResult:
  """Trains every replica for `settings.epochs` epochs, resumable from `workdir/checkpoints`
  (also with more epochs than the run it resumes; the curves of earlier calls come from
  `workdir/metrics.jsonl`)."""
  steps_per_epoch = x_train.shape[0] // settings.batch_size
  if steps_per_epoch < 1:
    raise ValueError(f"batch_size {settings.batch_size} exceeds the {x_train.shape[0]} "
                     "training images")
  inputs = replicas.place(inputs, mesh)
  sharding = replicas.replica_sharding(inputs.epsilon.shape[0], mesh)
  chunk = chunk_function(settings, steps_per_epoch, sharding)
  x_train, eval_x, eval_y = (jnp.asarray(a) for a in (x_train, eval_x, eval_y))
  run = replicas.run_chunks(
      lambda: init_function(settings, steps_per_epoch)(inputs.key),
      lambda state, start, stop: chunk(state, inputs, x_train, eval_x, eval_y, start, stop),
      steps=settings.epochs, chunk_steps=settings.eval_every,
      ckpt_every=ckpt_every or settings.eval_every * 5, mesh=mesh, workdir=workdir,
      desc="sr_wdro epochs", progress=progress, summarize=per_replica)
  history = metrics_lib.read_jsonl(workdir) if workdir is not None else run.history
  curve_epochs, curves = evaluation_curves(history, settings.epochs)
  return TrainResult(state=run.state, curve_epochs=curve_epochs, curves=curves,
                     wall_s=run.wall_s, earlier_s=run.earlier_s)


@functools.lru_cache(maxsize=None)
def final_evaluation_function(settings: Settings, num_steps: int, record_at: tuple[int, ...],
                              restarts: int):
  def one_replica(params, x, labels, raw_key):
    key = jax.random.wrap_key_data(raw_key)
    correct = robust_correct(params, x, labels, key, settings=settings, num_steps=num_steps,
                             record_at=record_at, restarts=restarts)
    clean = jnp.argmax(network(settings.hidden).apply(params, x), -1) == labels
    return jnp.mean(clean), jnp.mean(correct, axis=-1)
  return jax.jit(jax.vmap(one_replica, in_axes=(0, None, 0, 0)))


def final_accuracies(params: PyTree, x: np.ndarray, labels: np.ndarray, keys: np.ndarray,
                     settings: Settings, *, num_steps: int, record_at: Sequence[int],
                     restarts: int) -> tuple[np.ndarray, np.ndarray]:
  """(clean [R], robust [R, len(record_at)]): PGD with `restarts` random starts (an image
  counts as robust only if every restart fails), labels [N] shared or [R, N] per replica."""
  labels = np.asarray(labels)
  evaluate = final_evaluation_function(settings, num_steps, tuple(record_at), restarts)
  if labels.ndim == 1:
    labels = np.broadcast_to(labels, (keys.shape[0], labels.shape[0]))
  clean, robust = evaluate(params, jnp.asarray(x), jnp.asarray(labels), keys)
  return np.asarray(clean), np.asarray(robust)


@functools.lru_cache(maxsize=None)
def weight_share_function(settings: Settings, num_steps: int):
  def one_replica(params, x, labels, marked, radius, raw_key):
    key = jax.random.wrap_key_data(raw_key)
    apply = network(settings.hidden).apply

    def loss(x_adv, unused_key):
      return jnp.sum(cross_entropy(apply(params, x_adv), labels))

    x_adv = linf.pgd_linf(loss, x, linf.fixed_keys(key, num_steps), epsilon=settings.epsilon,
                          step_size=settings.epsilon * settings.step_fraction, bounds=BOUNDS,
                          random_start=key)
    losses = cross_entropy(apply(params, x_adv), labels)
    batch = settings.batch_size
    num_batches = x.shape[0] // batch
    order = jax.random.permutation(jax.random.fold_in(key, 1), x.shape[0])[:num_batches * batch]
    weights = jax.vmap(lambda l: weights_lib.kl_worst_case_weights(
        l, radius, num_iterations=settings.weight_iterations))(
            losses[order].reshape(num_batches, batch))
    return jnp.sum(weights * marked[order].reshape(num_batches, batch)) / num_batches
  return jax.jit(jax.vmap(one_replica, in_axes=(0, None, 0, 0, 0, 0)))


def marked_weight_share(params: PyTree, x: np.ndarray, labels: np.ndarray, marked: np.ndarray,
                        radius: np.ndarray, keys: np.ndarray, settings: Settings, *,
                        num_steps: int) -> np.ndarray:
  """[R]: the share of the KL worst-case weight (each replica's radius, minibatches of the
  training batch size) that falls on the `marked` examples [R, N] (e.g. the flipped labels),
  with per-example losses under PGD-`num_steps` at the training eps. Radius 0 gives the marked
  fraction (up to the examples left out of whole batches)."""
  share = weight_share_function(settings, num_steps)(
      params, jnp.asarray(x), jnp.asarray(labels), jnp.asarray(marked, jnp.float32),
      jnp.asarray(radius, jnp.float32), keys)
  return np.asarray(share)
