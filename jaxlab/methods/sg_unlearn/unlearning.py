"""Training phases as one compiled epoch loop: the original model, retraining, and every
unlearning method, many replicas (seeds x alphas) at once.

A phase is a `Recipe` (static: what one epoch does, compiled once) applied to replicas that differ
only in arrays (`ReplicaInputs`: which training images the epoch's pass uses and with which labels,
alpha, the auditor's samples and folds, a key). One epoch:

1. **Base pass.** Minibatches of `batch_size` drawn without replacement from the replica's base
   set; SGD with momentum 0.9 and weight decay 5e-4 (torch's SGD: the decay joins the gradient
   before the momentum), learning rate on a per-epoch cosine schedule. `objective="ce"` descends
   the cross-entropy (original, retrain, FT, RL with wrong labels on the forget set, l1-sparse with
   a linearly decaying L1 penalty), `"ascent"` ascends it on the forget set (GA).
2. **Adversarial step** (`adversarial=True`, the Stackelberg unlearner). The auditor fits its
   per-class attackers to the current scores of forget (member) and validation (non-member)
   examples; the leader takes one step of the same optimiser, with `attacker_lr`, down the gradient
   of alpha x the auditor's utility, which flows through the scores directly and through the
   attackers' optimum by implicit differentiation (`auditor.attacker_utility`). A replica with
   alpha = 0 takes no such step (the official code skips the attacker at alpha = 0), so its
   parameters and momentum are exactly FT's.

Epochs are a `lax.scan` inside one jitted function vmapped over replicas; `core.replicas` runs
chunks of epochs with logging, progress and resumable checkpoints.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.core import parallel
from jaxlab.core import replicas
from jaxlab.methods.sg_unlearn import auditor
from jaxlab.zoo import functional
from jaxlab.zoo import mlp

PyTree = Any
OBJECTIVES = ("ce", "ascent")


@dataclasses.dataclass(frozen=True)
class Recipe:
  objective: str = "ce"
  epochs: int = 10
  learning_rate: float = 0.01
  batch_size: int = 128
  batches_per_epoch: int = 1
  momentum: float = 0.9
  weight_decay: float = 5e-4
  l1: float = 0.0                 # l1-sparse: penalty l1 * (1 - epoch / epochs) * sum |theta|
  adversarial: bool = False
  attacker_lr: float = 0.01
  auditor_l2: float = 1e-2
  newton_steps: int = 12
  score: str = "loss"             # auditor features: "loss" or "logits_loss"
  chunk_epochs: int = 5

  def __post_init__(self):
    if self.objective not in OBJECTIVES:
      raise ValueError(f"unknown objective {self.objective!r}; choose one of {OBJECTIVES}")
    if self.score not in ("loss", "logits_loss"):
      raise ValueError(f"unknown auditor score {self.score!r}; choose 'loss' or 'logits_loss'")


class AuditorSamples(NamedTuple):
  """One replica's auditor data: M examples, members first, padded with zero weights."""
  x: jax.Array              # [M, 64]
  y: jax.Array              # [M] class labels (for the CE score)
  member_sign: jax.Array    # [M] +1 member (forget), -1 non-member (validation)
  train_weights: jax.Array  # [C, K, M] per (class, fold) attacker fit masks
  test_weights: jax.Array   # [C, K, M] per (class, fold) held-out masks


class ReplicaInputs(NamedTuple):
  key: jax.Array            # typed PRNG key
  base_weights: jax.Array   # [N_train] 1 for images in this replica's base pass
  base_labels: jax.Array    # [N_train] labels the base pass fits (or ascends)
  alpha: jax.Array          # [] auditor strength
  auditor: AuditorSamples


def classifier(hidden: tuple[int, ...], num_inputs: int = 64, num_classes: int = 10
               ) -> functional.Functional:
  """The MLP classifier (ReLU, torch-style initialisation)."""
  return functional.Functional(lambda rngs: mlp.MLP(
      [num_inputs, *hidden, num_classes], activation="relu", torch_init=True, rngs=rngs))


def per_example_ce(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def _momentum_sgd(recipe: Recipe) -> optax.GradientTransformation:
  """torch.optim.SGD's direction: v <- momentum v + (g + wd theta); the step is -lr v."""
  return optax.chain(optax.add_decayed_weights(recipe.weight_decay),
                     optax.trace(decay=recipe.momentum))


def init_state(params: PyTree, recipe: Recipe) -> dict[str, PyTree]:
  return {"params": params, "opt_state": _momentum_sgd(recipe).init(params)}


def cosine_lr(recipe: Recipe, epoch: jax.Array) -> jax.Array:
  return recipe.learning_rate * 0.5 * (1 + jnp.cos(jnp.pi * epoch / recipe.epochs))


def epoch_batches(key: jax.Array, weights: jax.Array, batch_size: int, num_batches: int
                  ) -> tuple[jax.Array, jax.Array]:
  """(indices, weights) [num_batches, batch_size]: the weighted images in random order first,
  then padding with weight 0 (so every replica has the same static batch count)."""
  num = weights.shape[0]
  order = jnp.argsort(jax.random.uniform(key, (num,)) + 2.0 * (weights <= 0))
  total = num_batches * batch_size
  if total > num:
    order = jnp.concatenate([order, jnp.zeros(total - num, order.dtype)])
  order = order[:total]
  batch_weights = jnp.where(jnp.arange(total) < num, weights[order], 0.0)
  return order.reshape(num_batches, batch_size), batch_weights.reshape(num_batches, batch_size)


def auditor_scores(logits: jax.Array, labels: jax.Array, score: str) -> jax.Array:
  loss = per_example_ce(logits, labels)[:, None]
  return loss if score == "loss" else jnp.concatenate([logits, loss], axis=-1)


def auditor_utility(model: functional.Functional, recipe: Recipe, params: PyTree,
                    samples: AuditorSamples) -> jax.Array:
  """The auditor's utility at its optimum: a differentiable function of the parameters."""
  scores = auditor_scores(model.apply(params, samples.x), samples.y, recipe.score)
  return auditor.attacker_utility(scores, samples.member_sign, samples.train_weights,
                                  samples.test_weights, l2=recipe.auditor_l2,
                                  newton_steps=recipe.newton_steps)


def _sgd_step(recipe: Recipe, state, grads, lr):
  updates, opt_state = _momentum_sgd(recipe).update(grads, state["opt_state"], state["params"])
  params = jax.tree.map(lambda p, u: p - lr * u, state["params"], updates)
  return {"params": params, "opt_state": opt_state}


def replica_chunk(model: functional.Functional, recipe: Recipe):
  """(state, inputs, x_train, start, stop) -> (state, metrics) for one replica: `chunk_epochs`
  epochs (those at or past `stop` leave the state as it is)."""
  sign = 1.0 if recipe.objective == "ce" else -1.0

  def batch_loss(params, x, labels, weights, l1):
    losses = per_example_ce(model.apply(params, x), labels)
    loss = sign * jnp.sum(weights * losses) / jnp.maximum(jnp.sum(weights), 1.0)
    if recipe.l1:
      loss = loss + l1 * sum(jnp.sum(jnp.abs(p)) for p in jax.tree.leaves(params))
    return loss

  grad_fn = jax.value_and_grad(batch_loss)

  def one_epoch(state, epoch, inputs: ReplicaInputs, x_train):
    key = jax.random.fold_in(inputs.key, epoch)
    lr = cosine_lr(recipe, epoch)
    l1 = recipe.l1 * (1 - epoch / recipe.epochs)
    indices, weights = epoch_batches(key, inputs.base_weights, recipe.batch_size,
                                     recipe.batches_per_epoch)

    def one_batch(state, batch):
      rows, w = batch
      loss, grads = grad_fn(state["params"], x_train[rows], inputs.base_labels[rows], w, l1)
      stepped = _sgd_step(recipe, state, grads, lr)
      used = jnp.sum(w) > 0
      state = jax.tree.map(lambda new, old: jnp.where(used, new, old), stepped, state)
      return state, (loss, used)

    state, (losses, used) = jax.lax.scan(one_batch, state, (indices, weights))
    base_loss = jnp.sum(jnp.where(used, losses, 0.0)) / jnp.maximum(jnp.sum(used), 1)
    metrics = {"train/loss": base_loss}
    if recipe.adversarial:
      utility, grads = jax.value_and_grad(
          lambda p: inputs.alpha * auditor_utility(model, recipe, p, inputs.auditor))(
              state["params"])
      stepped = _sgd_step(recipe, state, grads, recipe.attacker_lr)
      state = jax.tree.map(lambda new, old: jnp.where(inputs.alpha > 0, new, old), stepped,
                           state)
      metrics["train/auditor_utility"] = utility / jnp.maximum(inputs.alpha, 1e-12)
    return state, metrics

  def chunk(state, inputs, x_train, start, stop):
    return replicas.scan_chunk(lambda state, epoch: one_epoch(state, epoch, inputs, x_train),
                               state, start, stop, recipe.chunk_epochs)

  return chunk


def vectorize(chunk, sharding: jax.sharding.Sharding | None = None):
  """jit(vmap over replicas); the training images are shared, the state donated."""
  return jax.jit(jax.vmap(chunk, in_axes=(0, 0, None, None, None)), donate_argnums=0,
                 out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def chunk_function(model: functional.Functional, recipe: Recipe,
                   sharding: jax.sharding.Sharding | None = None):
  return vectorize(replica_chunk(model, recipe), sharding)


@dataclasses.dataclass
class PhaseResult:
  params: PyTree          # replica-stacked
  history: list[dict[str, Any]]
  wall_s: float
  earlier_s: float


def run_phase(model: functional.Functional, recipe: Recipe, init_params: PyTree,
              inputs: ReplicaInputs, x_train: np.ndarray, *, mesh: jax.sharding.Mesh,
              workdir: str | os.PathLike | None = None, desc: str = "train",
              progress: bool = True) -> PhaseResult:
  """Trains every replica for `recipe.epochs` epochs from `init_params` (replica-stacked),
  resuming from `workdir/checkpoints` when present."""
  num_replicas = inputs.alpha.shape[0]
  sharding = replicas.replica_sharding(num_replicas, mesh)
  inputs = replicas.place(inputs, mesh)
  x_train = jax.device_put(jnp.asarray(x_train), parallel.replicated(mesh))
  chunk = chunk_function(model, recipe, sharding)
  init = jax.jit(jax.vmap(functools.partial(init_state, recipe=recipe)))
  run = replicas.run_chunks(
      lambda: init(init_params),
      lambda state, start, stop: chunk(state, inputs, x_train, start, stop),
      steps=recipe.epochs, chunk_steps=recipe.chunk_epochs, ckpt_every=recipe.chunk_epochs,
      mesh=mesh, workdir=workdir, desc=desc, progress=progress)
  return PhaseResult(params=run.state["params"], history=run.history, wall_s=run.wall_s,
                     earlier_s=run.earlier_s)


def batches_per_epoch(max_set_size: int, batch_size: int) -> int:
  return max(1, math.ceil(max_set_size / batch_size))
