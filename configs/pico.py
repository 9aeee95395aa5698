"""pico: ranking LLMs by peer review with consistency-optimised reviewer weights (ICLR 2025).

COMMAND: python -m experiments.pico --config=configs/pico.py:quick
EXPECTED (quick, 2 CPU cores, about a minute): on simulated peer review calibrated to the real
gpt-3.5-turbo judgments, PiCO's learned reviewer weights follow the reviewers' ability; how much
its ranking gains over uniform weights is what the claims test. The real file (one reviewer)
and the 16 official logs check the metrics and scoring. Numbers: results/pico.json, discussed in
jaxlab/methods/pico/README.md.

Presets: smoke (tests, seconds), quick (10 seeds, fractions 1 / 0.7 / 0.4, both families), paper
(= quick: the paper's data, 15 real reviewers, is not available offline).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick")
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.methods = "pico,pico_elo,uniform,reversed,order,majority,pagerank,prd"
  c.families = "default,violated"
  c.fractions = (1.0, 0.7, 0.4)
  c.num_seeds = 10
  # The simulation (jaxlab.methods.pico.simulate.SimulationSpec); the top reviewer's position
  # bias and noise are fitted to the real file's disagreement rates (calibrate=True).
  c.sim = ml_collections.ConfigDict(dict(num_questions=80, opponents=4, judge_probability=0.85,
                                         calibrate=True))
  # The official fit: 30 full-batch SGD steps, lr 0.1 (x0.1 every 10), rank bonus K = 200;
  # elimination of up to 8 reviewers (reconstructed).
  c.fit = ml_collections.ConfigDict(dict(num_steps=30, learning_rate=0.1, k_rank=200.0,
                                         max_eliminated=8))
  c.train.update(dict(steps=1, progress=True))
  if preset == "smoke":
    c.num_seeds = 2
    c.fractions = (1.0, 0.4)
    c.sim.num_questions = 6
    c.fit.update(dict(num_steps=4, max_eliminated=2))
    c.train.progress = False
  return config_lib.finalize(c)
