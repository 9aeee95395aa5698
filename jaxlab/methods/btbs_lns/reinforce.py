"""REINFORCE fine-tuning of a destroy network (the paper's training signal; imitation of local
branching is our warm start, see `training`).

An episode runs `episode_steps` LNS steps on a training instance with the network being trained
(no branching), from where test-time LNS starts. The reward of a step is the objective's
decrease divided by |objective at the episode's start| (0 when the sub-MIP finds nothing better).

The log-probability of a sampled neighbourhood uses the factorisation the imitation loss uses:
each valid (variable, bit) is an independent Bernoulli of "the variable is released from this
bit", and the neighbourhood sets one such event per released variable (bit 0 only when the
network acts on whole variables). The loss is -(reward - mean reward of the episode) x that
log-probability, per masked entry; the Gumbel top-k sampler is the policy being improved, this
factorised surrogate the likelihood it follows (a deviation: the paper's exact estimator is not
in our notes).
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
from jaxlab.methods.btbs_lns import lns
from jaxlab.methods.btbs_lns import neighbourhood
from jaxlab.methods.btbs_lns import policy as policy_lib
from jaxlab.methods.btbs_lns import solvers
from jaxlab.methods.btbs_lns import training


@dataclasses.dataclass(frozen=True)
class ReinforceSpec:
  iterations: int = 0            # episodes, round-robin over the training instances; 0: none
  episode_steps: int = 8
  learning_rate: float = 1e-4
  sub_time_limit: float | None = 1.0
  sub_node_limit: int | None = None

  def __post_init__(self):
    if self.iterations < 0:
      raise ValueError(f"reinforce.iterations must be >= 0, got {self.iterations}")
    if self.episode_steps < 2:
      raise ValueError("reinforce.episode_steps must be >= 2: the baseline is the episode's "
                       f"mean reward, got {self.episode_steps}")
    if not self.learning_rate > 0:
      raise ValueError(f"reinforce.learning_rate must be > 0, got {self.learning_rate}")


@dataclasses.dataclass
class Transition:
  graph: features.Graph        # padded to the training bucket
  events: np.ndarray           # [N, D] 1 at each released variable's first released bit
  mask: np.ndarray             # [N, D] the entries the log-probability counts
  reward: float


def action_events(first_bit: np.ndarray, num_bits: np.ndarray, depth: int, whole: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
  """(events, mask) [n, depth] of a neighbourhood `first_bit` (d: variable fixed)."""
  position = np.arange(depth)[None]
  mask = position < num_bits[:, None]
  if whole:
    mask = mask & (position == 0)
  events = mask & (position == first_bit[:, None])
  return events.astype(np.float32), mask


def episode(mip: instances.MIP, static: features.StaticFeatures, policy: policy_lib.Policy,
            params, bucket, *, destroy_rate: float, whole: bool, spec: ReinforceSpec,
            start: str, start_time_limit: float, rng: np.random.Generator, seed: int
            ) -> list[Transition]:
  x = solvers.first_solution(mip, seed=seed, rule=start, time_limit=start_time_limit).x
  sub = solvers.SubMipSolver(mip, seed=seed)
  num_bits = static.num_bits
  budget = neighbourhood.budget_of(num_bits, destroy_rate)
  scale = max(abs(mip.objective(x)), 1.0)
  best = mip.objective(x)
  network = policy_lib.bind(policy, params)
  out = []
  for _ in range(spec.episode_steps):
    first_bit, graph = lns.sample_release(network, static, x, bucket, budget, rng,
                                          whole=whole)
    lower, upper = neighbourhood.bounds(mip, x, first_bit, num_bits)
    objective, candidate = sub.solve(lower, upper, x, time_limit=spec.sub_time_limit,
                                     node_limit=spec.sub_node_limit)
    reward = 0.0
    if solvers.improves(objective, best):
      reward = (best - objective) / scale
      x, best = candidate, objective
    events, mask = action_events(first_bit, num_bits, static.max_bits, whole)
    rows = bucket[0] - events.shape[0]
    out.append(Transition(graph, np.pad(events, [(0, rows), (0, 0)]),
                          np.pad(mask, [(0, rows), (0, 0)]), reward))
  return out


def surrogate_loss(destroy_logits: jax.Array, events: jax.Array, masks: jax.Array,
                   advantages: jax.Array) -> jax.Array:
  """-mean over transitions of advantage x log pi(events) per counted entry."""
  masks = masks.astype(jnp.float32)
  log_prob = -jnp.sum(optax.sigmoid_binary_cross_entropy(destroy_logits, events) * masks,
                      axis=(1, 2))
  return -jnp.mean(advantages * log_prob / jnp.maximum(jnp.sum(masks, axis=(1, 2)), 1.0))


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 3))
def _step(policy: policy_lib.Policy, optimizer, params, opt_state, graphs, events, masks,
          advantages):
  def loss_fn(p):
    destroy = jax.vmap(lambda g: policy_lib.destroy_logits(policy, p, g))(graphs)
    return surrogate_loss(destroy, events, masks, advantages)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def update(policy: policy_lib.Policy, optimizer, params, opt_state,
           transitions: list[Transition]):
  """One policy-gradient step on an episode; (params, opt_state, mean reward)."""
  rewards = np.asarray([t.reward for t in transitions], np.float32)
  advantages = rewards - rewards.mean()
  if np.all(advantages == 0):     # nothing to tell the steps apart
    return params, opt_state, float(rewards.mean())
  graphs = features.stack([t.graph for t in transitions])
  params, opt_state, _ = _step(policy, optimizer, params, opt_state, graphs,
                               np.stack([t.events for t in transitions]),
                               np.stack([t.mask for t in transitions]), advantages)
  return params, opt_state, float(rewards.mean())


def fine_tune(mips: list[instances.MIP], statics: list[features.StaticFeatures],
              policy: policy_lib.Policy, params, bucket, spec: ReinforceSpec, *,
              destroy_rate: float, whole: bool, start: str, start_time_limit: float,
              seed: int = 0, progress: bool = True, desc: str = "reinforce"
              ) -> tuple[object, list[float]]:
  """`spec.iterations` episodes and updates; (params, mean reward of each episode)."""
  optimizer = training.adam_for(float(spec.learning_rate))
  opt_state = optimizer.init(params)
  rng = np.random.default_rng(seed)
  rewards = []
  for iteration in metrics_lib.progress_iter(list(range(spec.iterations)), desc,
                                             enabled=progress):
    index = iteration % len(mips)
    transitions = episode(mips[index], statics[index], policy, params, bucket,
                          destroy_rate=destroy_rate, whole=whole, spec=spec, start=start,
                          start_time_limit=start_time_limit, rng=rng,
                          seed=seed + iteration)
    params, opt_state, reward = update(policy, optimizer, params, opt_state, transitions)
    rewards.append(reward)
  return params, rewards
