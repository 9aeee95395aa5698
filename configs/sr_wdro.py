"""sr_wdro: statistically robust WDRO against robust overfitting (ICLR 2025).

COMMAND: python -m experiments.sr_wdro --config=configs/sr_wdro.py:quick
EXPECTED (quick, 2 CPU cores, under 10 minutes): on 500 scikit-learn digits with 20% of the
training labels flipped (`noisy`), PGD-AT robust-overfits (its PGD-20 test accuracy peaks, then
falls); the claims test whether SR-WDRO (r = 0.1, 0.3) keeps a smaller best-to-last gap and a
higher last-epoch robust accuracy than AT and UDR, over 3 seeds. The `clean` setting (1 seed) is
reported beside it. Numbers: results/sr_wdro.json, discussed in jaxlab/methods/sr_wdro/README.md.

Presets: smoke (tests, seconds), quick (7 methods x 3 seeds noisy + 7 x 1 clean, 200 epochs),
paper (adds r = 0.05, TRADES and SR-TRADES, 5 seeds; the paper's CIFAR-10 / ResNet-18 is not
available offline). `train.steps` is the number of epochs; every `train.eval_every` epochs a
PGD-20 evaluation on `data.num_eval_images` fixed test images ends a compiled chunk.
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick")
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  # sr_wdro_stale_r<r>: the official code's weights (solved on the first batch, then reused by
  # position), an ablation beside the method as the paper describes it.
  c.methods = "erm,at,udr,sr_wdro_r0.1,sr_wdro_r0.3,sr_wdro_stale_r0.1,sr_wdro_stale_r0.3"
  c.settings = "noisy,clean"
  c.num_seeds = 3           # noisy setting
  c.clean_seeds = 1         # clean setting
  c.data = ml_collections.ConfigDict(dict(
      num_test=1297, label_noise=0.2, num_eval_images=500, split_seed=0,
      data_dir=ml_collections.config_dict.placeholder(str)))
  c.model = ml_collections.ConfigDict(dict(hidden=(256, 256)))
  c.attack = ml_collections.ConfigDict(dict(
      epsilon=0.1, steps=10, step_fraction=0.25, eval_steps=20, final_steps=100,
      final_restarts=5))
  # The official wdro_at.py: lam starts at 1, moves by 0.02 (eps - mean |delta|) every 10
  # iterations; TRADES beta 6. The weights' bisection runs a fixed number of iterations.
  c.wdro = ml_collections.ConfigDict(dict(lam_init=1.0, lam_lr=0.02, lam_period=10,
                                          trades_beta=6.0, weight_iterations=64))
  c.optim = ml_collections.ConfigDict(dict(learning_rate=0.1, momentum=0.9, weight_decay=5e-4,
                                           lr_milestones=(100, 150), lr_factor=0.1))
  c.train.update(dict(steps=200, batch_size=100, eval_every=4, ckpt_every=20, log_every=4))
  if preset == "paper":
    c.methods = ("erm,at,udr,trades,sr_wdro_r0.05,sr_wdro_r0.1,sr_wdro_r0.3,"
                 "sr_trades_r0.1,sr_wdro_stale_r0.1,sr_wdro_stale_r0.3")
    c.num_seeds = 5
  if preset == "smoke":
    c.methods = "erm,at,sr_wdro_r0.3,sr_wdro_stale_r0.3"
    c.settings = "noisy"
    c.num_seeds = 2
    c.data.num_eval_images = 64
    c.model.hidden = (32,)
    c.attack.update(dict(steps=3, eval_steps=4, final_steps=6, final_restarts=2))
    c.optim.lr_milestones = (3,)
    c.train.update(dict(steps=4, eval_every=2, ckpt_every=2, log_every=2, progress=False))
  return config_lib.finalize(c)
