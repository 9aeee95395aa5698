"""diffusion_purification: stochasticity vs purification in diffusion-based defences; ADDT, RBGM
(Liu et al., ICLR 2025).

COMMAND: python -m experiments.diffusion_purification --config=configs/diffusion_purification.py:quick
EXPECTED (quick, 2 CPU cores, ~14 min): an MLP classifier and a DDPM (a small eps-predicting UNet,
T = 25, cosine) trained on scikit-learn digits upsampled to 16x16; the DDPM fine-tuned two ways
with the same budget (plain noise, ADDT); each purifier (t* = 0.4 T) attacked with PGD-20 L-inf
under the stochastic white-box (EOT 4) and the Deterministic White-Box, on 30 digits in 3
purification seeds. results/diffusion_purification.json says whether most of the
purification's robustness gain disappears under DW-box and whether ADDT raises both; `long`
(results/diffusion_purification_long.json) decides them on 180 digits, with ADDT without RBGM
too, and checks that the DW-box attack has converged (PGD-20 vs PGD-100). Discussed in
jaxlab/methods/diffusion_purification/README.md.

Presets: smoke (tests, seconds), quick (the CPU reproduction), long (the quick setting on 180
digits with twice the training, where the claims are decided; about an hour), paper (the paper's settings on
digits: eps-predicting UNet, linear schedule, T = 1000, t* = 0.1 T, eps = 16/255 in [-1, 1]
units, lambda scale 0.03, longer training: GPU scale).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib

placeholder = ml_collections.config_dict.placeholder
ABLATIONS = ("x0_mlp",)


def _unet_on_small_digits(c: ml_collections.ConfigDict) -> None:
  """The quick and long presets' setting.

  Digits upsampled to 16x16 and a small eps-predicting UNet (the paper's denoiser kind), at the
  scale this CPU can attack (see the method README's budget): T = 25 and t* = 10 keep the noise
  level of t* = 0.4 T (sqrt(1 - ab) = 0.59, about 4x epsilon; paper: t* = 0.1 T of the linear
  schedule, 0.32 vs 16/255, 5x) with 11 reverse steps; unrolled, their activations fit easily
  and storing them is 1.4x faster than recomputing. The ADDT perturbation scale keeps the paper's
  ratio to the budget (0.03 / (16/255) = 0.48). EOT 4 instead of 10, 3 purification seeds.
  """
  c.models = "pretrained,plain,addt"
  c.data.size = 16
  c.prior.architecture.update(dict(base_channels=8, channel_multipliers=(1, 2), groups=4))
  c.prior.num_steps = 25
  c.diffusion.update(dict(t_star=10, unroll=True, remat=False))
  c.attack.update(dict(epsilon=0.15, step_size=0.0375, eot=4))
  c.addt.lambda_scale = 0.07
  c.train.update(dict(classifier_steps=2000, log_every=100, ckpt_every=500))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, default_preset="quick", presets=config_lib.PRESETS + ("long",),
                             steps=0, ablation="")
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.models = "all"
  # ablation: "" or one of ABLATIONS, applied on top of the preset; its results are not
  # published under results/ (the README says where each ablation's file goes).
  c.ablation = arg.ablation
  c.model = ml_collections.ConfigDict(dict(classifier_hidden=(256, 256)))
  # variance: the reverse steps' noise, "fixed_large" (beta_t, the official sampler's) or
  # "fixed_small" (the posterior's beta_tilde_t, less stochastic). unroll: the reverse scan's
  # unrolling (True for a UNet on CPU: see jaxlab/diffusion/sampling.py); remat: recompute each
  # reverse step's activations in the attack's backward pass instead of storing them.
  c.diffusion = ml_collections.ConfigDict(dict(t_star=10, variance="fixed_large", unroll=False,
                                               remat=True))
  c.data = ml_collections.ConfigDict(dict(size=32, num_test=360, seed=0,
                                          data_dir=placeholder(str)))
  c.optim = ml_collections.ConfigDict(dict(
      classifier_lr=1e-3, classifier_weight_decay=1e-4, finetune_lr=2e-4, finetune_b1=0.95,
      warmup_fraction=0.05, grad_clip=1.0, ema_max=0.9999, ema_power=0.75))
  # ADDT: lambda_t = clip(lambda_scale sqrt(ab_t) / sqrt(1 - ab_t), 0, lambda_max).
  c.addt = ml_collections.ConfigDict(dict(lambda_scale=0.03, lambda_max=0.3, cgpo_iterations=5))
  # L-inf budget in [-1, 1] pixel units. convergence_steps: the pretrained purifier's DW-box
  # attack runs on to this many steps (0: not), to check that PGD-<steps> has converged.
  c.attack = ml_collections.ConfigDict(dict(epsilon=16 / 255, step_size=4 / 255, steps=20, eot=10,
                                            convergence_steps=100))
  # steps: fine-tuning steps per model; classifier_steps (None: the same).
  c.train.update(dict(steps=20_000, batch_size=128, log_every=200, eval_every=1_000_000,
                      ckpt_every=2000))
  c.train.classifier_steps = placeholder(int)
  c.train.classifier_steps = 3000
  # The pretrained DDPM (jaxlab.diffusion.priors: trained once per spec, then loaded from
  # prior.cache_dir, else $JAXLAB_CACHE/priors, else ~/.cache/jaxlab/priors). The image size,
  # data split, batch, seed and the optimiser settings it shares with the fine-tunings are
  # references to this config's own keys. denoiser: "unet" or "residual_mlp" (architecture:
  # that kind's options); parameterization: what it predicts, "eps" or "x0".
  c.prior = ml_collections.ConfigDict(dict(
      dataset="digits", size=c.data.get_ref("size"), denoiser="unet", parameterization="eps",
      schedule="cosine", num_steps=100, steps=100_000, batch_size=c.train.get_ref("batch_size"),
      lr=1e-3, warmup_fraction=c.optim.get_ref("warmup_fraction"),
      grad_clip=c.optim.get_ref("grad_clip"), ema_max=c.optim.get_ref("ema_max"),
      ema_power=c.optim.get_ref("ema_power"), seed=c.get_ref("seed"),
      architecture=ml_collections.ConfigDict(dict(base_channels=32, channel_multipliers=(1, 2),
                                                  groups=8)),
      dataset_options=ml_collections.ConfigDict(dict(num_test=c.data.get_ref("num_test"),
                                                     split_seed=c.data.get_ref("seed"))),
      cache_dir=placeholder(str)))
  # num_seeds: purification seeds (independent attack and evaluation keys) per model.
  c.eval = ml_collections.ConfigDict(dict(num_images=360, batch_size=120, num_draws=4,
                                          num_seeds=3))

  if preset == "paper":
    c.prior.update(dict(schedule="linear", num_steps=1000))
    c.diffusion.t_star = 100
  elif preset in ("quick", "long"):
    _unet_on_small_digits(c)
    if preset == "quick":
      # A quarter of an hour: 30 digits and no PGD-100 check (the long preset decides the claims).
      c.train.steps = 200
      c.prior.steps = 1500
      c.attack.convergence_steps = 0
      c.eval.update(dict(num_images=30, batch_size=30))
    else:
      # The power the claims need (about an hour on 2 cores): 180 digits instead of 60 for the
      # per-image paired tests, twice the pretraining and fine-tuning, and every fine-tuning
      # (addt_no_rbgm too: ADDT's CGPO without its RBGM step).
      c.models = "all"
      c.train.steps = 600
      c.prior.steps = 3000
      c.eval.update(dict(num_images=180, batch_size=60))
  if arg.ablation == "x0_mlp":
    # results/ablations/diffusion_purification_x0_mlp.json (with the quick preset): the earlier
    # quick setting, an x0-predicting residual MLP on 32x32 digits (T = 100, t* = 40), EOT 10,
    # every fine-tuning, 240 digits in one purification seed.
    c.models = "all"
    c.data.size = 32
    c.prior.update(dict(denoiser="residual_mlp", parameterization="x0", num_steps=100,
                        steps=8000))
    c.prior.architecture = ml_collections.ConfigDict(dict(width=256, num_blocks=3))
    c.addt.lambda_scale = 0.07
    c.train.update(dict(steps=1500, classifier_steps=2000, log_every=100, ckpt_every=1000))
    c.diffusion.update(dict(t_star=40, unroll=False, remat=True))
    c.attack.update(dict(epsilon=0.15, step_size=0.0375, eot=10))
    c.eval.update(dict(num_images=240, batch_size=120, num_seeds=1))
  elif arg.ablation:
    raise config_lib.ConfigError(f"unknown ablation {arg.ablation!r}; this config has "
                                 f"{', '.join(ABLATIONS)}")
  if preset == "smoke":
    c.models = "pretrained,plain,addt"   # as quick; addt_no_rbgm's step has its own unit tests
    c.model.classifier_hidden = (16,)
    c.prior.update(dict(denoiser="residual_mlp", num_steps=20))
    c.prior.architecture = ml_collections.ConfigDict(dict(width=16, num_blocks=1))
    c.data.size = 8
    c.diffusion.t_star = 2
    # No PGD-100 check: one compile fewer (tests/methods/diffusion_purification covers it).
    c.attack.update(dict(epsilon=0.15, step_size=0.05, steps=2, eot=2, convergence_steps=0))
    c.addt.cgpo_iterations = 2
    c.train.update(dict(steps=3, classifier_steps=None, batch_size=16, log_every=1,
                        ckpt_every=2, progress=False))
    c.prior.steps = 3
    c.eval.update(dict(num_images=16, batch_size=8, num_draws=2, num_seeds=2))
  if arg.steps:
    c.train.steps = arg.steps
  return config_lib.finalize(c)
