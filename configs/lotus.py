"""lotus: diffusion-based dense prediction, single-step x0 prediction (ICLR 2025).

COMMAND: python -m experiments.lotus --config=configs/lotus.py:quick
EXPECTED (quick, 2 CPU cores, ~20 min): a small UNet
pretrained as an eps-diffusion prior on procedural 32x32 scenes, then fine-tuned for depth and
normals as the five variants of the paper's analysis (eps/x0, multi/single step, Lotus-D, detail
preserver); results/lotus.json says which of the claims (x0 beats eps; single step as accurate
and much faster; the detail preserver reduces edge error, paired over 3 training seeds) hold
here. Discussed in jaxlab/methods/lotus/README.md.

Presets: smoke (tests, seconds), quick (the CPU reproduction), paper (longer training).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick", steps=0)
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.variants = "all"
  c.tasks = "depth,normal"
  c.model = ml_collections.ConfigDict(dict(
      base_channels=32, channel_multipliers=(1, 2, 2), blocks_per_level=1, attention=True,
      groups=8))
  c.diffusion = ml_collections.ConfigDict(dict(schedule="linear", num_steps=1000,
                                               sample_steps=10))
  c.optim = ml_collections.ConfigDict(dict(prior_lr=2e-3, lr=1e-3))
  # steps: fine-tuning steps per (task, variant); prior_steps (None: the same) for the prior.
  c.train.update(dict(steps=3000, batch_size=32, log_every=100, eval_every=100_000,
                      ckpt_every=500))
  c.train.prior_steps = ml_collections.config_dict.placeholder(int)
  c.train.prior_steps = 3000
  # Training seeds of depth Lotus-G with and without the detail preserver (the claim's paired
  # test); every other (task, variant) trains at `seed` only.
  c.train.detail_preserver_seeds = 3
  c.data = ml_collections.ConfigDict(dict(
      size=32, num_train=2000, num_test=200, num_heldout=200, seed=0,
      data_dir=ml_collections.config_dict.placeholder(str)))
  c.eval = ml_collections.ConfigDict(dict(batch_size=100, num_seeds=3))

  if preset == "quick":
    # CPU budget (20 minutes for 14 fine-tunings): a 16-channel UNet (the paper preset's 32
    # costs 0.3 s per step here), 200 steps each (0.2 s per step, the detail preserver's 0.4),
    # 2 evaluation noise seeds; the image prior 400 steps (600 took the run 1 s past 20 minutes).
    c.model.base_channels = 16
    c.train.update(dict(steps=200, prior_steps=400, batch_size=16, log_every=50,
                        ckpt_every=200))
    c.eval.num_seeds = 2
  elif preset == "smoke":
    c.variants = "x0_multi,lotus_g"
    c.tasks = "depth"
    # One resolution level: half the compile time of two, which dominates these seconds.
    c.model.update(dict(base_channels=8, channel_multipliers=(1,), attention=True, groups=4))
    c.diffusion.update(dict(num_steps=50, sample_steps=3))
    c.data.update(dict(size=16, num_train=16, num_test=8, num_heldout=8))
    c.train.update(dict(steps=3, prior_steps=None, batch_size=8, log_every=1, ckpt_every=2,
                        progress=False))
    c.eval.update(dict(batch_size=8, num_seeds=2))
  if arg.steps:
    c.train.steps = arg.steps
  return config_lib.finalize(c)
