"""ctrl: conditional control of a pretrained diffusion model by KL-regularised RL (ICLR 2025).

COMMAND: python -m experiments.ctrl --config=configs/ctrl.py:quick
EXPECTED (quick, 2 CPU cores, ~9.5 minutes with the priors trained, ~7.5 with them cached):
CTRL moves the pretrained priors towards the labels on all three tasks at 150 updates; on
digits_class_ink it beats CFG trained on the images that carry both labels; it is still far from
its objective's optimum, so on toy2d it does not reach the target law p_pre(x) p_hat(y | x)
(the long preset does; there, at 1,000 digits updates, CFG memorises its few labelled images
and beats CTRL on accuracy with the worst Frechet distance to the truth of any method).
CFG fine-tuned on the same labels, reconstruction and classifier guidance beside it. Numbers:
results/ctrl.json, discussed (with the claims that fail) in jaxlab/methods/ctrl/README.md.

Presets: smoke (tests, seconds), quick (the CPU reproduction), long (every task, toy2d at 2,000
CTRL updates and the digits at 1,000 instead of 150, for the claims about CTRL near its
objective's optimum: results/ctrl_long.json, ~32 minutes), paper (= quick: the paper has no
small-scale setting to copy; its official runs fine-tune Stable Diffusion).
"""
from __future__ import annotations

import ml_collections

from jaxlab.core import config as config_lib

TASKS = ("toy2d", "digits_class", "digits_class_ink")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, presets=config_lib.ALL_PRESETS, default_preset="quick")
  preset = arg.preset
  c = config_lib.base_config(preset=preset, seed=0)
  c.tasks = ",".join(TASKS)
  # Which baselines run beside CTRL: pretrained, reconstruction_guidance, classifier_guidance, cfg.
  c.baselines = "all"
  c.data = ml_collections.ConfigDict(dict(offline_sizes=(50, 1000)))
  # The toy prior: an MLP DDPM on the ring (cached by jaxlab.diffusion.priors). T = 1000 with
  # DDPM's linear betas, so that x_T is N(0, I) as the sampler assumes (at T = 50 these betas keep
  # alpha_bar_T = 0.60); the chains take `ctrl.sample_steps` DDIM steps of it, as the official
  # code takes 50 of Stable Diffusion's 1,000.
  c.toy2d = ml_collections.ConfigDict(dict(prior=ml_collections.ConfigDict(dict(
      dataset="gaussian_ring", size=20_000, denoiser="residual_mlp", parameterization="eps",
      schedule="linear", num_steps=1000, steps=4000, batch_size=256, lr=1e-3,
      warmup_fraction=0.05, grad_clip=1.0, ema_max=0.999, ema_power=0.75,
      seed=c.get_ref("seed"),
      architecture=ml_collections.ConfigDict(dict(width=128, num_blocks=3)),
      dataset_options=ml_collections.ConfigDict(dict(seed=0, modes=8, radius=2.0, std=0.2)),
      cache_dir=ml_collections.config_dict.placeholder(str)))))
  # The digits prior: an MLP DDPM on the 8x8 training split (1,437 images; 360 held out), cached.
  # The oracle that scores samples: a wider, deeper MLP on the whole training split.
  c.digits = ml_collections.ConfigDict(dict(
      prior=ml_collections.ConfigDict(dict(
          dataset="digits", size=8, denoiser="residual_mlp", parameterization="eps",
          schedule="linear", num_steps=1000, steps=6000, batch_size=256, lr=1e-3,
          warmup_fraction=0.05, grad_clip=1.0, ema_max=0.999, ema_power=0.75,
          seed=c.get_ref("seed"),
          architecture=ml_collections.ConfigDict(dict(width=256, num_blocks=3)),
          dataset_options=ml_collections.ConfigDict(dict(num_test=360, split_seed=0)),
          cache_dir=ml_collections.config_dict.placeholder(str))),
      oracle=ml_collections.ConfigDict(dict(hidden=(256, 256, 256), steps=2000, seed=1234)),
      # digits_class_ink: digit labels on 200 images, ink labels on 200, 50 of them in both.
      ink=ml_collections.ConfigDict(dict(num_digit=200, num_ink=200, num_both=50)),
      # num_candidates: prior samples the truth is accepted from; num_samples: per label.
      eval=ml_collections.ConfigDict(dict(num_candidates=20_000, num_samples=200))))
  # The reward classifier p_hat(y | x): an MLP, temperature-scaled on a held-out 20%.
  c.reward = ml_collections.ConfigDict(dict(hidden=(64, 64), steps=1000,
                                            validation_fraction=0.2))
  # CTRL (jaxlab.methods.ctrl.finetune.Settings; num_labels comes from the task).
  # CTRL's RL updates are the shared train.steps (checkpointed and resumed by core.replicas).
  # 150 updates of batch 64, the rates decaying to 0 by a cosine: what fits the 10 minutes
  # on 2 cores from a cold start (priors trained: 646 s at 200 updates, 1,056 s at 400).
  # toy2d's objective reaches its optimum -log Z near 400 updates
  # (results/ablations/ctrl_convergence_toy2d_n50_T1000_cpu.json), so its claim about the
  # converged law is the long preset's.
  c.train.update(dict(steps=150, log_every=50, ckpt_every=150))
  # A task group's own count of CTRL updates (and CFG steps), in place of train.steps; None keeps
  # train.steps. The long preset gives the digits fewer than toy2d: an update costs 2.5x.
  c.toy2d.rl_steps = ml_collections.config_dict.placeholder(int)
  c.digits.rl_steps = ml_collections.config_dict.placeholder(int)
  c.ctrl = ml_collections.ConfigDict(dict(
      steps=c.train.get_ref("steps"), batch_size=64, sample_steps=25, eta=1.0, parameterization="eps", alpha=1.0,
      kl_reduction="sum", finetune="lora", lora_rank=4, lora_lr=1e-3, embedding_lr=1e-2,
      lr_schedule="cosine", weight_decay=0.1, grad_clip=5.0, truncation="none", num_seeds=3,
      # jax.checkpoint per step is a switch; on, an update is faster here (digits: 0.375 against
      # 0.399 s, 3 seeds x batch 64, benchmarks/ctrl_speed.py): less memory traffic.
      remat=True,
      chunk_steps=50, ckpt_every=150,
      # The last two of the 25 DDIM steps (t = 79, 39) keep the pretrained denoiser: left to the
      # policy, the nearly noiseless last step takes all of digits' KL and nothing is learned
      # (results/ablations/ctrl_convergence_digits_class_n50_*T1000_cpu.json). A deviation.
      policy_min_t=100))
  # CFG fine-tuned on the offline labels: CTRL's steps x batch, label dropout 0.1, w = 1 and 3.
  c.cfg = ml_collections.ConfigDict(dict(steps=c.ctrl.get_ref("steps"),
                                         batch_size=c.ctrl.get_ref("batch_size"), lr=1e-3,
                                         label_dropout=0.1, weights=(1.0, 3.0)))
  # Reconstruction guidance weighted by sqrt(alpha_bar_t) (baselines.reconstruction_guidance):
  # unweighted ("none"), its samples diverge on these T = 1,000 priors. A deviation.
  c.guidance = ml_collections.ConfigDict(dict(scale=1.0, noisy_classifier_steps=1000,
                                              reconstruction_weighting="sqrt_alpha_bar"))
  # num_candidates: prior samples per rejection-sampled reference draw; num_samples: samples per
  # label of every method (and the size the noise floor is measured at).
  c.eval = ml_collections.ConfigDict(dict(num_candidates=4000, num_samples=1000))

  if preset == "long":
    # toy2d's claim is about the tuned law itself (within twice the noise floor of the target),
    # which needs CTRL at its optimum; at 400 updates its loss is still falling
    # (results/ablations/ctrl_convergence_toy2d_n50_T1000_cpu.json).
    c.train.update(dict(steps=2000, log_every=100, ckpt_every=500))
    # The digits' objective flattens after ~450 updates at a constant rate
    # (results/ablations/ctrl_convergence_digits_class_n50_frozen_below_t100_T1000_cpu.json);
    # 1,000 with the cosine decay, CFG fine-tuned for as many.
    c.digits.rl_steps = 1000
    c.ctrl.ckpt_every = 500
    # At a constant rate, 2,000 updates left CTRL hovering 2-4 noise floors from the target
    # (results/ctrl_long.json at 8510fa7): the rates decay to 0 by the last update.
    c.ctrl.lr_schedule = "cosine"
  if preset == "smoke":
    c.data.offline_sizes = (50,)
    c.toy2d.prior.update(dict(size=512, steps=20, batch_size=64))
    c.toy2d.prior.architecture.width = 16
    c.reward.update(dict(hidden=(8,), steps=20))
    c.train.update(dict(steps=4, log_every=2, ckpt_every=2))
    c.ctrl.update(dict(batch_size=16, sample_steps=5, num_seeds=2, chunk_steps=2, ckpt_every=2))
    c.digits.prior.update(dict(steps=10, batch_size=32))
    c.digits.prior.architecture.width = 16
    c.digits.oracle.update(dict(hidden=(16,), steps=10))
    c.digits.ink.update(dict(num_digit=20, num_ink=20, num_both=10))
    c.digits.eval.update(dict(num_candidates=200, num_samples=4))
    c.guidance.noisy_classifier_steps = 20
    c.eval.update(dict(num_candidates=200, num_samples=40))
    c.baselines = "pretrained"   # the other baselines have their own unit tests
    c.tasks = "digits_class_ink"   # the notebook runs toy2d; digits_class has a unit test
    c.cfg.weights = (1.0,)
    c.train.progress = False
  return config_lib.finalize(c)
