"""CTRL and its baselines on one task at one offline size, scored the task's way.

A task (toy2d, digits_class, digits_class_ink) hands over a `Problem`: the label count, the
fitted reward p_hat(y | x) every reward-driven method uses, the labelled examples CFG and the
noisy classifier learn from, and `score`, which turns one method's per-label samples into its
numbers. `run_methods` then runs the same samplers for every task. Every sampler, baselines
included, runs one chain: `sample_steps` DDIM steps with eta = 1 ending at t = 0
(`sampling.ddim_sample_with_kl`, its KL unused), so that methods differ only in their denoiser
(and guidance). Each method runs `ctrl.num_seeds` seeds (CTRL and CFG train one model per seed;
the training-free ones draw fresh samples); each number is the seed mean with its standard error
and the per-seed values.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import results
from jaxlab.diffusion import priors
from jaxlab.diffusion import sampling
from jaxlab.methods.ctrl import baselines
from jaxlab.methods.ctrl import classifiers
from jaxlab.methods.ctrl import finetune

BASELINES = ("pretrained", "reconstruction_guidance", "classifier_guidance", "cfg")
# Per-label samples of one method: {label: samples [n, ...]}.
Samples = dict[int, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Problem:
  """One task at one offline size N."""
  num_labels: int
  reward: Callable[[jax.Array, jax.Array], jax.Array]   # log p_hat(y | x0) [B], jittable
  labelled_x: np.ndarray        # the examples with the (joint) label: CFG's and the noisy
  labelled_y: np.ndarray        # classifier's training data
  score: Callable[[Samples], dict[str, float]]
  truth: Samples                # shown beside the methods' samples


def chain_sample(denoise: sampling.DenoiseFn, schedule, x_T: jax.Array, key: jax.Array, *,
                 num_steps: int, parameterization: str,
                 guidance: sampling.GuidanceFn | None = None,
                 shared_time: bool = True) -> jax.Array:
  """x0 of the shared chain (DDIM, eta = 1, ending at t = 0) under `denoise` (given the step's t
  as a scalar with `shared_time`, as CTRL's training chain: `finetune.Settings.shared_time`)."""
  keys = jax.random.split(key, num_steps)
  x0, _ = sampling.ddim_sample_with_kl(denoise, denoise, schedule, x_T, keys,
                                       num_steps=num_steps, eta=1.0,
                                       parameterization=parameterization, guidance=guidance,
                                       shared_time=shared_time)
  return x0


def prior_sampler(prior: priors.Prior, num: int, num_steps: int) -> Callable[[jax.Array], Any]:
  """A jitted key -> `num` samples of the prior's chain (compiled once, called per draw)."""
  def sample(params, key):
    x_T = jax.random.normal(jax.random.fold_in(key, 1), (num, *prior.spec.sample_shape))
    return chain_sample(lambda x, t: prior.apply(params, x, t), prior.schedule, x_T, key,
                        num_steps=num_steps, parameterization=prior.spec.parameterization)
  compiled = jax.jit(sample)
  return lambda key: compiled(prior.params, key)


def prior_draws(prior: priors.Prior, num: int, num_steps: int, keys: list[int]
                ) -> list[np.ndarray]:
  """One `num`-sample draw of the prior's chain per key."""
  sample = prior_sampler(prior, num, num_steps)
  return [np.asarray(sample(jax.random.key(k))) for k in keys]


def summarize_seeds(per_seed: list[dict[str, float]]) -> dict[str, Any]:
  """{metric: mean, metric_se: standard error, metric_seeds: [...]} over seeds."""
  out: dict[str, Any] = {}
  for key in per_seed[0]:
    values = [s[key] for s in per_seed]
    out[key] = float(np.mean(values))
    out[f"{key}_se"] = results.standard_error(values)
    out[f"{key}_seeds"] = values
  return out


def labelled_sampler(denoise_for: Callable[[Any, jax.Array], sampling.DenoiseFn], prior, *,
                     num_steps: int, guidance_for=None,
                     shared_time: bool = True) -> Callable[..., jax.Array]:
  """A jitted (params, labels [B], key) -> x0 for a label-conditional denoiser (and guidance);
  the params are an argument, so every seed's params share one compile."""
  shape = prior.spec.sample_shape

  def run(params, labels, key):
    x_T = jax.random.normal(jax.random.fold_in(key, 1), (labels.shape[0], *shape))
    return chain_sample(denoise_for(params, labels), prior.schedule, x_T, key,
                        num_steps=num_steps, parameterization=prior.spec.parameterization,
                        guidance=None if guidance_for is None else guidance_for(labels),
                        shared_time=shared_time)
  return jax.jit(run)


def per_label_samples(sampler, params, num: int, num_labels: int, key: jax.Array) -> Samples:
  """`num` samples for each label, all labels in one batch (one compile per method)."""
  labels = jnp.repeat(jnp.arange(num_labels, dtype=jnp.int32), num)
  x0 = np.asarray(sampler(params, labels, key))
  return {y: x0[y * num:(y + 1) * num] for y in range(num_labels)}


def score_seeds(sampler, params_per_seed: list, num: int, key_base: int, problem: Problem,
                shown: dict[str, Any], name: str) -> dict[str, Any]:
  """Scores `sampler` with each seed's params; keeps the first seed's samples in `shown`."""
  per_seed = []
  for s, params in enumerate(params_per_seed):
    samples = per_label_samples(sampler, params, num, problem.num_labels,
                                jax.random.key(key_base + s))
    if s == 0:
      shown[name] = samples
    per_seed.append(problem.score(samples))
  return summarize_seeds(per_seed)


def run_methods(config: ml_collections.ConfigDict, prior: priors.Prior, problem: Problem,
                num_samples: int, workdir: str, desc: str) -> dict[str, Any]:
  """CTRL and the selected baselines on `problem`, `num_samples` per label and seed:
  {"methods", "ctrl_train", "samples", "seconds"} (seconds: each method's wall time, its
  training included, compiles and scoring too; CTRL's training is also `ctrl_train.wall_s`)."""
  key = jax.random.key(config.seed)
  ctrl_group = config.ctrl
  steps = ctrl_group.sample_steps
  num = num_samples
  seeds = ctrl_group.num_seeds
  apply, policy_params = baselines.prior_network(prior, problem.num_labels)
  out: dict[str, Any] = {}
  shown: dict[str, Any] = {}
  seconds: dict[str, float] = {}
  started = time.perf_counter()

  def lap(name: str) -> None:
    nonlocal started
    now = time.perf_counter()
    seconds[name] = now - started
    started = now

  ctrl_settings = finetune.Settings.from_config(ctrl_group, num_labels=problem.num_labels)
  shared_time = ctrl_settings.shared_time   # every chain as CTRL's training chain
  tuned = finetune.finetune(apply, policy_params, prior.apply, prior.params, prior.schedule,
                            problem.reward, ctrl_settings,
                            jax.random.fold_in(key, 1), sample_shape=prior.spec.sample_shape,
                            workdir=os.path.join(workdir, "ctrl"),
                            progress=config.train.progress, desc=desc)
  conditional = labelled_sampler(
      lambda p, labels: finetune.policy_denoiser(apply, p, prior.apply, prior.params, labels,
                                                 ctrl_settings),
      prior, num_steps=steps, shared_time=shared_time)
  out["ctrl"] = score_seeds(conditional, tuned.params, num, 100, problem, shown, "ctrl")
  last = tuned.history[-1] if tuned.history else {}
  train = {"reward": last.get("train/reward"), "kl": last.get("train/kl"),
           "steps": ctrl_settings.steps, "wall_s": tuned.wall_s}
  lap("ctrl")

  chosen = config_lib.select_names(config, "baselines", BASELINES)
  base = lambda p, labels: (lambda xt, t: prior.apply(p, xt, t))
  unconditional = [prior.params] * seeds
  if "pretrained" in chosen:
    pretrained = labelled_sampler(base, prior, num_steps=steps, shared_time=shared_time)
    out["pretrained"] = score_seeds(pretrained, unconditional, num, 200, problem, shown,
                                    "pretrained")
    lap("pretrained")
  if "reconstruction_guidance" in chosen:
    denoise = lambda xt, t: prior.apply(prior.params, xt, t)
    reconstruction = labelled_sampler(base, prior, num_steps=steps, shared_time=shared_time,
                                      guidance_for=lambda labels:
                                      baselines.reconstruction_guidance(
                                          denoise, prior.schedule, problem.reward, labels,
                                          config.guidance.scale,
                                          parameterization=prior.spec.parameterization,
                                          weighting=config.guidance.reconstruction_weighting))
    out["reconstruction_guidance"] = score_seeds(reconstruction, unconditional, num, 300,
                                                 problem, shown, "reconstruction_guidance")
    lap("reconstruction_guidance")
  if "classifier_guidance" in chosen:
    noisy = classifiers.fit_noisy(problem.labelled_x, problem.labelled_y, problem.num_labels,
                                  prior.schedule, hidden=tuple(config.reward.hidden),
                                  steps=config.guidance.noisy_classifier_steps,
                                  key=jax.random.fold_in(key, 2))
    guided = labelled_sampler(base, prior, num_steps=steps, shared_time=shared_time,
                              guidance_for=lambda labels:
                              baselines.classifier_guidance(noisy, prior.schedule, labels,
                                                            config.guidance.scale))
    out["classifier_guidance"] = score_seeds(guided, unconditional, num, 400, problem, shown,
                                             "classifier_guidance")
    lap("classifier_guidance")
  if "cfg" in chosen:
    # Fine-tuned on the labelled examples for CTRL's steps x batch.
    settings = baselines.CfgSettings(steps=config.cfg.steps, batch_size=config.cfg.batch_size,
                                     lr=config.cfg.lr, label_dropout=config.cfg.label_dropout)
    cfg_params = baselines.cfg_finetune(apply, policy_params, prior.schedule, problem.labelled_x,
                                        problem.labelled_y, problem.num_labels, settings,
                                        jax.random.fold_in(key, 3),
                                        parameterization=prior.spec.parameterization,
                                        num_seeds=seeds)
    per_seed = [jax.tree.map(lambda leaf, s=s: leaf[s], cfg_params) for s in range(seeds)]
    for weight in config.cfg.weights:
      sampler = labelled_sampler(
          lambda p, labels, w=weight: baselines.cfg_denoiser(apply, p, labels,
                                                             problem.num_labels, w),
          prior, num_steps=steps, shared_time=shared_time)
      out[f"cfg_w{weight:g}"] = score_seeds(sampler, per_seed, num, 500, problem, shown,
                                            f"cfg_w{weight:g}")
    lap("cfg")
  shown["truth"] = problem.truth
  return {"methods": out, "ctrl_train": train, "samples": shown, "seconds": seconds}
