"""The toy2d study: CTRL and its baselines on the 8-Gaussian ring, against the exact answer.

The prior is an MLP DDPM (T = 1000) pretrained on the ring; p(y = 1 | x) = sigmoid(4 x_1) is known,
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
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.diffusion import priors
from jaxlab.methods.ctrl import classifiers
from jaxlab.methods.ctrl import evaluation
from jaxlab.methods.ctrl import study
from jaxlab.methods.ctrl import tasks

NUM_LABELS = 2


@dataclasses.dataclass
class Reference:
  """Per label: the truth's and the target's samples, and a second target draw."""
  truth: dict[int, np.ndarray]
  target: dict[int, np.ndarray]
  target_again: dict[int, np.ndarray]


def reference_samples(prior: priors.Prior, fitted_log_prob: tasks.LogProb, num_candidates: int,
                      num_steps: int, seed: int) -> Reference:
  rng = np.random.default_rng(seed)
  draws = study.prior_draws(prior, num_candidates, num_steps, [seed * 3 + i for i in range(3)])
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
  reference = reference_samples(prior, fitted, config.eval.num_candidates,
                                config.ctrl.sample_steps, config.seed)
  problem = study.Problem(num_labels=NUM_LABELS, reward=reward.log_prob, labelled_x=x,
                          labelled_y=y, score=lambda samples: score(samples, reference),
                          truth=reference.truth)
  row = study.run_methods(config, prior, problem, config.eval.num_samples,
                          os.path.join(workdir, f"n{num_offline}"),
                          desc=f"ctrl toy2d n={num_offline}")
  return dict(row, noise_floor=noise_floor(reference, config.eval.num_samples),
              reward_classifier=reward_report,
              truth_accepted={str(k): len(v) for k, v in reference.truth.items()})
