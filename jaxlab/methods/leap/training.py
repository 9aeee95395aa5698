"""LEAP's loop: behaviour cloning, then rounds of roll out, relabel failures, aggregate, fine-tune.

* Datasets: whole episodes; `chosen[t]` is the action the student should take at step t given
  the episode's history before it (-1: no label), `rejected[t]` the student's own action (for DPO
  pairs). Every replica's dataset is padded to one capacity and sampled uniformly below its
  `count`, so all replicas (students x seeds) train in one vmapped `lax.scan`.
* Iteration 0 (`bc`): SFT on `expert` demonstrations of the training tasks.
* Iteration i: roll out pi_{i-1} greedily on the training tasks, keep the failures, relabel every
  step with the replica's teacher given the student's own states, aggregate with the data of
  iterations 0 .. i-1 and fine-tune from pi_{i-1} (`leap_dpo`: DPO on this iteration's pairs
  where teacher and student differ, reference pi_{i-1}, as the official preference data is per
  iteration).
* SFT: cross-entropy of the chosen action over labelled steps. DPO: -log sigmoid(beta *
  ((log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected)))) over pairs; the
  reference log-probabilities are computed once before the phase. Both come from the same
  forward pass and a per-replica flag picks one, so SFT and DPO replicas share the compiled step.
* Optimiser (the official recipe's shape): AdamW, 10 warm-up steps then cosine to 0, global-norm
  clip 0.3, a fresh optimiser state per iteration; the learning rate is per replica.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.core import replicas
from jaxlab.methods.leap import env as env_lib
from jaxlab.methods.leap import student as student_lib
from jaxlab.methods.leap import teachers

PyTree = Any
NO_LABEL = -1
# Chunk functions traced so far, by replica count: `fit` must compile its step once per shape.
TRACE_COUNTS: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  steps: int                     # optimiser steps of every phase (BC and each iteration)
  batch_size: int                # episodes per step
  warmup_steps: int = 10
  grad_clip: float = 0.3
  weight_decay: float = 0.0
  chunk_steps: int = 100
  ckpt_every: int = 500

  def __post_init__(self):
    if self.steps < 1 or self.batch_size < 1:
      raise ValueError(f"train.steps and train.batch_size must be >= 1, got {self.steps}, "
                       f"{self.batch_size}")
    if self.chunk_steps < 1 or self.ckpt_every % self.chunk_steps:
      raise ValueError(f"train.ckpt_every ({self.ckpt_every}) must be a multiple of "
                       f"train.chunk_steps ({self.chunk_steps})")
    if self.grad_clip <= 0:
      raise ValueError(f"optim.grad_clip must be > 0, got {self.grad_clip}")


# ---------------------------------------------------------------------------------------------
# Datasets.


class Dataset(NamedTuple):
  """Episodes of one replica (numpy; [C, ...]) or of many ([R, C, ...])."""
  tokens: np.ndarray        # [C, L] the episode's buffer (the student's own history)
  chosen: np.ndarray        # [C, H] target action per step, NO_LABEL where none
  rejected: np.ndarray      # [C, H] the student's action per step, NO_LABEL where none

  @property
  def size(self) -> int:
    return int(self.tokens.shape[-2])


def concatenate(parts: Sequence[Dataset]) -> Dataset:
  return Dataset(*(np.concatenate([getattr(p, f) for p in parts]) for f in Dataset._fields))


def take_episodes(data: Dataset, keep: np.ndarray) -> Dataset:
  return Dataset(*(np.asarray(a)[np.asarray(keep)] for a in data))


REFERENCE_TEACHERS = ("expert", "teacher_alone", "bayes_optimal")


@functools.partial(jax.jit, static_argnums=0)
def play_references(spec: env_lib.EnvSpec, tasks: env_lib.Task, key: jax.Array
                    ) -> env_lib.Rollout:
  """`REFERENCE_TEACHERS` each playing every task itself: a Rollout with leading [T, N] (one
  compiled function for all of them)."""
  def one(index):
    def policy(state, step_key, step):
      del step
      actions = jnp.stack([teachers.policy(spec, name)(state, step_key, None)
                           for name in REFERENCE_TEACHERS])
      return actions[index]
    return env_lib.rollout(spec, policy, tasks, key)
  return jax.vmap(one)(jnp.arange(len(REFERENCE_TEACHERS)))


def reference(played: env_lib.Rollout, name: str) -> env_lib.Rollout:
  """One teacher's rollout out of `play_references`."""
  return jax.tree.map(lambda a: a[REFERENCE_TEACHERS.index(name)], played)


def demonstrations(played: env_lib.Rollout) -> Dataset:
  """Episodes of one rollout (the `expert`'s) as a dataset: its buffers, its actions as the
  targets."""
  actions = np.asarray(played.actions)
  return Dataset(tokens=np.asarray(played.final.tokens), chosen=actions,
                 rejected=np.full_like(actions, NO_LABEL))


class TeacherChoice(NamedTuple):
  """A replica's relabelling teacher: `leap`, or `share_<percent>` when `is_share`."""
  is_share: jax.Array       # bool
  percent: jax.Array        # float, 0 .. 100


def teacher_choice(name: str) -> TeacherChoice:
  """The relabelling teacher of a student name (`leap`, `leap_dpo`: the LEAP teacher)."""
  percent = teachers.share_of(name)
  if percent is None and name not in ("leap", "leap_dpo"):
    raise ValueError(f"no relabelling teacher for student {name!r}")
  return TeacherChoice(is_share=np.asarray(percent is not None),
                       percent=np.asarray(float(percent or 0), np.float32))


def relabel_action(spec: env_lib.EnvSpec, choice: TeacherChoice, state: env_lib.State,
                   key: jax.Array) -> jax.Array:
  """The replica's teacher at one of the student's states."""
  shared = teachers.share(spec, choice.percent, state, key)
  return jnp.where(choice.is_share, shared, teachers.leap(spec, state))


def relabel(spec: env_lib.EnvSpec, choice: TeacherChoice, played: env_lib.Rollout,
            key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(chosen [N, H], keep [N]): the teacher's action at every step the student acted in, given
  the student's own state there; keep = the episode failed."""
  count, horizon = played.actions.shape
  keys = jax.random.split(key, (count, horizon))
  labels = jax.vmap(jax.vmap(functools.partial(relabel_action, spec, choice)))(
      played.states, keys)
  chosen = jnp.where(played.actions >= 0, labels, NO_LABEL)
  return chosen, ~played.success


# ---------------------------------------------------------------------------------------------
# Losses and the optimiser.


def sft_loss(logits: jax.Array, chosen: jax.Array) -> jax.Array:
  """Mean cross-entropy of the chosen actions over labelled steps; logits [B, H, A]."""
  labelled = chosen >= 0
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(chosen, 0))
  return (ce * labelled).sum() / jnp.maximum(labelled.sum(), 1)


def _gather(logp: jax.Array, actions: jax.Array) -> jax.Array:
  return jnp.take_along_axis(logp, jnp.maximum(actions, 0)[..., None], axis=-1)[..., 0]


def dpo_pairs(chosen: jax.Array, rejected: jax.Array) -> jax.Array:
  """Steps that form a preference pair: both labelled and different."""
  return (chosen >= 0) & (rejected >= 0) & (chosen != rejected)


def dpo_loss(logits: jax.Array, chosen: jax.Array, rejected: jax.Array,
             reference_chosen: jax.Array, reference_rejected: jax.Array, beta: jax.Array
             ) -> jax.Array:
  """Mean DPO loss over pairs; reference_* are log pi_ref of the chosen and rejected actions."""
  logp = jax.nn.log_softmax(logits)
  margin = ((_gather(logp, chosen) - reference_chosen)
            - (_gather(logp, rejected) - reference_rejected))
  pairs = dpo_pairs(chosen, rejected)
  loss = -jax.nn.log_sigmoid(beta * margin)
  return (loss * pairs).sum() / jnp.maximum(pairs.sum(), 1)


def schedule(train_spec: TrainSpec) -> optax.Schedule:
  """Linear warm-up to 1, then cosine to 0 (times each replica's learning rate)."""
  warmup = min(train_spec.warmup_steps, train_spec.steps // 2)
  return optax.warmup_cosine_decay_schedule(0.0, 1.0, warmup, max(train_spec.steps, warmup + 1))


def optimizer(train_spec: TrainSpec) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(train_spec.grad_clip),
                     optax.adamw(schedule(train_spec), weight_decay=train_spec.weight_decay))


# ---------------------------------------------------------------------------------------------
# Fitting every replica of a phase at once.


class Phase(NamedTuple):
  """Per-replica inputs of one training phase, leading axis R."""
  data: Dataset                  # padded to one capacity: [R, C, ...]
  count: np.ndarray              # [R] episodes in use
  reference_chosen: np.ndarray   # [R, C, H] DPO reference log-probs (0 for SFT replicas)
  reference_rejected: np.ndarray
  learning_rate: np.ndarray      # [R]
  is_dpo: np.ndarray             # [R] bool
  beta: np.ndarray               # [R] DPO temperature


def pad_to(data: Dataset, capacity: int) -> Dataset:
  """`data` with empty episodes appended up to `capacity` (never sampled: below `count` only)."""
  extra = capacity - data.size
  if extra < 0:
    raise ValueError(f"{data.size} episodes exceed the capacity {capacity}")
  fill = lambda a, value: np.concatenate([a, np.full((extra,) + a.shape[1:], value, a.dtype)])
  return Dataset(tokens=fill(data.tokens, env_lib.PAD), chosen=fill(data.chosen, NO_LABEL),
                 rejected=fill(data.rejected, NO_LABEL))


def stack_phase(datasets: Sequence[Dataset], capacity: int, *, learning_rates: Sequence[float],
                is_dpo: Sequence[bool], betas: Sequence[float]) -> Phase:
  """One Phase from per-replica datasets (padded to `capacity`) and settings; the DPO
  reference log-probabilities start at 0 (`with_references` fills them)."""
  # A replica with no episodes (no failures to relabel) samples one padded episode without
  # labels (`count` >= 1): its loss and gradient are 0 and only weight decay acts.
  padded = [pad_to(d, capacity) for d in datasets]
  stacked = Dataset(*(np.stack([getattr(p, f) for p in padded]) for f in Dataset._fields))
  zeros = np.zeros(stacked.chosen.shape, np.float32)
  return Phase(data=stacked, count=np.asarray([max(d.size, 1) for d in datasets], np.int32),
               reference_chosen=zeros, reference_rejected=zeros.copy(),
               learning_rate=np.asarray(learning_rates, np.float32),
               is_dpo=np.asarray(is_dpo, bool), beta=np.asarray(betas, np.float32))


def with_references(phase: Phase, model_spec: student_lib.ModelSpec,
                    env_spec: env_lib.EnvSpec, reference_params: PyTree) -> Phase:
  """The phase with log pi_ref of every chosen and rejected action filled in for its DPO
  replicas (reference_params: [R, ...], one reference per replica)."""
  dpo = np.flatnonzero(phase.is_dpo)
  if not dpo.size:
    return phase
  subset = jax.tree.map(lambda a: a[dpo], reference_params)
  data = Dataset(*(a[dpo] for a in phase.data))
  chosen, rejected = reference_log_probs(model_spec, env_spec, subset, data)
  reference_chosen = phase.reference_chosen.copy()
  reference_rejected = phase.reference_rejected.copy()
  reference_chosen[dpo], reference_rejected[dpo] = chosen, rejected
  return phase._replace(reference_chosen=reference_chosen, reference_rejected=reference_rejected)


@functools.lru_cache(maxsize=None)
def _phase_functions(model_spec: student_lib.ModelSpec, env_spec: env_lib.EnvSpec,
                     train_spec: TrainSpec, sharding: jax.sharding.Sharding | None):
  agent = student_lib.Student(model_spec, env_spec)
  tx = optimizer(train_spec)

  def init_one(params):
    return {"params": params, "opt_state": tx.init(params)}

  def loss_fn(params, tokens, chosen, rejected, ref_c, ref_r, is_dpo, beta):
    logits = agent.action_logits(params, tokens)
    sft = sft_loss(logits, chosen)
    dpo = dpo_loss(logits, chosen, rejected, ref_c, ref_r, beta)
    labelled = chosen >= 0
    accuracy = (((jnp.argmax(logits, -1) == chosen) * labelled).sum()
                / jnp.maximum(labelled.sum(), 1))
    return jnp.where(is_dpo, dpo, sft), {"sft_loss": sft, "dpo_loss": dpo,
                                         "action_accuracy": accuracy}

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def one_replica(state, key, phase, start, stop):
    TRACE_COUNTS[jax.tree.leaves(phase.count)[0].shape] += 1

    def step(state, index):
      rows = jax.random.randint(jax.random.fold_in(key, index), (train_spec.batch_size,), 0,
                                phase.count)
      pick = lambda a: a[rows]
      (loss, metrics), grads = grad_fn(
          state["params"], pick(phase.data.tokens), pick(phase.data.chosen),
          pick(phase.data.rejected), pick(phase.reference_chosen),
          pick(phase.reference_rejected), phase.is_dpo, phase.beta)
      updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
      updates = jax.tree.map(lambda u: phase.learning_rate * u, updates)
      return ({"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state},
              {"loss": loss, **metrics})

    state, metrics = replicas.scan_chunk(step, state, start, stop, train_spec.chunk_steps)
    return state, {f"train/{k}": v for k, v in metrics.items()}

  init = jax.jit(jax.vmap(init_one))
  chunk = jax.jit(jax.vmap(one_replica, in_axes=(0, 0, 0, None, None)), donate_argnums=0,
                  out_shardings=(sharding, None) if sharding else None)
  return init, chunk


@dataclasses.dataclass
class FitResult:
  params: PyTree                  # replica-stacked parameters after the phase
  history: list[dict[str, Any]]
  wall_s: float
  earlier_s: float


def fit_phase(model_spec: student_lib.ModelSpec, env_spec: env_lib.EnvSpec,
              train_spec: TrainSpec, start_params: PyTree, phase: Phase, keys: jax.Array, *,
              mesh: jax.sharding.Mesh, workdir: str | os.PathLike | None = None,
              progress: bool = True, desc: str = "leap") -> FitResult:
  """`train_spec.steps` steps of every replica from `start_params` ([R, ...]), resumable."""
  count = replicas.num_replicas(start_params)
  sharding = replicas.replica_sharding(count, mesh)
  init, chunk = _phase_functions(model_spec, env_spec, train_spec, sharding)
  placed = replicas.place((keys, jax.tree.map(jnp.asarray, phase)), mesh)
  keys, phase = placed
  run = replicas.run_chunks(
      lambda: init(start_params),
      lambda state, start, stop: chunk(state, keys, phase, start, stop),
      steps=train_spec.steps, chunk_steps=train_spec.chunk_steps,
      ckpt_every=train_spec.ckpt_every, mesh=mesh, workdir=workdir, desc=desc,
      progress=progress)
  return FitResult(params=run.state["params"], history=run.history, wall_s=run.wall_s,
                   earlier_s=run.earlier_s)


# ---------------------------------------------------------------------------------------------
# Students acting: rollouts, evaluation, reference log-probabilities.


@functools.lru_cache(maxsize=None)
def _student_functions(model_spec: student_lib.ModelSpec, env_spec: env_lib.EnvSpec):
  agent = student_lib.Student(model_spec, env_spec)

  def play(params, tasks, key):
    return env_lib.rollout(env_spec, functools.partial(agent.act, params), tasks, key)

  def play_and_relabel(params, choice, tasks, key):
    play_key, label_key = jax.random.split(key)
    played = play(params, tasks, play_key)
    chosen, keep = relabel(env_spec, choice, played, label_key)
    return played, chosen, keep

  def log_probs(params, tokens, chosen, rejected):
    # [K, b, ...] chunks of one replica's dataset, one forward pass per chunk.
    def one_chunk(args):
      tokens, chosen, rejected = args
      logp = jax.nn.log_softmax(agent.action_logits(params, tokens))
      return _gather(logp, chosen), _gather(logp, rejected)
    return jax.lax.map(one_chunk, (tokens, chosen, rejected))

  return (jax.jit(jax.vmap(play_and_relabel, in_axes=(0, 0, None, 0))),
          jax.jit(jax.vmap(log_probs)))


def play_and_relabel(model_spec: student_lib.ModelSpec, env_spec: env_lib.EnvSpec,
                     params: PyTree, choices: TeacherChoice, tasks: env_lib.Task,
                     keys: jax.Array):
  """Every replica ([R, ...] params) plays every task greedily and its teacher relabels every
  step: (rollout, chosen, keep), leading [R, N]. One compiled function serves every iteration
  (and the test games, played in the same call)."""
  return _student_functions(model_spec, env_spec)[0](params, choices, tasks, keys)


def reference_log_probs(model_spec: student_lib.ModelSpec, env_spec: env_lib.EnvSpec,
                        params: PyTree, data: Dataset, batch: int = 512
                        ) -> tuple[np.ndarray, np.ndarray]:
  """log pi(chosen), log pi(rejected) [R, C, H] of replica-stacked parameters over their
  datasets [R, C, ...], `batch` episodes per forward pass."""
  fn = _student_functions(model_spec, env_spec)[1]
  size = data.tokens.shape[1]
  padded = -(-size // batch) * batch
  grow = lambda a, value: np.concatenate(
      [a, np.full(a.shape[:1] + (padded - size,) + a.shape[2:], value, a.dtype)], axis=1)
  chunks = lambda a: jnp.asarray(a.reshape(a.shape[0], padded // batch, batch, *a.shape[2:]))
  arrays = [chunks(grow(np.asarray(a), v)) for a, v in
            ((data.tokens, env_lib.PAD), (data.chosen, NO_LABEL), (data.rejected, NO_LABEL))]
  chosen, rejected = fn(params, *arrays)
  flat = lambda a: np.asarray(a).reshape(a.shape[0], padded, -1)[:, :size]
  return flat(chosen), flat(rejected)


def summarize_rollout(played: env_lib.Rollout) -> dict[str, np.ndarray]:
  """Per replica (leading axes [..., N]): success rate, mean steps of successful episodes
  (NaN with none), share of episodes that read the note."""
  success = np.asarray(played.success)
  steps = (np.asarray(played.actions) >= 0).sum(axis=-1)
  wins = success.sum(axis=-1)
  steps_per_success = np.where(wins > 0, (steps * success).sum(axis=-1) / np.maximum(wins, 1),
                               math.nan)
  return {"success": success.mean(axis=-1), "steps": steps_per_success,
          "read_rate": np.asarray(played.final.note_read).mean(axis=-1)}
