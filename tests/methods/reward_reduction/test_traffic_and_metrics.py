"""reward_reduction: the intersection model, the front metrics, and Pareto preservation."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.reward_reduction import metrics
from jaxlab.methods.reward_reduction import traffic

CONFIG = traffic.TrafficConfig(episode_decisions=30)


def run_episode(actions, params, config=CONFIG):
  state, _ = traffic.reset(jax.random.key(0), params, config)
  rewards = []
  for t, action in enumerate(actions):
    state, obs, reward, done = traffic.step(state, action, jax.random.key(t), params, config)
    rewards.append(reward)
  return state, obs, np.asarray(rewards), done


def test_vehicles_are_conserved_and_only_green_lanes_discharge():
  params = traffic.demand(0, CONFIG, vehicles=3000.0, weibull_scale=200.0)
  actions = [0] * 10 + [2] * 10 + [1, 3] * 5
  state, obs, rewards, done = run_episode(actions, params)
  on_lane = np.asarray(state.cohorts).sum(axis=1)
  np.testing.assert_allclose(np.asarray(state.arrived),
                             np.asarray(state.discharged) + on_lane, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(state.arrived), np.asarray(params.arrivals).sum(0))
  assert bool(done) and obs.shape == (traffic.OBSERVATION_SIZE,)
  assert np.all(rewards <= 0)
  # With phase 0 only, lanes served by other phases never discharge.
  state, *_ = run_episode([0] * 30, params)
  others = [l for l in range(16) if traffic.PHASE_OF_LANE[l] != 0]
  assert np.all(np.asarray(state.discharged)[others] == 0)
  assert np.all(np.asarray(state.discharged)[list(traffic.PHASE_LANES[0])] > 0)


def test_waiting_time_and_fifo_discharge_on_a_hand_case():
  config = traffic.TrafficConfig(episode_decisions=4, lane_length=0.0 + 1e-6)
  arrivals = np.zeros((4, 16), np.float32)
  arrivals[0, 3] = 12.0     # 12 vehicles on lane 3 (N left, phase 1) in decision 0
  arrivals[1, 3] = 5.0
  params = traffic.TrafficParams(jnp.asarray(arrivals))
  state, _ = traffic.reset(jax.random.key(0), params, config)
  # Decision 0 on phase 0 (no change): lane 3 is red; 12 vehicles wait from t = 10 s to 20 s.
  state, obs, reward, _ = traffic.step(state, 0, jax.random.key(0), params, config)
  np.testing.assert_allclose(reward[3], -12 * 10.0 / 100, rtol=1e-5)
  assert np.count_nonzero(np.asarray(reward)) == 1
  # Decision 1 switches to phase 1: 2 s yellow, floor(0.5 x 18) = 9 leave, the oldest first.
  state, obs, reward, _ = traffic.step(state, 1, jax.random.key(1), params, config)
  np.testing.assert_allclose(np.asarray(state.cohorts)[3, :2], [3.0, 5.0])
  # At t = 40 s: 3 vehicles since 10 s and 5 since 30 s.
  np.testing.assert_allclose(reward[3], -(3 * 30.0 + 5 * 10.0) / 100, rtol=1e-5)
  np.testing.assert_allclose(obs[:4], [0, 1, 0, 0])
  # Decision 2 stays on phase 1 (no yellow): 10 may leave, all 8 do.
  state, _, reward, _ = traffic.step(state, 1, jax.random.key(2), params, config)
  assert float(np.asarray(state.cohorts).sum()) == 0 and float(reward[3]) == 0


def test_jit_and_vmap_over_environments_agree_with_a_loop():
  params = traffic.demand(1, CONFIG)
  actions = jnp.asarray(np.random.default_rng(0).integers(0, 4, (3, 30)), jnp.int32)

  def episode(actions):
    state, _ = traffic.reset(jax.random.key(0), params, CONFIG)
    def body(state, a):
      state, _, reward, _ = traffic.step(state, a, jax.random.key(0), params, CONFIG)
      return state, reward
    return jax.lax.scan(body, state, actions)[1]

  batched = jax.jit(jax.vmap(episode))(actions)
  for i in range(3):
    _, _, rewards, _ = run_episode(list(np.asarray(actions[i])), params)
    np.testing.assert_allclose(batched[i], rewards, rtol=1e-6)


def test_demand_follows_the_route_file_shape():
  config = traffic.TrafficConfig()
  arrivals = np.asarray(traffic.demand(0, config).arrivals)
  assert abs(arrivals.sum() - 4000) < 200
  per_1000s = arrivals.reshape(4, 50, 16).sum(axis=(1, 2)) / arrivals.sum()
  np.testing.assert_allclose(per_1000s, [0.4325, 0.4503, 0.1105, 0.0068], atol=0.03)
  shares = traffic.lane_shares()
  assert shares.sum() == pytest.approx(1.0) and shares[3] < shares[0]


def inclusion_exclusion_hypervolume(points, ref):
  total = 0.0
  for size in range(1, len(points) + 1):
    for subset in itertools.combinations(points, size):
      corner = np.min(np.asarray(subset), axis=0)
      total += (-1) ** (size + 1) * np.prod(np.maximum(corner - ref, 0.0))
  return total


def test_hypervolume_equals_inclusion_exclusion():
  rng = np.random.default_rng(0)
  points = rng.uniform(-1.0, 0.0, (8, 3))
  ref = np.full(3, -1.5)
  assert metrics.hypervolume(points, ref) == pytest.approx(
      inclusion_exclusion_hypervolume(points, ref), rel=1e-9)
  assert metrics.hypervolume(np.full((1, 3), -2.0), ref) == 0.0


def test_expected_utility_sparsity_and_non_dominated():
  points = np.asarray([[0.0, 3.0], [1.0, 1.0], [3.0, 0.0], [0.5, 0.5], [1.0, 1.0]])
  np.testing.assert_array_equal(metrics.non_dominated(points), [1, 1, 1, 0, 0])
  weights = np.asarray([[1.0, 0.0], [0.5, 0.5]])
  assert metrics.expected_utility(points, weights) == pytest.approx((3.0 + 1.5) / 2)
  front = points[:3]
  # Sorted per objective: gaps (1, 2) and (1, 2): (1 + 4 + 1 + 4) / (3 - 1).
  assert metrics.sparsity(front) == pytest.approx(5.0)
  preferences = metrics.farthest_point_preferences(4, 20, candidates=2000)
  assert preferences.shape == (20, 4) and np.allclose(preferences.sum(1), 1.0, atol=1e-6)
  assert len({tuple(p) for p in preferences.round(6)}) == 20


def random_finite_returns(rng, count=30, k=16):
  return rng.normal(0.0, 1.0, (count, k))


def test_positive_row_stochastic_reduction_never_selects_a_dominated_return():
  rng = np.random.default_rng(0)
  for _ in range(200):
    returns = random_finite_returns(rng)
    returns = np.concatenate([returns, returns[:5] - rng.uniform(0.01, 1.0, (5, 16))])
    a = rng.dirichlet(np.ones(16), 4)                   # positive, rows sum to 1
    w = rng.dirichlet(np.ones(4))
    best = int(np.argmax(returns @ a.T @ w))
    assert metrics.non_dominated(returns)[best]


def test_a_signed_reduction_can_select_a_dominated_return():
  # A PCA-like signed row prefers lower values of objective 1: the dominated point wins.
  returns = np.zeros((2, 16))
  returns[1, 0] = -1.0        # point 1 is dominated by point 0
  a = np.zeros((4, 16))
  a[0, 0] = -1.0
  w = np.asarray([1.0, 0.0, 0.0, 0.0])
  best = int(np.argmax(returns @ a.T @ w))
  assert best == 1 and not metrics.non_dominated(returns)[best]
