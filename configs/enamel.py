"""enamel: the ENAMEL code-efficiency benchmark, eff@k and a sandboxed evaluator (ICLR 2025).

COMMAND: python -m experiments.enamel --config=configs/enamel.py:quick
         python -m experiments.enamel --config=configs/enamel.py --config.samples=PATH
EXPECTED (quick, 2 CPU cores, a few minutes per sample file once the tests are cached): the three
shipped sample files scored on the 142-problem set; pass@1 equal to the official evaluator's
(HumanEval canonical 0.9085, HumanEval+ canonical 0.9648, expert references 1.0), eff@1 near its
machine-dependent values (0.47, 0.52, 0.99). Measured numbers: results/enamel.json, discussed in
jaxlab/methods/enamel/README.md.

A samples file is JSON: a list with one list of programs per problem (164, or the 142 of the
problem set), or a dict from problem index to a list of programs.

Presets: smoke (tests: 3 problems, 2 repeats), quick and paper (the benchmark's settings).
`train.steps` caps the number of problems evaluated (the evaluation resumes problem by problem).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick", steps=0)
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.samples = ml_collections.config_dict.placeholder(str)
  c.train.update(dict(steps=164, log_every=1, eval_every=1, ckpt_every=1))
  c.data = ml_collections.ConfigDict(dict(
      problems="all", data_dir=ml_collections.config_dict.placeholder(str)))
  c.eval = ml_collections.ConfigDict(dict(
      hardness=(0, 3, 3, 4), num_repeats=6, timeout_factor=2.0, tolerance_s=0.01,
      memory_gib=4.0, ks=(1, 10, 100)))
  if preset == "smoke":
    c.data.problems = "0,13,31,88"
    c.train.update(dict(steps=3, progress=False))
    c.eval.num_repeats = 2
  if arg.steps:
    c.train.steps = arg.steps
  return config_lib.finalize(c)
