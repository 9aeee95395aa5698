"""jetformer: JetFormer (a Jet flow + autoregressive GMM transformer, trained end to end).

COMMAND: python -m experiments.jetformer --config=configs/jetformer.py:quick
EXPECTED (quick, scikit-learn digits 8x8 with 17 grey levels, 2 CPU cores): test bits/dim of
JetFormer against a flow alone, the GMM-AR model on raw patches, and JetFormer without the noise
curriculum or without factoring out, 3 training seeds each; class-conditional samples judged by a
logistic-regression classifier trained on real digits; the std of the factored-out dims of real
test digits; class prediction from the image prefix by a model of its own. Measured numbers:
results/jetformer.json (and results/jetformer_long.json), discussed in
jaxlab/methods/jetformer/README.md.

Presets: smoke (tests, seconds), quick (the CPU reproduction, ~20 min), long (the same at more
steps, ~90 min on 2 cores), paper (larger model and longer training on the same data, for an
accelerator).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib

QUICK_STEPS = 1000
LONG_STEPS = 4000


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, presets=config_lib.ALL_PRESETS, default_preset="quick",
                             steps=0)
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  # 4x4 patches of an 8x8 image: 4 tokens of 16 dims; the first 4 of each are autoregressive and
  # 12 are factored out (the paper: 128 of 768). The class prefix is the label repeated 16 times
  # with N(0, 1) embeddings; input_noise_std: the largest per-example std of the noise on the
  # autoregressive tokens in teacher forcing (official 0.3).
  c.model = ml_collections.ConfigDict(dict(
      patch=4, ar_dim=4, use_flow=True, use_decoder=True, jet_depth=8, jet_width=32,
      jet_conditioner_depth=1, jet_heads=2, width=64, depth=2, num_heads=4, num_kv_heads=1,
      mlp_dim=256, num_mixtures=8, dropout=0.0, class_repeats=16, embed_init_std=1.0,
      input_noise_std=0.3))
  c.data = ml_collections.ConfigDict(dict(
      num_levels=17, num_classes=10, num_test=360, seed=0,
      data_dir=ml_collections.config_dict.placeholder(str)))
  # noise_std: the curriculum's initial std in grey levels (a cosine to 0 over the first
  # train.curriculum_fraction of the steps). weight_decay is big_vision's: on kernels only,
  # following the schedule, not multiplied by lr. understanding_prob: the share of examples in
  # image-first order (0 for the class-conditional generation models, as the official config).
  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-3, b2=0.95, weight_decay=1e-4, warmup_fraction=0.1, clip_norm=1.0, noise_std=4.0,
      label_dropout=0.1, understanding_prob=0.0, class_weight=1.0))
  c.train.update(dict(steps=QUICK_STEPS, batch_size=64, log_every=100, eval_every=500,
                      ckpt_every=500, num_seeds=3, curriculum_fraction=0.65))
  c.eval.update(dict(batch_size=40, samples_per_class=20, temperature=0.94, cfg_weight=3.0,
                     rejection_candidates=1000))
  c.variants = ml_collections.ConfigDict({
      "jetformer": dict(),
      "flow_only": dict(model=dict(use_decoder=False), optim=dict(noise_std=0.0)),
      "ar_raw_patches": dict(model=dict(use_flow=False, ar_dim=16)),
      "no_curriculum": dict(optim=dict(noise_std=0.0)),
      "no_factor_out": dict(model=dict(ar_dim=16)),
      # Image understanding (class after the image) by a model of its own, so that it does not
      # take a share of the generation models' training; one seed, as it is not compared.
      "understanding": dict(optim=dict(understanding_prob=0.5), train=dict(num_seeds=1)),
  })
  c.run_variants = "all"

  if preset == "long":
    c.train.update(dict(steps=LONG_STEPS, eval_every=1000, ckpt_every=1000))
  elif preset == "paper":
    c.model.update(dict(jet_depth=16, jet_width=64, jet_conditioner_depth=2, width=128,
                        depth=4, mlp_dim=512, num_mixtures=32))
    c.train.update(dict(steps=20_000, eval_every=2000, ckpt_every=2000))
  elif preset == "smoke":
    c.model.update(dict(jet_depth=2, jet_width=8, jet_heads=1, width=16, depth=1, num_heads=2,
                        mlp_dim=32, num_mixtures=2, class_repeats=2))
    c.train.update(dict(steps=3, batch_size=16, log_every=1, eval_every=3, ckpt_every=3,
                        progress=False, num_seeds=2))
    c.eval.update(dict(batch_size=40, samples_per_class=2, rejection_candidates=4))
    c.run_variants = "jetformer,flow_only"
  if arg.steps:
    c.train.steps = arg.steps
  return config_lib.finalize(c)
