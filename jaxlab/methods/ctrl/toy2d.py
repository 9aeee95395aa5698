"""The toy2d study: CTRL and its baselines on the 8-Gaussian ring, against the exact answer.

The prior is an MLP DDPM (T = 50) pretrained on the ring; p(y = 1 | x) = sigmoid(4 x_1) is known,
so the law CTRL targets, p_pre(x) p(y | x) / Z, can be sampled exactly by rejection from the
prior's own chain ("truth"); "target" is the same with the fitted, temperature-scaled reward
classifier in place of the true p, the best a method that only sees the N offline labels can
reach. Every sampler, baselines and truth included, runs the same chain: `sample_steps` DDIM
steps with eta = 1 ending at t = 0 (`sampling.ddim_sample_with_kl`, its KL unused), so that the
only difference between methods is their denoiser (and guidance).

Numbers per method and N: accuracy (the mean true p(y | x0) of its samples), ed_truth and
ed_target (energy distances to the truth's and target's samples, per label, averaged), each a
mean over seeds with its standard error; and the noise floor, the mean |energy distance| between
same-size subsets of two independent target draws.
"""
from __future__ import annotations

import dataclasses
import os
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
from jaxlab.methods.ctrl import evaluation
from jaxlab.methods.ctrl import finetune
from jaxlab.methods.ctrl import tasks

NUM_LABELS = 2
BASELINES = ("pretrained", "reconstruction_guidance", "classifier_guidance", "cfg")


def chain_sample(denoise: sampling.DenoiseFn, schedule, x_T: jax.Array, key: jax.Array, *,
                 num_steps: int, parameterization: str,
                 guidance: sampling.GuidanceFn | None = None) -> jax.Array:
  """x0 of the shared chain (DDIM, eta = 1, ending at t = 0) under `denoise`."""
  keys = jax.random.split(key, num_steps)
  x0, _ = sampling.ddim_sample_with_kl(denoise, denoise, schedule, x_T, keys,
                                       num_steps=num_steps, eta=1.0,
                                       parameterization=parameterization, guidance=guidance)
  return x0


def prior_sampler(prior: priors.Prior, num: int, num_steps: int) -> Callable[[jax.Array], Any]:
  """A jitted key -> `num` samples of the prior's chain (compiled once, called per draw)."""
  def sample(params, key):
    x_T = jax.random.normal(jax.random.fold_in(key, 1), (num, *prior.spec.sample_shape))
    return chain_sample(lambda x, t: prior.apply(params, x, t), prior.schedule, x_T, key,
                        num_steps=num_steps, parameterization=prior.spec.parameterization)
  compiled = jax.jit(sample)
  return lambda key: compiled(prior.params, key)


@dataclasses.dataclass
class Reference:
  """Per label: the truth's and the target's samples, and a second target draw."""
  truth: dict[int, np.ndarray]
  target: dict[int, np.ndarray]
  target_again: dict[int, np.ndarray]


def reference_samples(prior: priors.Prior, fitted_log_prob: tasks.LogProb, num_candidates: int,
                      num_steps: int, seed: int) -> Reference:
  rng = np.random.default_rng(seed)
  sample = prior_sampler(prior, num_candidates, num_steps)
  draws = [np.asarray(sample(jax.random.key(seed * 3 + i))) for i in range(3)]
  truth = {y: tasks.rejection_sample(draws[0], tasks.toy2d_log_prob, y, rng=rng)
           for y in range(NUM_LABELS)}
  target = {y: tasks.rejection_sample(draws[1], fitted_log_prob, y, rng=rng)
            for y in range(NUM_LABELS)}
  again = {y: tasks.rejection_sample(draws[2], fitted_log_prob, y, rng=rng)
           for y in range(NUM_LABELS)}
  return Reference(truth, target, again)


def score(samples: dict[int, np.ndarray], reference: Reference) -> dict[str, float]:
  """accuracy, ed_truth, ed_target of one method's samples per label."""
  accuracy = np.mean([np.mean(np.exp(tasks.toy2d_log_prob(x, np.full(len(x), y))))
                      for y, x in samples.items()])
  return {"accuracy": float(accuracy),
          "ed_truth": float(np.mean([evaluation.energy_distance(x, reference.truth[y])
                                     for y, x in samples.items()])),
          "ed_target": float(np.mean([evaluation.energy_distance(x, reference.target[y])
                                      for y, x in samples.items()]))}


def noise_floor(reference: Reference, size: int, *, repeats: int = 5, seed: int = 0) -> float:
  """The energy distance's noise at this sample size: mean |ED| between `size`-point subsets of
  two independent target draws, over `repeats` subsets and the labels (an unbiased ED between
  two draws of one law is 0 on average, so its magnitude is the noise)."""
  rng = np.random.default_rng(seed)
  values = []
  for y in range(NUM_LABELS):
    a, b = reference.target[y], reference.target_again[y]
    n = min(size, len(a), len(b))
    for _ in range(repeats):
      values.append(abs(evaluation.energy_distance(a[rng.choice(len(a), n, replace=False)],
                                                   b[rng.choice(len(b), n, replace=False)])))
  return float(np.mean(values))


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
                     num_steps: int, guidance_for=None) -> Callable[..., jax.Array]:
  """A jitted (params, labels [B], key) -> x0 for a label-conditional denoiser (and guidance);
  the params are an argument, so every seed's params share one compile."""
  shape = prior.spec.sample_shape

  def run(params, labels, key):
    x_T = jax.random.normal(jax.random.fold_in(key, 1), (labels.shape[0], *shape))
    return chain_sample(denoise_for(params, labels), prior.schedule, x_T, key,
                        num_steps=num_steps, parameterization=prior.spec.parameterization,
                        guidance=None if guidance_for is None else guidance_for(labels))
  return jax.jit(run)


def per_label_samples(sampler, params, num: int, key: jax.Array) -> dict[int, np.ndarray]:
  return {y: np.asarray(sampler(params, jnp.full((num,), y, jnp.int32),
                                jax.random.fold_in(key, y)))
          for y in range(NUM_LABELS)}


def score_seeds(sampler, params_per_seed: list, num: int, key_base: int, reference: Reference,
                shown: dict[str, Any], name: str) -> dict[str, Any]:
  """Scores `sampler` with each seed's params; keeps the first seed's samples in `shown`."""
  per_seed = []
  for s, params in enumerate(params_per_seed):
    samples = per_label_samples(sampler, params, num, jax.random.key(key_base + s))
    if s == 0:
      shown[name] = samples
    per_seed.append(score(samples, reference))
  return summarize_seeds(per_seed)


def run_size(config: ml_collections.ConfigDict, prior: priors.Prior, num_offline: int,
             workdir: str) -> dict[str, Any]:
  """Every method at one offline set size N; returns the metrics of `metrics.toy2d.n<N>`."""
  ring_options = dict(prior.spec.dataset_options)
  ring_options.pop("seed", None)
  x, y = tasks.toy2d_offline(num_offline, seed=config.seed, ring_options=ring_options)
  key = jax.random.key(config.seed)
  reward, reward_report = classifiers.fit(
      x, y, NUM_LABELS, hidden=tuple(config.reward.hidden), steps=config.reward.steps,
      key=jax.random.fold_in(key, 0), validation_fraction=config.reward.validation_fraction)
  fitted = lambda xs, ys: np.asarray(reward.log_prob(jnp.asarray(xs, jnp.float32),
                                                     jnp.asarray(ys)))
  steps = config.ctrl.sample_steps
  reference = reference_samples(prior, fitted, config.eval.num_candidates, steps, config.seed)
  num = config.eval.num_samples
  seeds = config.ctrl.num_seeds
  apply, policy_params = baselines.prior_network(prior, NUM_LABELS)
  reference_apply = prior.apply
  out: dict[str, Any] = {}

  # CTRL
  tuned = finetune.finetune(apply, policy_params, reference_apply, prior.params, prior.schedule,
                            reward.log_prob,
                            finetune.Settings.from_config(config.ctrl, num_labels=NUM_LABELS),
                            jax.random.fold_in(key, 1),
                            sample_shape=prior.spec.sample_shape,
                            workdir=os.path.join(workdir, f"ctrl_n{num_offline}"),
                            progress=config.train.progress, desc=f"ctrl toy2d n={num_offline}")
  shown: dict[str, Any] = {}
  conditional = labelled_sampler(lambda p, labels: (lambda xt, t: apply(p, xt, t, labels)),
                                 prior, num_steps=steps)
  out["ctrl"] = score_seeds(conditional, tuned.params, num, 100, reference, shown, "ctrl")
  last = tuned.history[-1] if tuned.history else {}
  train = {"reward": last.get("train/reward"), "kl": last.get("train/kl"),
           "wall_s": tuned.wall_s}

  # Pretrained (no control) and the guidances.
  chosen = config_lib.select_names(config, "baselines", BASELINES)
  base = lambda p, labels: (lambda xt, t: prior.apply(p, xt, t))
  unconditional = [prior.params] * seeds
  if "pretrained" in chosen:
    pretrained = labelled_sampler(base, prior, num_steps=steps)
    out["pretrained"] = score_seeds(pretrained, unconditional, num, 200, reference, shown,
                                    "pretrained")
  if "reconstruction_guidance" in chosen:
    denoise = lambda xt, t: prior.apply(prior.params, xt, t)
    reconstruction = labelled_sampler(base, prior, num_steps=steps, guidance_for=lambda labels:
                                      baselines.reconstruction_guidance(
                                          denoise, prior.schedule, reward.log_prob, labels,
                                          config.guidance.scale,
                                          parameterization=prior.spec.parameterization))
    out["reconstruction_guidance"] = score_seeds(reconstruction, unconditional, num, 300,
                                                 reference, shown, "reconstruction_guidance")
  if "classifier_guidance" in chosen:
    noisy = classifiers.fit_noisy(x, y, NUM_LABELS, prior.schedule,
                                  hidden=tuple(config.reward.hidden),
                                  steps=config.guidance.noisy_classifier_steps,
                                  key=jax.random.fold_in(key, 2))
    guided = labelled_sampler(base, prior, num_steps=steps, guidance_for=lambda labels:
                              baselines.classifier_guidance(noisy, prior.schedule, labels,
                                                            config.guidance.scale))
    out["classifier_guidance"] = score_seeds(guided, unconditional, num, 400, reference, shown,
                                             "classifier_guidance")
  if "cfg" not in chosen:
    return _size_result(out, reference, num, train, reward_report, shown)

  # CFG, fine-tuned on the N labelled points for CTRL's steps x batch.
  cfg_settings = baselines.CfgSettings(steps=config.cfg.steps, batch_size=config.cfg.batch_size,
                                       lr=config.cfg.lr, label_dropout=config.cfg.label_dropout)
  cfg_params = baselines.cfg_finetune(apply, policy_params, prior.schedule, x, y, NUM_LABELS,
                                      cfg_settings, jax.random.fold_in(key, 3),
                                      parameterization=prior.spec.parameterization,
                                      num_seeds=seeds)
  cfg_per_seed = [jax.tree.map(lambda leaf, s=s: leaf[s], cfg_params) for s in range(seeds)]
  for weight in config.cfg.weights:
    sampler = labelled_sampler(
        lambda p, labels, w=weight: baselines.cfg_denoiser(apply, p, labels, NUM_LABELS, w),
        prior, num_steps=steps)
    out[f"cfg_w{weight:g}"] = score_seeds(sampler, cfg_per_seed, num, 500, reference, shown,
                                          f"cfg_w{weight:g}")
  return _size_result(out, reference, num, train, reward_report, shown)


def _size_result(out, reference, num, train, reward_report, shown) -> dict[str, Any]:
  shown["truth"] = reference.truth
  return {"methods": out, "noise_floor": noise_floor(reference, num), "ctrl_train": train,
          "reward_classifier": reward_report,
          "truth_accepted": {str(k): len(v) for k, v in reference.truth.items()},
          "samples": shown}
