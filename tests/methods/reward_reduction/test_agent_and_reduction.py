"""reward_reduction: the envelope target, the reductions, one trace, bad configs."""
from __future__ import annotations

import dataclasses
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import reward_reduction as experiment
from jaxlab.core import config as config_lib
from jaxlab.methods.reward_reduction import agent
from jaxlab.methods.reward_reduction import training
from jaxlab.methods.reward_reduction import reduction
from jaxlab.methods.reward_reduction import traffic

ROOT = pathlib.Path(__file__).resolve().parents[3]
TINY = agent.AgentSettings(reduction=reduction.ReductionSettings(method="ours"),
                           traffic=traffic.TrafficConfig(episode_decisions=10), hidden=(8,),
                           learning_starts=4, target_every=5, homotopy_steps=10,
                           total_steps=20, chunk_steps=5, reduction_batch=4, buffer_size=8)


def test_envelope_target_equals_a_loop():
  net = agent.q_network(traffic.OBSERVATION_SIZE, 4, (8,))
  online, target = net.init(jax.random.key(0)), net.init(jax.random.key(1))
  next_obs = jax.random.uniform(jax.random.key(2), (3, traffic.OBSERVATION_SIZE))
  rewards = jax.random.normal(jax.random.key(3), (3, 4))
  sampled = agent.sample_preferences(jax.random.key(4), 4, 5)
  y = agent.envelope_targets(TINY, online, target, next_obs, rewards, sampled[:2], sampled)
  for b in range(3):
    for j in range(2):
      best, best_value = None, -np.inf
      for k in range(5):
        q = np.asarray(agent.q_values(TINY, online, next_obs[b], sampled[k]))
        for a in range(traffic.NUM_PHASES):
          value = float(q[a] @ np.asarray(sampled[j]))
          if value > best_value:
            best, best_value = (k, a), value
      q_target = np.asarray(agent.q_values(TINY, target, next_obs[b], sampled[best[0]]))
      np.testing.assert_allclose(y[b, j], rewards[b] + 0.99 * q_target[best[1]], rtol=1e-5,
                                 atol=1e-5)


def test_ours_is_positive_and_row_stochastic_and_pca_is_numpy_eigh():
  settings = reduction.ReductionSettings(method="ours")
  ours = reduction.make(settings)
  state = ours.init(jax.random.key(0))
  rewards = jax.random.normal(jax.random.key(1), (64, 16)) * jnp.arange(1, 17)[None]
  for i in range(20):
    state, _ = ours.update(state, rewards[:32], jax.random.key(i))
  a = np.asarray(ours.matrix(state))
  assert np.all(a > 0) and np.allclose(a.sum(1), 1.0, atol=1e-6)
  pca = reduction.make(reduction.ReductionSettings(method="pca"))
  state = pca.init(jax.random.key(0))
  for r in rewards:
    state = pca.observe(state, r)
  state, _ = pca.update(state, rewards, jax.random.key(0))
  data = np.asarray(rewards, np.float64)
  cov = np.cov(data.T, bias=True)
  np.testing.assert_allclose(np.asarray(state["mean"]), data.mean(0), rtol=1e-4, atol=1e-4)
  values, vectors = np.linalg.eigh(cov)
  expected = vectors[:, ::-1][:, :4].T
  got = np.asarray(pca.matrix(state))
  # Eigenvectors are defined up to sign.
  np.testing.assert_allclose(np.abs(np.sum(got * expected, axis=1)), 1.0, atol=1e-3)


def test_the_chunk_traces_once_and_learns_without_nans():
  chex.clear_trace_counter()
  env = traffic.demand(0, TINY.traffic, vehicles=200.0, weibull_scale=60.0)
  counted = chex.assert_max_traces(agent.replica_chunk(TINY), n=1)
  chunk = jax.jit(jax.vmap(counted, in_axes=(0, 0, None, None, None)))
  keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
  state = training.init_function(TINY)(env, keys)
  for start in range(0, 20, 5):
    state, metrics = chunk(state, keys, env, jnp.asarray(start), jnp.asarray(start + 5))
  chex.clear_trace_counter()
  assert np.all(np.isfinite(np.asarray(metrics["train/loss"])))
  assert np.all(np.asarray(metrics["train/loss"]) > 0)


def test_a_full_replay_buffer_keeps_the_latest_transitions_in_its_ring():
  # No Q update (learning starts after the run), so both buffers see the same transitions.
  env = traffic.demand(0, TINY.traffic, vehicles=200.0, weibull_scale=60.0)
  buffers = {}
  for size in (20, 8):
    settings = dataclasses.replace(TINY, learning_starts=20, buffer_size=size)
    key = jax.random.key(0)
    state = agent.init_replica(settings, env, key, agent.q_params(settings, key))
    chunk = jax.jit(agent.replica_chunk(settings))
    for start in range(0, 20, 5):
      state, _ = chunk(state, jax.random.key(0), env, jnp.asarray(start), jnp.asarray(start + 5))
    buffers[size] = jax.tree.map(np.asarray, state["buffer"])
  for name, whole in buffers[20].items():
    ring = buffers[8][name]
    for step in range(12, 20):
      np.testing.assert_array_equal(ring[step % 8], whole[step], err_msg=f"{name} {step}")


@pytest.mark.parametrize("override, key", [
    ({"reduction.reduced_dim": 16}, "reduction.reduced_dim"),
    ({"methods": "ours,svd"}, "methods"),
    ({"agent.homotopy_steps": 10**9}, "agent.homotopy_steps"),
    ({"agent.buffer_size": 4}, "agent.buffer_size"),
])
def test_bad_config_fails_before_compiling_naming_the_key(override, key, tmp_path):
  config = config_lib.override(
      config_lib.load_config(ROOT / "configs" / "reward_reduction.py", "smoke"), override)
  with pytest.raises(config_lib.ConfigError, match=repr(key).replace(".", r"\.")):
    experiment.main(config, str(tmp_path))


def test_the_q_networks_are_initialised_seed_by_seed_as_one_batched_program_would():
  # In one jit(vmap) program the layers' batched QRs deadlock XLA:CPU's 2-thread pool at the
  # paper's shapes (agent.q_params); the seed-by-seed init must give the same bits.
  env = traffic.demand(0, TINY.traffic, vehicles=200.0, weibull_scale=60.0)
  keys = jnp.stack([jax.random.key(0), jax.random.key(1), jax.random.key(2)])
  network = agent.q_network(traffic.OBSERVATION_SIZE, TINY.dim, TINY.hidden)

  def batched(key):
    net_key = jax.random.split(key, 4)[0]
    return agent.orthogonal_init(network.init(net_key), net_key)

  expected = jax.jit(jax.vmap(batched))(keys)
  state = training.init_function(TINY)(env, keys)
  chex.assert_trees_all_equal(state["params"], expected)
  chex.assert_trees_all_equal(state["target_params"], expected)
  kernel = next(np.asarray(leaf) for leaf in jax.tree.leaves(expected) if leaf.ndim == 3)
  small = min(kernel.shape[1:])  # orthonormal columns, or rows when the kernel is wide
  gram = (np.einsum("sij,sik->sjk", kernel, kernel) if kernel.shape[1] >= kernel.shape[2]
          else np.einsum("sji,ski->sjk", kernel, kernel))
  np.testing.assert_allclose(gram, np.broadcast_to(np.eye(small), gram.shape), atol=1e-5)


def test_reconstruction_error_reads_the_latest_filled_ring_slots():
  # A run shorter than the ring leaves its tail empty: the latest transitions are at the front.
  slots = lambda steps, size: agent.latest_slots(
      dataclasses.replace(TINY, buffer_size=size), steps, count=5)
  np.testing.assert_array_equal(slots(20, 52), [15, 16, 17, 18, 19])
  np.testing.assert_array_equal(slots(10, 8), [5, 6, 7, 0, 1])
  np.testing.assert_array_equal(slots(3, 8), [0, 1, 2])
  settings = dataclasses.replace(TINY, total_steps=20, buffer_size=52)
  rewards = np.zeros((1, 52, settings.reduction.num_objectives), np.float32)
  rewards[0, :20] = np.random.default_rng(0).normal(size=(20, rewards.shape[-1]))
  state = {"buffer": {"reward": rewards},
           "reduction": jax.tree.map(lambda leaf: leaf[None],
                                     reduction.make(settings.reduction).init(
                                         jax.random.key(0)))}
  assert experiment.reconstruction_errors(settings, state)[0] > 0
