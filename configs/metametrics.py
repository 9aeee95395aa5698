"""metametrics: calibrating a combination of MT metrics to human MQM judgments (ICLR 2025).

COMMAND: python -m experiments.metametrics --config=configs/metametrics.py:quick
EXPECTED (quick, 2 CPU cores, under 10 minutes; about half of it computes the metrics once, then
they come from the cache): on the WMT21 TED-talks MQM ratings (en-de, zh-en; 13 systems x 529
segments), gp and xgb combinations of eight lexical metrics against the best single metric,
held-out Kendall tau over 3 source-disjoint 50/50 splits. Measured numbers: results/metametrics.json,
discussed in jaxlab/methods/metametrics/README.md.

Presets: smoke (tests: en-de, 20 segments, 3 BO iterations), quick (3 splits, gp 5 + 40, xgb 8
search iterations x 3-fold), paper (5 splits, gp 5 + 100, xgb 25 x 10-fold, the official
settings), long (10 splits, gp 5 + 100, xgb 25 search iterations x 3-fold; about 20 minutes:
with 3 splits a gain of 0.01 tau is about its own two standard errors). `train.steps` is the number of splits: each split is one resumable unit, logged to
`<workdir>/<pair>/metrics.jsonl` when it finishes.
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick",
                             presets=config_lib.ALL_PRESETS)
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.pairs = "en-de,zh-en"
  c.methods = "gp,xgb,linear,uniform"
  c.metrics = "all"
  c.data = ml_collections.ConfigDict(dict(
      # 0 keeps every source segment; smaller values take the first n (smoke tests).
      max_segments=0, train_fraction=0.5,
      cache_dir=ml_collections.config_dict.placeholder(str)))
  c.gp = ml_collections.ConfigDict(dict(init_points=5, n_iter=40))
  c.xgb = ml_collections.ConfigDict(dict(n_iter=8, cv=3, n_jobs=2))
  c.train.update(dict(steps=3, log_every=1, eval_every=1, ckpt_every=1))
  if preset == "paper":
    c.train.steps = 5
    c.gp.n_iter = 100
    c.xgb.update(dict(n_iter=25, cv=10))
  if preset == "long":
    # 10-fold CV would cost about 4 of the 5 minutes of a split here: 3 folds, as quick.
    c.train.steps = 10
    c.gp.n_iter = 100
    c.xgb.update(dict(n_iter=25, cv=3))
  if preset == "smoke":
    c.pairs = "en-de"
    c.data.max_segments = 20
    c.gp.n_iter = 3
    c.xgb.update(dict(n_iter=2, cv=2))
    c.train.update(dict(steps=2, progress=False))
  return config_lib.finalize(c)
