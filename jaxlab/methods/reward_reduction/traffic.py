"""A 16-objective signalised intersection as a point-queue model, in pure JAX.

The paper's traffic task runs SUMO (sumo-rl's big intersection); SUMO cannot run here. This model
keeps the official geometry, demand, timing, observation and reward, and drops the car-following
physics:

* 16 incoming lanes: approaches N, E, S, W (lanes 4a .. 4a + 3), lane 0 right + straight, lanes
  1-2 straight, lane 3 left; 750 m long, 13.89 m/s (a 54 s approach), 100 vehicles of storage
  (length / (2.5 m gap + 5 m vehicle), sumo-rl's scale).
* 4 green phases (the official net.xml): 0 = N/S lanes 0-2, 1 = N/S lane 3, 2 = E/W lanes 0-2,
  3 = E/W lane 3. Every `decision_seconds` the agent picks the next green phase; a change costs
  `yellow_seconds` of lost green.
* Demand (the official route file's shape): 4,000 vehicles an episode with Weibull(2) departure
  times (scale 1,330 s: 43%, 45%, 11% and 0.7% of them in successive 1,000 s, as the route
  file), 75% straight and 25% turning, split evenly over routes; straight and right-turning
  vehicles share lanes 0-2, left-turners use lane 3. The arrival table [T, 16] is drawn once from
  the demand seed and replayed every episode, as SUMO replays its fixed route file.
* A lane on green discharges floor(saturation_flow x green seconds) vehicles that have reached
  the stop line, first in, first out.
* Queues are departure cohorts `[16, T]` (vehicles by lane and by the decision in which they
  entered, counted at its midpoint, reaching the stop line 54 s later), so each vehicle's waiting
  time is exact for the model: now - its time at the stop line, at most 1,000 s (sumo-rl's
  waiting-time memory).
* Reward (the official "waiting-time-lane"): r_l = -(summed waiting time in lane l) / 100.
* Observation (sumo-rl, 37 values): green phase one-hot (4), the min-green flag (1), lane
  densities (16: vehicles on the lane / storage, capped at 1) and queues (16: vehicles at the
  stop line / storage, capped at 1).

Lost versus SUMO: acceleration, car-following, lane changes (SUMO departs vehicles on random
lanes that change lanes on the way), spill-back and turning conflicts; the min-green flag is
constant 1 at 20 s decisions (as in sumo-rl, where the next decision is always past min green +
yellow). `reset` and `step` are pure functions: jit- and vmap-able.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

NUM_LANES = 16
NUM_PHASES = 4
OBSERVATION_SIZE = NUM_PHASES + 1 + 2 * NUM_LANES
REWARD_SCALE = 100.0
# Lane l is lane l % 4 of approach l // 4 (N, E, S, W); lane 3 turns left.
PHASE_LANES = (
    (0, 1, 2, 8, 9, 10),       # N/S straight and right
    (3, 11),                   # N/S left
    (4, 5, 6, 12, 13, 14),     # E/W straight and right
    (7, 15),                   # E/W left
)
PHASE_OF_LANE = tuple(next(p for p, lanes in enumerate(PHASE_LANES) if lane in lanes)
                      for lane in range(NUM_LANES))


@dataclasses.dataclass(frozen=True)
class TrafficConfig:
  """The intersection's fixed numbers (static: a change compiles anew)."""
  decision_seconds: int = 20
  yellow_seconds: int = 2
  min_green_seconds: int = 5
  episode_decisions: int = 200
  saturation_flow: float = 0.5       # vehicles per second per lane on green (1,800 / h)
  lane_length: float = 750.0         # metres
  speed: float = 13.89               # m/s on the approach
  vehicle_spacing: float = 7.5       # metres a vehicle takes in storage (2.5 gap + 5 length)
  waiting_memory: float = 1000.0     # seconds of waiting a vehicle remembers (sumo-rl)

  def __post_init__(self):
    if not 0 <= self.yellow_seconds < self.decision_seconds:
      raise ValueError("need 0 <= yellow_seconds < decision_seconds, got "
                       f"{self.yellow_seconds} and {self.decision_seconds}")
    if self.episode_decisions < 1 or self.saturation_flow <= 0 or self.lane_length <= 0:
      raise ValueError("episode_decisions, saturation_flow and lane_length must be positive")

  @property
  def storage(self) -> float:
    return self.lane_length / self.vehicle_spacing

  @property
  def approach_seconds(self) -> float:
    return self.lane_length / self.speed


class TrafficParams(NamedTuple):
  """The vehicles entering each lane in each decision, [T, 16] (replayed every episode)."""
  arrivals: jax.Array


class TrafficState(NamedTuple):
  cohorts: jax.Array       # [16, T] vehicles on the lane, by the decision they entered in
  decision: jax.Array      # int32, decisions taken in this episode
  phase: jax.Array         # int32, the current green phase
  discharged: jax.Array    # [16] vehicles that have left, this episode
  arrived: jax.Array       # [16] vehicles that have entered, this episode


def lane_shares(straight: float = 0.75) -> np.ndarray:
  """[16] each lane's share of the vehicles: per approach, its straight route and its right
  turn (`(1 - straight) / 8` of the traffic) share lanes 0-2, its left turn uses lane 3."""
  turn = (1.0 - straight) / 8
  approach = np.asarray([(straight / 4 + turn) / 3] * 3 + [turn])
  return np.tile(approach, 4)


def demand(seed: int, config: TrafficConfig, *, vehicles: float = 4000.0,
           weibull_scale: float = 1330.0, straight: float = 0.75) -> TrafficParams:
  """The arrival table: Poisson counts (seeded) around `vehicles` x lane share x the Weibull(2)
  probability of departing in each decision."""
  edges = np.arange(config.episode_decisions + 1) * config.decision_seconds
  cdf = 1.0 - np.exp(-(edges / weibull_scale) ** 2)
  expected = vehicles * np.diff(cdf)[:, None] * lane_shares(straight)[None]
  counts = np.random.default_rng(seed).poisson(expected)
  return TrafficParams(jnp.asarray(counts, jnp.float32))


def green_lanes(phase: jax.Array) -> jax.Array:
  """[16] 1.0 on the lanes that `phase` turns green."""
  return (jnp.asarray(PHASE_OF_LANE) == phase).astype(jnp.float32)


def stop_line_times(config: TrafficConfig) -> jax.Array:
  """[T] when the vehicles of each entry decision reach the stop line (seconds)."""
  return ((jnp.arange(config.episode_decisions) + 0.5) * config.decision_seconds
          + config.approach_seconds)


def observe(state: TrafficState, config: TrafficConfig) -> jax.Array:
  """The 37-value observation of `state`."""
  now = state.decision * config.decision_seconds
  at_line = (stop_line_times(config) <= now).astype(jnp.float32)
  on_lane = jnp.sum(state.cohorts, axis=1)
  queued = state.cohorts @ at_line
  min_green = jnp.float32(config.decision_seconds
                          >= config.min_green_seconds + config.yellow_seconds)
  return jnp.concatenate([
      jax.nn.one_hot(state.phase, NUM_PHASES, dtype=jnp.float32), min_green[None],
      jnp.minimum(on_lane / config.storage, 1.0), jnp.minimum(queued / config.storage, 1.0)])


def reset(key: jax.Array, params: TrafficParams, config: TrafficConfig
          ) -> tuple[TrafficState, jax.Array]:
  """An empty intersection on green phase 0 (deterministic, as SUMO's fixed start; `key` is
  unused): (state, observation)."""
  del key, params
  zeros = jnp.zeros(NUM_LANES, jnp.float32)
  state = TrafficState(
      cohorts=jnp.zeros((NUM_LANES, config.episode_decisions), jnp.float32),
      decision=jnp.int32(0), phase=jnp.int32(0), discharged=zeros, arrived=zeros)
  return state, observe(state, config)


def waiting_seconds(cohorts: jax.Array, now_seconds: jax.Array, config: TrafficConfig
                    ) -> jax.Array:
  """[16]: the summed waiting time at `now_seconds` of the vehicles on each lane, each counted
  from its arrival at the stop line, at most `waiting_memory`."""
  waited = jnp.clip(now_seconds - stop_line_times(config), 0.0, config.waiting_memory)
  return cohorts @ waited


def step(state: TrafficState, action: jax.Array, key: jax.Array, params: TrafficParams,
         config: TrafficConfig) -> tuple[TrafficState, jax.Array, jax.Array, jax.Array]:
  """One decision: switch to green phase `action` (yellow lost on a change), this decision's
  arrivals, FIFO discharge at the stop line. `key` is unused (the demand is a fixed table).
  Returns (state, observation [37], reward [16], done)."""
  del key
  action = jnp.asarray(action, jnp.int32)
  t = state.decision
  arrivals = params.arrivals[t]
  cohorts = state.cohorts.at[:, t].add(arrivals)
  green_seconds = config.decision_seconds - config.yellow_seconds * (action != state.phase)
  capacity = jnp.floor(config.saturation_flow * green_seconds) * green_lanes(action)
  # Vehicles that reach the stop line before the green ends may leave, oldest first.
  end = (t + 1) * config.decision_seconds
  reachable = cohorts * (stop_line_times(config) < end)[None]
  ahead = jnp.cumsum(reachable, axis=1) - reachable
  leaving = jnp.clip(capacity[:, None] - ahead, 0.0, reachable)
  cohorts = cohorts - leaving
  reward = -waiting_seconds(cohorts, end, config) / REWARD_SCALE
  state = TrafficState(cohorts=cohorts, decision=t + 1, phase=action,
                       discharged=state.discharged + jnp.sum(leaving, axis=1),
                       arrived=state.arrived + arrivals)
  done = state.decision >= config.episode_decisions
  return state, observe(state, config), reward, done
