"""Imitation of local branching (a deviation: the paper trains the destroy policy by RL; our
REINFORCE fine-tuning, `reinforce`, can follow it).

Labels (`collect`): from SCIP's starting solution (as LNS starts) on a training instance, repeatedly solve the
local-branching MIP (sum_j |x_j - x_j^t| <= kappa, kappa = `kappa_rate` x the integer
variables) and record the state and, per variable, the most significant bit in which the LB
solution differs from the incumbent (`target_bit`; d where it does not change); the incumbent
then moves to the LB solution. An LB step that finds nothing better ends the trajectory.

* Destroy targets with binarized tightening: the virtual variable (j, target_bit_j) is positive,
  every other bit of an integer variable negative (releasing from that bit is the smallest
  release that reaches the LB value). Without it (`whole=True`): bit 0 positive iff j changed.
* Branch targets (`branch_targets`): the fixed variables of the policy's own neighbourhood at the
  state that change in the LB solution (the "wrongly fixed" variables).

`fit` trains by class-weighted binary cross-entropy (positives weighted by negatives /
positives, capped) with Adam, minibatches of same-bucket graphs, one compiled step: the destroy
head with the whole network, or the branch head alone on a trained destroy network (the trunk's
gradient is stopped, so its parameters, and the destroy head's, stay as they were).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.core import metrics as metrics_lib
from jaxlab.methods.btbs_lns import features
from jaxlab.methods.btbs_lns import instances
from jaxlab.methods.btbs_lns import neighbourhood
from jaxlab.methods.btbs_lns import policy as policy_lib
from jaxlab.methods.btbs_lns import solvers

MAX_POSITIVE_WEIGHT = 100.0


@dataclasses.dataclass(frozen=True)
class LabelSpec:
  steps: int = 8
  kappa_rate: float = 0.1
  time_limit: float | None = 1.0
  node_limit: int | None = None
  # The trajectory starts where test-time LNS does (`lns.LnsSpec.start`).
  start: str = "first"
  start_time_limit: float = 2.4

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"labels.steps must be >= 1, got {self.steps}")
    if not self.kappa_rate > 0:
      raise ValueError(f"labels.kappa_rate must be > 0, got {self.kappa_rate}")


@dataclasses.dataclass(frozen=True)
class FitSpec:
  steps: int = 150
  batch_size: int = 4
  learning_rate: float = 1e-3

  def __post_init__(self):
    if self.steps < 1 or self.batch_size < 1 or not self.learning_rate > 0:
      raise ValueError(f"train steps and batch_size must be >= 1 and the learning rate > 0, "
                       f"got {self}")


@dataclasses.dataclass
class Sample:
  """One labelled state: the instance's static features, the incumbent, LB's first changed bit."""
  static: features.StaticFeatures
  x: np.ndarray
  target_bit: np.ndarray


def collect(mip: instances.MIP, spec: LabelSpec, max_bits: int, seed: int = 0
            ) -> list[Sample]:
  """The LB trajectory's labelled states on one training instance."""
  static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), max_bits)
  x = solvers.first_solution(mip, seed=seed, rule=spec.start,
                             time_limit=spec.start_time_limit).x
  best = mip.objective(x)
  kappa = max(1.0, spec.kappa_rate * int(mip.integrality.sum()))
  samples = []
  for step in range(spec.steps):
    objective, candidate = solvers.local_branching(
        mip, x, kappa, time_limit=spec.time_limit, node_limit=spec.node_limit,
        seed=seed + step)
    if not solvers.improves(objective, best):
      break
    target = neighbourhood.first_changed_bit(features.incumbent_bits(static, x),
                                             features.incumbent_bits(static, candidate),
                                             static.num_bits)
    samples.append(Sample(static, x, target))
    x, best = candidate, objective
  return samples


def destroy_targets(sample: Sample, whole: bool) -> tuple[np.ndarray, np.ndarray]:
  """(labels, mask) [n, D] of the destroy head."""
  num_bits, depth = sample.static.num_bits, sample.static.max_bits
  position = np.arange(depth)[None]
  mask = position < num_bits[:, None]
  changed = sample.target_bit < num_bits
  if whole:
    mask = mask & (position == 0)
    labels = changed[:, None] & (position == 0)
  else:
    labels = changed[:, None] & (position == sample.target_bit[:, None])
  return labels.astype(np.float32), mask


def branch_targets(sample: Sample, first_bit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(labels, mask) [n]: over the neighbourhood's fixed integer variables, changed in LB."""
  num_bits = sample.static.num_bits
  fixed = (first_bit >= num_bits) & (num_bits > 0)
  changed = sample.target_bit < num_bits
  return (fixed & changed).astype(np.float32), fixed


def bucket_of_samples(samples: list[Sample]) -> tuple[int, int, int]:
  buckets = [features.bucket_of(features.graph_at(s.static, s.x)) for s in samples]
  return tuple(int(max(b[k] for b in buckets)) for k in range(3))


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
  return np.pad(array, [(0, rows - array.shape[0])] + [(0, 0)] * (array.ndim - 1))


def _dataset(samples: list[Sample], bucket, targets, neighbourhoods=None):
  """(graphs, released [B, N], labels, masks): `targets(sample, first_bit)` gives the labels."""
  graphs, released, labels, masks = [], [], [], []
  for index, sample in enumerate(samples):
    graphs.append(features.pad(features.graph_at(sample.static, sample.x), bucket))
    first_bit = None if neighbourhoods is None else neighbourhoods[index]
    chosen = (np.zeros(sample.x.shape[0], bool) if first_bit is None
              else first_bit < sample.static.num_bits)
    released.append(_pad_rows(chosen, bucket[0]))
    label, mask = targets(sample, first_bit)
    labels.append(_pad_rows(label, bucket[0]))
    masks.append(_pad_rows(mask, bucket[0]))
  return features.stack(graphs), np.stack(released), np.stack(labels), np.stack(masks)


def destroy_dataset(samples: list[Sample], bucket, whole: bool):
  """The destroy head's (graphs, released (none), labels, masks)."""
  return _dataset(samples, bucket, lambda sample, _: destroy_targets(sample, whole))


def branch_dataset(samples: list[Sample], bucket, neighbourhoods: list[np.ndarray]):
  """The branch head's (graphs, released, labels, masks): each state with the destroy policy's
  neighbourhood there (`first_bit` per sample)."""
  if len(neighbourhoods) != len(samples):
    raise ValueError(f"{len(samples)} samples but {len(neighbourhoods)} neighbourhoods")
  return _dataset(samples, bucket, branch_targets, neighbourhoods)


def weighted_bce(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean over masked entries of BCE with positives weighted by negatives / positives."""
  mask = mask.astype(jnp.float32)
  positives = jnp.sum(labels * mask)
  negatives = jnp.sum((1 - labels) * mask)
  weight = jnp.clip(negatives / jnp.maximum(positives, 1.0), 1.0, MAX_POSITIVE_WEIGHT)
  per_entry = optax.sigmoid_binary_cross_entropy(logits, labels)
  per_entry = per_entry * jnp.where(labels > 0, weight, 1.0) * mask
  return jnp.sum(per_entry) / jnp.maximum(jnp.sum(mask), 1.0)


@functools.lru_cache(maxsize=None)
def adam_for(learning_rate: float) -> optax.GradientTransformation:
  """One optimizer object per rate, so the compiled step is reused across fits."""
  return optax.adam(learning_rate)


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(3, 4))
def _train_step(policy: policy_lib.Policy, head: str, optimizer, params, opt_state, graphs,
                released, labels, masks):
  def loss_fn(p):
    destroy, branch = jax.vmap(lambda g, r: policy_lib.logits(
        policy, p, g, r, frozen_trunk=head == "branch"))(graphs, released)
    return weighted_bce(destroy if head == "destroy" else branch, labels, masks)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def fit(policy: policy_lib.Policy, params, dataset, head: str, spec: FitSpec, *, seed: int = 0,
        progress: bool = True, desc: str = "fit") -> tuple[object, list[float]]:
  """Trains `head` of `params` on (graphs, released, labels, masks): "destroy" the network, or
  "branch" the branch head alone (`params` a trained destroy network's)."""
  if head not in ("destroy", "branch"):
    raise ValueError(f"head must be 'destroy' or 'branch', got {head!r}")
  graphs, released, labels, masks = dataset
  size = labels.shape[0]
  if size == 0:
    raise ValueError("no labelled states to train on (every LB step failed to improve)")
  # The step donates its parameters; the caller's (a destroy network a branch head starts
  # from) must survive.
  params = jax.tree.map(jnp.copy, params)
  optimizer = adam_for(float(spec.learning_rate))
  opt_state = optimizer.init(params)
  rng = np.random.default_rng(seed)
  losses = []
  for step in metrics_lib.progress_iter(list(range(spec.steps)), desc, enabled=progress):
    index = rng.choice(size, min(spec.batch_size, size), replace=False)
    batch = jax.tree.map(lambda a: a[index], graphs)
    params, opt_state, loss = _train_step(policy, head, optimizer, params, opt_state, batch,
                                          released[index], labels[index], masks[index])
    if step % 10 == 0 or step == spec.steps - 1:
      losses.append(float(loss))
  return params, losses
