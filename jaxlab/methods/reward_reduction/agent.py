"""Envelope Q-learning (Yang et al. 2019) in the reduced reward space, with its reduction trained
online: every environment step of every seed is one step of one `lax.scan`.

Q(s, w) in R^{A x m} for preference w in the m-simplex. Per environment step (one replica):
1. act epsilon-greedily on w^T Q(s, w) with the episode's w (Dirichlet(1), redrawn per episode);
2. step the intersection, write (s, a, raw K-dim reward, s') to the replay buffer, feed the
   reward to the reduction's running statistics;
3. after `learning_starts`: one envelope update on 32 replayed transitions x 4 sampled weights,
   with rewards reduced by the *current* reduction (no gradient into it); every
   `reduction_interval` steps, one reduction update on 32 replayed raw rewards; every
   `target_every` steps the target network copies the online one.

The envelope target for a transition (s, a, r, s') and preference w is
y = f(r) + gamma Q_target(s', w'*)[a*], where (a*, w'*) maximise w^T Q_online(s', w')[a'] over the
actions and the sampled preferences w'. The loss is the homotopy
(1 - lambda) mean ||Q(s, w)[a] - y||^2 + lambda mean (w^T Q(s, w)[a] - w^T y)^2, lambda rising
from 0 to 1 over `homotopy_steps`. Episodes end by the time limit only, so the target always
bootstraps (as sumo-rl's truncation).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.methods.reward_reduction import reduction as reduction_lib
from jaxlab.methods.reward_reduction import traffic
from jaxlab.zoo import functional
from jaxlab.zoo import mlp

PyTree = Any


@dataclasses.dataclass(frozen=True)
class AgentSettings:
  reduction: reduction_lib.ReductionSettings
  traffic: traffic.TrafficConfig = traffic.TrafficConfig()
  hidden: tuple[int, ...] = (128, 128)
  learning_rate: float = 3e-4
  batch_size: int = 32
  num_sample_w: int = 4
  gamma: float = 0.99
  epsilon_start: float = 1.0
  epsilon_end: float = 0.05
  epsilon_fraction: float = 0.1        # of total_steps
  learning_starts: int = 200
  target_every: int = 500
  max_grad_norm: float = 0.1
  homotopy_steps: int = 15_000
  total_steps: int = 20_000
  # Replay capacity, a ring buffer. Its own setting, so that a run extended past `total_steps`
  # restores into the same shapes; 52,000 holds a whole paper-preset run, so no preset ever
  # overwrites a transition (as when the buffer was sized by the run).
  buffer_size: int = 52_000
  reduction_interval: int = 5
  reduction_batch: int = 32
  chunk_steps: int = 1_000

  @property
  def dim(self) -> int:
    return self.reduction.output_dim


@functools.lru_cache(maxsize=None)
def q_network(obs_dim: int, dim: int, hidden: tuple[int, ...]) -> functional.Functional:
  """MLP([s, w]) -> [A * m]: the preference enters as an input next to the observation."""
  return functional.Functional(lambda rngs: mlp.MLP(
      [obs_dim + dim, *hidden, traffic.NUM_PHASES * dim], activation="relu", torch_init=True,
      rngs=rngs))


def q_values(settings: AgentSettings, params: PyTree, obs: jax.Array, w: jax.Array) -> jax.Array:
  """[..., obs], [..., m] -> [..., A, m]."""
  net = q_network(traffic.OBSERVATION_SIZE, settings.dim, settings.hidden)
  out = net.apply(params, jnp.concatenate([obs, w], axis=-1))
  return out.reshape(*out.shape[:-1], traffic.NUM_PHASES, settings.dim)


def sample_preferences(key: jax.Array, dim: int, count: int | None = None) -> jax.Array:
  """Dirichlet(1) points of the `dim`-simplex: [dim] or [count, dim]."""
  shape = () if count is None else (count,)
  return jax.random.dirichlet(key, jnp.ones(dim), shape).astype(jnp.float32)


def epsilon_at(settings: AgentSettings, step: jax.Array) -> jax.Array:
  """Random actions before `learning_starts`, then epsilon falls linearly over
  `epsilon_fraction` of the total steps (the official 5,200 of 52,000)."""
  decay_steps = max(1, int(settings.epsilon_fraction * settings.total_steps))
  fraction = jnp.clip((step - settings.learning_starts) / decay_steps, 0.0, 1.0)
  return settings.epsilon_start + fraction * (settings.epsilon_end - settings.epsilon_start)


def homotopy_lambda(settings: AgentSettings, step: jax.Array) -> jax.Array:
  learning = jnp.maximum(step - settings.learning_starts, 0)
  return jnp.clip(learning / max(1, settings.homotopy_steps), 0.0, 1.0)


def envelope_targets(settings: AgentSettings, online: PyTree, target: PyTree,
                     next_obs: jax.Array, rewards: jax.Array, w: jax.Array,
                     sampled_w: jax.Array) -> jax.Array:
  """y [B, J, m] for transitions [B] under preferences w [J, m], the envelope taken over the
  actions and the sampled preferences [N, m]."""
  pairs_obs = jnp.repeat(next_obs[:, None], sampled_w.shape[0], axis=1)          # [B, N, obs]
  pairs_w = jnp.broadcast_to(sampled_w, (next_obs.shape[0], *sampled_w.shape))   # [B, N, m]
  next_online = q_values(settings, online, pairs_obs, pairs_w)                   # [B, N, A, m]
  next_target = q_values(settings, target, pairs_obs, pairs_w)
  scalar = jnp.einsum("bnam,jm->bjna", next_online, w)                           # [B, J, N, A]
  flat = scalar.reshape(*scalar.shape[:2], -1)
  best = jnp.argmax(flat, axis=-1)                                               # [B, J]
  chosen = jnp.take_along_axis(
      next_target.reshape(next_target.shape[0], 1, -1, settings.dim),
      best[..., None, None], axis=2)[:, :, 0]                                    # [B, J, m]
  return rewards[:, None] + settings.gamma * chosen


def q_loss(settings: AgentSettings, params: PyTree, target_params: PyTree, batch: PyTree,
           sampled_w: jax.Array, lam: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The homotopy loss of the envelope update; also returns the mean TD error norm."""
  y = jax.lax.stop_gradient(envelope_targets(settings, params, target_params,
                                             batch["next_obs"], batch["reward"], sampled_w,
                                             sampled_w))                           # [B, J, m]
  obs = jnp.repeat(batch["obs"][:, None], sampled_w.shape[0], axis=1)              # [B, J, obs]
  w = jnp.broadcast_to(sampled_w, (batch["obs"].shape[0], *sampled_w.shape))       # [B, J, m]
  q = q_values(settings, params, obs, w)                                           # [B, J, A, m]
  q_sa = jnp.take_along_axis(q, batch["action"][:, None, None, None], axis=2)[:, :, 0]
  critic = jnp.mean((q_sa - y) ** 2)
  auxiliary = jnp.mean((jnp.sum(w * q_sa, -1) - jnp.sum(w * y, -1)) ** 2)
  return (1.0 - lam) * critic + lam * auxiliary, critic


def q_optimizer(settings: AgentSettings) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(settings.max_grad_norm),
                     optax.adam(settings.learning_rate))


def orthogonal_init(params: PyTree, key: jax.Array) -> PyTree:
  """Every kernel orthogonal (gain 1) and every bias 0: the official Q-network's init."""
  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(key, len(leaves))
  out = []
  for (path, leaf), leaf_key in zip(leaves, keys):
    name = str(path[-1])
    if "kernel" in name:
      out.append(jax.nn.initializers.orthogonal()(leaf_key, leaf.shape, leaf.dtype))
    else:
      out.append(jnp.zeros_like(leaf))
  return jax.tree_util.tree_unflatten(tree, out)


def q_params(settings: AgentSettings, key: jax.Array) -> PyTree:
  """One seed's initial Q-network parameters (`key` as `init_replica` gets it).

  Call it outside jit, once per seed (as `training.init_function` does): in one compiled
  program of several seeds, XLA:CPU runs the layers' seed-batched QR factorisations at once, and
  jaxlib 0.10's batched LAPACK kernels each hold a thread-pool worker while waiting for batch
  chunks queued on that same pool, so with as many such calls as workers (2 on 2 cores) the
  pool deadlocks: the process idles forever. Called eagerly, the QRs run one after another.
  """
  net_key = jax.random.split(key, 4)[0]
  network = q_network(traffic.OBSERVATION_SIZE, settings.dim, settings.hidden)
  return orthogonal_init(jax.jit(network.init)(net_key), net_key)


def init_replica(settings: AgentSettings, env_params: traffic.TrafficParams,
                 key: jax.Array, params: PyTree) -> PyTree:
  """One seed's training state around its Q-network parameters `params` (`q_params`)."""
  _, reduction_key, env_key, w_key = jax.random.split(key, 4)
  env_state, obs = traffic.reset(env_key, env_params, settings.traffic)
  size = settings.buffer_size
  k = settings.reduction.num_objectives
  return {
      "params": params, "target_params": params,
      "opt_state": q_optimizer(settings).init(params),
      "reduction": reduction_lib.make(settings.reduction).init(reduction_key),
      "env": env_state, "obs": obs, "w": sample_preferences(w_key, settings.dim),
      "buffer": {"obs": jnp.zeros((size, traffic.OBSERVATION_SIZE), jnp.float32),
                 "action": jnp.zeros(size, jnp.int32),
                 "reward": jnp.zeros((size, k), jnp.float32),
                 "next_obs": jnp.zeros((size, traffic.OBSERVATION_SIZE), jnp.float32)},
      "episode_return": jnp.zeros(k, jnp.float32),
      "last_episode_return": jnp.full(k, jnp.nan, jnp.float32),
  }


def filled(settings: AgentSettings, index: jax.Array) -> jax.Array:
  """How many replay slots hold a transition once step `index` has written its own."""
  return jnp.minimum(index + 1, settings.buffer_size)


def latest_slots(settings: AgentSettings, steps: int, count: int = 5000) -> np.ndarray:
  """Replay slots of the latest min(count, stored) transitions after `steps` steps, oldest first
  (step t writes slot t % buffer_size)."""
  stored = min(steps, settings.buffer_size)
  return np.arange(steps - min(count, stored), steps) % settings.buffer_size


def replica_chunk(settings: AgentSettings):
  """(state, key, env_params, start, stop) -> (state, metrics): `chunk_steps` environment steps
  of one replica (those at or past `stop` are no-ops)."""
  reduction = reduction_lib.make(settings.reduction)
  tx = q_optimizer(settings)

  def q_update(state, index, key):
    sample_key, w_key = jax.random.split(key)
    rows = jax.random.randint(sample_key, (settings.batch_size,), 0, filled(settings, index))
    buffer = state["buffer"]
    batch = {"obs": buffer["obs"][rows], "action": buffer["action"][rows],
             "next_obs": buffer["next_obs"][rows],
             "reward": reduction.reduce(state["reduction"], buffer["reward"][rows])}
    sampled_w = sample_preferences(w_key, settings.dim, settings.num_sample_w)
    (loss, critic), grads = jax.value_and_grad(q_loss, argnums=1, has_aux=True)(
        settings, state["params"], state["target_params"], batch, sampled_w,
        homotopy_lambda(settings, index))
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    return {**state, "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state}, loss

  def reduction_update(state, index, key):
    sample_key, dropout_key = jax.random.split(key)
    rows = jax.random.randint(sample_key, (settings.reduction_batch,), 0,
                              filled(settings, index))
    reduced, loss = reduction.update(state["reduction"], state["buffer"]["reward"][rows],
                                     dropout_key)
    return {**state, "reduction": reduced}, loss

  def env_step(state, index, key, env_params):
    keys = jax.random.split(jax.random.fold_in(key, index), 7)
    scalar = jnp.einsum("am,m->a", q_values(settings, state["params"], state["obs"],
                                            state["w"]), state["w"])
    explore = jax.random.uniform(keys[0]) < epsilon_at(settings, index)
    action = jnp.where(explore, jax.random.randint(keys[1], (), 0, traffic.NUM_PHASES),
                       jnp.argmax(scalar)).astype(jnp.int32)
    env, next_obs, reward, done = traffic.step(state["env"], action, keys[2], env_params,
                                               settings.traffic)
    buffer = state["buffer"]
    slot = index % settings.buffer_size
    buffer = {"obs": buffer["obs"].at[slot].set(state["obs"]),
              "action": buffer["action"].at[slot].set(action),
              "reward": buffer["reward"].at[slot].set(reward),
              "next_obs": buffer["next_obs"].at[slot].set(next_obs)}
    discount = settings.gamma ** env.decision.astype(jnp.float32)
    episode_return = state["episode_return"] + discount * reward
    reset_env, reset_obs = traffic.reset(keys[3], env_params, settings.traffic)
    state = {**state, "buffer": buffer,
             "reduction": reduction.observe(state["reduction"], reward),
             "env": jax.tree.map(lambda new, old: jnp.where(done, new, old), reset_env, env),
             "obs": jnp.where(done, reset_obs, next_obs),
             "w": jnp.where(done, sample_preferences(keys[4], settings.dim), state["w"]),
             "episode_return": jnp.where(done, 0.0, episode_return),
             "last_episode_return": jnp.where(done, episode_return,
                                              state["last_episode_return"])}
    learning = index >= settings.learning_starts
    state, loss = jax.lax.cond(learning, q_update,
                               lambda s, i, k: (s, jnp.float32(0.0)), state, index, keys[5])
    # The official schedule: from the first full reduction batch on, every `interval` steps.
    state, reduction_loss = jax.lax.cond(
        (index >= settings.reduction_batch) & (index % settings.reduction_interval == 0),
        reduction_update,
        lambda s, i, k: (s, jnp.float32(0.0)), state, index, keys[6])
    state = jax.lax.cond(index % settings.target_every == 0,
                         lambda s: {**s, "target_params": s["params"]}, lambda s: s, state)
    return state, {"train/loss": loss, "train/reduction_loss": reduction_loss,
                   "train/epsilon": epsilon_at(settings, index)}

  def one_replica(state, key, env_params, start, stop):
    # `start` and `stop` are shared by the replicas (unbatched under vmap), so the condition
    # stays a branch: a step past `stop` does no work and copies nothing (a select would copy
    # the replay buffer every step).
    def body(state, index):
      return jax.lax.cond(index < stop, lambda s: env_step(s, index, key, env_params),
                          lambda s: (s, empty), state)

    empty = jax.eval_shape(lambda s: env_step(s, start, key, env_params)[1], state)
    empty = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), empty)
    state, metrics = jax.lax.scan(body, state, start + jnp.arange(settings.chunk_steps))
    last = jnp.clip(stop - start - 1, 0, settings.chunk_steps - 1)
    metrics = jax.tree.map(lambda m: m[last], metrics)
    return state, {**metrics,
                   "train/episode_utility": jnp.mean(state["last_episode_return"])}

  return one_replica


def rollout_returns(settings: AgentSettings, policy, env_params: traffic.TrafficParams,
                    key: jax.Array) -> jax.Array:
  """[K]: the discounted original (K-dim) return of one episode of `policy(obs, key) -> action`,
  the arrivals drawn from `key` (the same key gives every policy the same traffic)."""
  reset_key, arrivals_key, action_key = jax.random.split(key, 3)
  env, obs = traffic.reset(reset_key, env_params, settings.traffic)

  def step(carry, t):
    env, obs, total = carry
    action = policy(obs, jax.random.fold_in(action_key, t))
    env, obs, reward, _ = traffic.step(env, action, jax.random.fold_in(arrivals_key, t),
                                       env_params, settings.traffic)
    # The official discounting: sum_t gamma^(t + 1) r_t.
    discount = settings.gamma ** (t + 1).astype(jnp.float32)
    return (env, obs, total + discount * reward), None

  k = settings.reduction.num_objectives
  (_, _, total), _ = jax.lax.scan(step, (env, obs, jnp.zeros(k, jnp.float32)),
                                  jnp.arange(settings.traffic.episode_decisions))
  return total


def greedy_returns(settings: AgentSettings, params: PyTree, env_params: traffic.TrafficParams,
                   preferences: jax.Array, keys: jax.Array) -> jax.Array:
  """[P, K]: one greedy episode per preference [P, m], episode p's traffic drawn from keys[p]."""
  def one(w, key):
    def policy(obs, unused_key):
      return jnp.argmax(jnp.einsum("am,m->a", q_values(settings, params, obs, w), w))
    return rollout_returns(settings, policy, env_params, key)
  return jax.vmap(one)(preferences, keys)


def random_policy_returns(settings: AgentSettings, env_params: traffic.TrafficParams,
                          keys: jax.Array) -> jax.Array:
  """[E, K]: uniformly random phases, one episode per key."""
  def policy(unused_obs, key):
    return jax.random.randint(key, (), 0, traffic.NUM_PHASES)
  return jax.vmap(lambda key: rollout_returns(settings, policy, env_params, key))(keys)
