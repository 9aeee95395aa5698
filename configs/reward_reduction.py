"""reward_reduction: learned positive row-stochastic reward reduction for envelope Q-learning.

COMMAND: python -m experiments.reward_reduction --config=configs/reward_reduction.py:quick
EXPECTED (quick, 2 CPU cores, under 10 minutes): on a 16-objective point-queue intersection
(16 lanes, per-lane waiting-time rewards), envelope Q-learning in a 4-D reduced reward space, 3
seeds per method. The claims test whether `ours` (A = softmax(W), trained with a decoder) has the
highest mean hypervolume (reference 2 x the random policy's return) and expected utility, and
beats `pca` and `none` in hypervolume on at least 2 of 3 seeds. Numbers:
results/reward_reduction.json, discussed in jaxlab/methods/reward_reduction/README.md.

Presets: smoke (tests, seconds), quick (20,000 steps, Q [128, 128], methods ours pca ae random
none, 3 seeds), paper (52,000 steps, hodec 39,000, Q [256, 256], adds npca and uniform, 5
seeds: the official traffic settings), long (= paper, ~40 minutes; its results are kept in
results/reward_reduction_long.json). `train.steps` is the number of environment steps.
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, presets=config_lib.ALL_PRESETS, default_preset="quick")
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.methods = "ours,pca,ae,random,none"
  c.num_seeds = 3
  c.env = ml_collections.ConfigDict(dict(
      decision_seconds=20, yellow_seconds=2, min_green_seconds=5, episode_decisions=200,
      saturation_flow=0.5, lane_length=750.0, demand_seed=0, vehicles=4000.0,
      weibull_scale=1330.0))
  # The official traffic run (envelope_traffic_iclr25.py): K 16 -> m 4, decoder dropout 0.75,
  # reduction every 5 steps on 32 rewards, Adam 3e-4 with weight decay 1e-5.
  c.reduction = ml_collections.ConfigDict(dict(
      num_objectives=16, reduced_dim=4, hidden=(32, 32), dropout=0.75, learning_rate=3e-4,
      weight_decay=1e-5, interval=5, batch_size=32, npca_penalty=5e4))
  c.agent = ml_collections.ConfigDict(dict(
      hidden=(128, 128), learning_rate=3e-4, batch_size=32, num_sample_w=4, gamma=0.99,
      epsilon_start=1.0, epsilon_end=0.05, epsilon_fraction=0.1, learning_starts=200,
      target_every=500, max_grad_norm=0.1, homotopy_steps=15_000, buffer_size=52_000))
  c.eval.update(dict(
      num_preferences=20, candidates=10_000, eum_weights=100, ref_scales=(1.0, 2.0, 4.0),
      random_episodes=8, seed=1234))
  c.train.update(dict(steps=20_000, chunk_steps=1_000, ckpt_every=5_000, log_every=1_000))
  if preset in ("paper", "long"):
    c.methods = "ours,pca,ae,random,none,npca,uniform"
    c.num_seeds = 5
    c.agent.hidden = (256, 256)
    c.agent.homotopy_steps = 39_000
    c.train.steps = 52_000
  if preset == "smoke":
    c.methods = "ours,none"
    c.num_seeds = 2
    c.env.update(dict(episode_decisions=20, vehicles=400.0, weibull_scale=133.0))
    c.agent.update(dict(hidden=(16,), learning_starts=20, target_every=50, homotopy_steps=60,
                        buffer_size=100))
    c.eval.update(dict(num_preferences=4, candidates=200, eum_weights=10, random_episodes=2))
    c.train.update(dict(steps=80, chunk_steps=40, ckpt_every=40, log_every=40, progress=False))
  return config_lib.finalize(c)
