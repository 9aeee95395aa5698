"""ise: Instructional Segment Embedding on a from-scratch decoder (Wu et al., ICLR 2025).

COMMAND: python -m experiments.ise --config=configs/ise.py:quick
EXPECTED (quick, 2 CPU cores): every variant answers clean prompts; ISE (segment embeddings
and delimiters) resists the held-out injections, fake delimiters and completions above all,
better than delimiters alone. Numbers: results/ise.json, discussed in jaxlab/methods/ise/README.md.

Presets: smoke (tests, seconds), quick (adversarial regime, none / delimiters / ise, 3 seeds, up
to 2 turns; ~15 minutes), long (the quick run at 4,000 steps, for the trained-enough gate the
quick run misses: results/ise_long.json, ~30 minutes), paper (both regimes, all four variants, 5 seeds, 3 turns, a wider decoder).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick", presets=config_lib.ALL_PRESETS)
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  # Regimes (clean, adversarial) and variants (none, delimiters, ise, ise_only): comma lists.
  c.regimes = "adversarial"
  c.variants = "none,delimiters,ise"
  # Seeds are vmapped replicas; the variants of one seed share initial weights and batches.
  c.num_seeds = 3
  # The zoo Decoder (RoPE, RMSNorm, GeGLU, tied read-out) plus the segment table.
  c.model = ml_collections.ConfigDict(dict(width=64, depth=2, num_heads=4, mlp_dim=256,
                                           segment_init_std=0.01))
  # A pool of generated training conversations per regime (shared by the variants), conversations
  # of up to `max_turns` turns, and `eval_size` evaluation conversations per attack.
  c.data = ml_collections.ConfigDict(dict(pool_size=20_000, max_turns=2, eval_size=300,
                                          eval_seed=12_345))
  # AdamW, 100 warm-up steps then cosine, clip 1.0 (the official recipe's shape; lr 3e-3 for a
  # from-scratch model: the official 2e-5 fine-tunes Llama-3.1-8B).
  c.optim = ml_collections.ConfigDict(dict(learning_rate=3e-3, warmup_steps=100, grad_clip=1.0,
                                           weight_decay=0.01))
  # batch_size counts packed rows of 64 tokens (1.7 conversations per row at up to 2 turns: ~55
  # conversations per step); the pilot (2 x 64, batch 64) needed ~2,000 steps.
  c.train.update(dict(steps=2000, batch_size=32, log_every=100, ckpt_every=500))
  c.train.chunk_steps = 100

  if preset == "long":
    # The quick run ends with delimiters' clean accuracy just under the 0.95 gate (0.948): the
    # same run at twice the steps, so the claims are judged on a model that learned the task.
    c.train.update(dict(steps=4000, ckpt_every=1000))
  if preset == "paper":
    c.regimes = "clean,adversarial"
    c.variants = "none,delimiters,ise,ise_only"
    c.num_seeds = 5
    c.model.update(dict(width=128, depth=4, mlp_dim=512))
    c.data.update(dict(max_turns=3, pool_size=50_000))
    c.train.update(dict(steps=6000, ckpt_every=1000))
  if preset == "smoke":
    c.variants = "delimiters,ise"
    c.num_seeds = 2
    c.model.update(dict(width=16, depth=1, num_heads=2, mlp_dim=32))
    c.data.update(dict(pool_size=64, max_turns=1, eval_size=8))
    c.train.update(dict(steps=4, batch_size=8, log_every=2, ckpt_every=2, progress=False))
    c.train.chunk_steps = 2
  return config_lib.finalize(c)
