"""attention_pruning: pruning attention by gradient descent on a mask (Liang et al., ICLR 2025).

COMMAND: python -m experiments.attention_pruning --config=configs/attention_pruning.py:quick
EXPECTED (quick, 2 CPU cores): the mask's GD loss falls monotonically at eta = 1 / L_hat; on
saturated synthetic attention (logit std 5) the GD mask keeps the softmax matrix closer than
Wanda and SparseGPT, while SparseGPT keeps the linear map X W closer; on a character LM trained
for ~3 minutes on the Python Language Reference topics, perplexity after pruning each head's
query/key factors: SparseGPT ahead at 50% (3.83 against 4.42), level at 70%, the GD mask ahead at
90% (9.6 against 11.4 for Wanda). ~7 minutes. Numbers: results/attention_pruning.json, discussed in
jaxlab/methods/attention_pruning/README.md.

Presets: smoke (tests, seconds), quick (the CPU reproduction), paper (= quick with the paper's
8 calibration and 128 validation sequences, already the quick preset's; a larger LM).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick")
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.methods = "gd_mask,magnitude,wanda,sparsegpt"
  c.sparsities = (0.3, 0.5, 0.7, 0.9)
  # The reconstructed GD mask (README, Deviations): lam weighs ||M||^2 against the attention
  # error, in units of the error's curvature at M = 1 ("curvature"; "absolute": as written);
  # each head (each synthetic instance) takes the lam of `lams` whose binarised mask has the
  # least attention error on the calibration sequences; steps of plain GD at eta = 1 / L_hat
  # (power iteration on Hessian-vector products at M = 1); binarised by |M| ("mask") or |M o W|
  # ("mask_times_weight"); kept entries take W o M (keep_values) or W. The grid and steps from
  # checks on the synthetic instances and the LM (pruning.py).
  c.gd = ml_collections.ConfigDict(dict(lams=(0.01, 0.003, 0.001), lam_scale="curvature",
                                        steps=300, score="mask", keep_values=True,
                                        power_iterations=30))
  c.sparsegpt = ml_collections.ConfigDict(dict(blocksize=128, damp=0.01))
  # (a) Synthetic attention: N tokens of width d, logit std c (near-linear to saturated).
  c.synthetic = ml_collections.ConfigDict(dict(num_tokens=64, width=32,
                                               logit_stds=(0.5, 2.0, 5.0), instances=5))
  # (b) The character LM (zoo Backbone, qkv_bias=False) and its pruning.
  c.data = ml_collections.ConfigDict(dict(seq_len=128, train_fraction=0.9, num_calibration=8,
                                          num_validation=128, calibration_seeds=3))
  c.model = ml_collections.ConfigDict(dict(width=128, depth=2, num_heads=4))
  c.optim = ml_collections.ConfigDict(dict(learning_rate=3e-3, warmup_steps=100, grad_clip=1.0,
                                           weight_decay=0.01))
  # ~3 minutes on 2 cores (4.5 steps/s), as the issue sizes it.
  c.train.update(dict(steps=800, batch_size=32, log_every=100, eval_every=400, ckpt_every=400))
  c.eval.update(dict(batch_size=128, num_batches=1))
  c.settings = "merged,factors"
  # One reconstructed choice changed at a time on the `factors` GD mask (README, Ablation).
  c.ablations = \
      "score_mask_times_weight,no_keep_values,fixed_lam,lam_div10,absolute_lam,non_causal"

  if preset == "paper":
    c.model.update(dict(width=256, depth=4, num_heads=8))
    c.train.update(dict(steps=10_000))
  if preset == "smoke":
    c.sparsities = (0.5,)
    c.gd.update(dict(steps=5, power_iterations=3))
    c.synthetic.update(dict(num_tokens=8, width=4, logit_stds=(5.0,), instances=2))
    c.data.update(dict(seq_len=16, num_calibration=2, num_validation=8, calibration_seeds=2))
    c.model.update(dict(width=16, depth=2, num_heads=2))
    c.train.update(dict(steps=4, batch_size=8, log_every=2, eval_every=4, ckpt_every=4,
                        progress=False))
    c.ablations = "no_keep_values"
  return config_lib.finalize(c)
