"""semantix: energy-guided sampling for semantic style transfer (He et al., ICLR 2025;
reconstructed: no code was released).

COMMAND: python -m experiments.semantix --config=configs/semantix.py:quick
EXPECTED (quick, 2 CPU cores): a 32x32 eps-UNet prior on ray-cast scenes (trained once, about
15 minutes, then cached), 64 generated (context, reference) pairs whose exact restyled render is
known; Semantix and four baselines (reconstruction, AdaIN + SDEdit, global feature-statistics
guidance, K/V injection) and four ablations, scored by PSNR / SSIM against the ideal and by the
per-class colour error. Guidance strengths are chosen on 16 validation pairs of another seed.
Numbers: results/semantix.json, discussed in jaxlab/methods/semantix/README.md.

Presets: smoke (tests: a tiny prior and 4 pairs, seconds), quick, paper (T = 1000, 200 visited
steps, 512 pairs, a wider prior).
"""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from jaxlab.core import config as config_lib

ALL_METHODS = ("semantix,reconstruction,adain_sdedit,global_guidance,kv_injection,"
               "no_style,no_spatial,no_sd,no_pe")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick")
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.methods = ALL_METHODS
  # batch_size divides num_pairs and equals num_validation: every batch has one shape, so each
  # sampler compiles once.
  c.data = ml_collections.ConfigDict(dict(num_pairs=64, pair_seed=1, num_validation=16,
                                          validation_seed=2, size=32, batch_size=16))
  # The prior: an unconditional eps UNet on the scenes' train distribution, attention at 8x8
  # (middle and decoder) and 16x16 (decoder), trained once and cached (jaxlab.diffusion.priors).
  c.prior = ml_collections.ConfigDict(dict(
      dataset="scenes", size=c.data.get_ref("size"), denoiser="unet", parameterization="eps",
      schedule="cosine", num_steps=100, steps=3000, batch_size=32, lr=1e-3,
      warmup_fraction=0.05, grad_clip=1.0, ema_max=0.999, ema_power=0.75, seed=0,
      architecture=ml_collections.ConfigDict(dict(
          base_channels=16, channel_multipliers=(1, 2, 2), groups=8, attention_at_lowest=True,
          attention_levels=(1, 2), num_heads=4)),
      dataset_options=ml_collections.ConfigDict(dict(num_train=2000, seed=0)),
      cache_dir=config_dict.placeholder(str)))
  # The sampler: `visited` of the prior's T steps; start the edit at t_start * T, guide down to
  # t_stop * T. Every reconstructed choice of the guidance is a switch here.
  c.sampler = ml_collections.ConfigDict(dict(
      visited=50, t_start=0.6, t_stop=0.2, sdedit_start=0.4, normalize_gradient=True))
  c.guidance = ml_collections.ConfigDict(dict(
      # eps' = eps + eta * sqrt(1 - abar_t) * grad_x E; E = l_s E_style + l_p E_spatial + l_d E_sd
      eta=1.0, style_weight=1.0, spatial_weight=1.0, sd_weight=1.0,
      style_taps=("dec1_1", "dec2_1"), spatial_taps=("dec1_q", "dec2_q"), sd_tap="mid",
      match_tap="dec1_1", pe_weight=1.0, soft_temperature=config_dict.placeholder(float),
      # Chosen on the validation pairs (never the reported ones), in two stages: eta x the PE
      # weight, then the spatial x semantic-distance weights (l_s = 1 fixes the scale).
      eta_grid=(1.0, 2.0, 4.0), pe_weight_grid=(0.5, 1.0, 2.0),
      spatial_weight_grid=(0.1, 0.3, 1.0), sd_weight_grid=(0.3, 1.0, 3.0)))
  # StyleID's K/V injection (the kv_injection baseline).
  c.kv_injection = ml_collections.ConfigDict(dict(query_blend=0.75, temperature=1.5,
                                                  layers=("dec1", "dec2")))
  c.train.update(dict(steps=1, batch_size=32, log_every=1, ckpt_every=1))

  if preset == "paper":
    c.prior.update(dict(num_steps=1000, steps=100_000))
    c.prior.architecture.update(dict(base_channels=64))
    c.sampler.visited = 200
    c.data.update(dict(num_pairs=512, num_validation=64, batch_size=64))
  if preset == "smoke":
    # Each method compiles its own sampler: the smoke run keeps three (one of each kind).
    c.methods = "semantix,kv_injection,adain_sdedit"
    c.data.size = 16
    # Batch 8: the prior's training batch is split over the tests' 8 simulated devices.
    c.prior.update(dict(steps=4, batch_size=8, num_steps=20))
    # Two levels: a UNet half as deep compiles in half the time; the taps follow it.
    c.prior.architecture.update(dict(base_channels=8, groups=4, num_heads=2,
                                     channel_multipliers=(1, 2), attention_levels=(0, 1)))
    c.prior.dataset_options.num_train = 8
    c.guidance.update(dict(style_taps=("dec0_1", "dec1_1"), spatial_taps=("dec1_q",),
                           match_tap="dec1_1"))
    c.kv_injection.layers = ("dec1",)
    c.sampler.visited = 10
    # Validation and reported pairs in batches of one shape: each sampler compiles once.
    c.data.update(dict(num_pairs=4, num_validation=4, batch_size=4))
    c.guidance.update(dict(eta_grid=(1.0,), pe_weight_grid=(1.0,), spatial_weight_grid=(1.0,),
                           sd_weight_grid=(1.0,)))
    c.train.progress = False
  return config_lib.finalize(c)
