"""The 8x8-digits studies: digits_class (y = the digit) and digits_class_ink (y = digit and ink).

The prior is an unconditional DDPM on the training split (a residual MLP); an oracle, a wider and
deeper MLP trained on the whole training split and never shown to a method, stands in for the
true p(digit | x). What each method may use is the offline set; what it is judged on:

* accuracy: the share of its samples the oracle assigns to the requested digit (with the
  binomial standard error over the samples and the macro F1 of the oracle's calls);
* fd_truth: the Frechet distance (raw pixels, per requested label, averaged) to the "truth", the
  prior's own samples accepted with the oracle's p(y | x) (the law CTRL targets at alpha = 1);
* fd_real: the same against the training images of that digit (those with the requested ink too,
  for digits_class_ink).

digits_class_ink's labels are y = 2 * digit + ink, ink = mean grey level above the training
median (exact). The reward is log p_digit(d | x) + log p_ink(i | x), two classifiers fitted on
the images that carry each label; CFG and the noisy classifier learn from the `num_both` images
that carry both. Its accuracies are acc_class (the oracle's digit), acc_ink (the exact ink) and
acc_joint (both right).
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


@dataclasses.dataclass(frozen=True)
class DigitsData:
  """The training split (the prior's data and the offline pool), its oracle and its ink rule."""
  train_x: np.ndarray
  train_y: np.ndarray
  oracle: classifiers.Classifier
  oracle_test_accuracy: float
  ink: tasks.InkRule


def load_data(config: ml_collections.ConfigDict) -> DigitsData:
  options = config.digits.prior.dataset_options
  common = dict(size=config.digits.prior.size, num_test=options.num_test,
                split_seed=options.split_seed)
  train_x, train_y = tasks.digits_split("train", **common)
  test_x, test_y = tasks.digits_split("test", **common)
  oracle, _ = classifiers.fit(train_x, train_y, tasks.NUM_DIGITS,
                              hidden=tuple(config.digits.oracle.hidden),
                              steps=config.digits.oracle.steps,
                              key=jax.random.key(config.digits.oracle.seed))
  predicted = np.asarray(oracle.logits(jnp.asarray(test_x))).argmax(-1)
  return DigitsData(train_x=train_x, train_y=train_y, oracle=oracle,
                    oracle_test_accuracy=float(np.mean(predicted == test_y)),
                    ink=tasks.ink_rule(train_x))


def oracle_digits(data: DigitsData, x: np.ndarray) -> np.ndarray:
  return np.asarray(data.oracle.logits(jnp.asarray(x, jnp.float32))).argmax(-1)


def oracle_log_prob(data: DigitsData, x: np.ndarray, digit: np.ndarray) -> np.ndarray:
  return np.asarray(data.oracle.log_prob(jnp.asarray(x, jnp.float32), jnp.asarray(digit)))


def _mean_fd(samples: study.Samples, reference: study.Samples) -> float:
  return float(np.mean([evaluation.frechet_distance(x, reference[y])
                        for y, x in samples.items()]))


def _truth(candidates: np.ndarray, log_prob: tasks.LogProb, num_labels: int, seed: int
           ) -> study.Samples:
  rng = np.random.default_rng(seed)
  return {y: tasks.rejection_sample(candidates, log_prob, y, rng=rng) for y in range(num_labels)}


def _fit_reward(x, y, num_classes, config, key):
  return classifiers.fit(x, y, num_classes, hidden=tuple(config.reward.hidden),
                         steps=config.reward.steps, key=key,
                         validation_fraction=config.reward.validation_fraction)


def class_problem(config, data: DigitsData, candidates: np.ndarray, num_offline: int
                  ) -> tuple[study.Problem, dict[str, Any]]:
  """digits_class at N offline images: (problem, {"reward_classifier", "truth_accepted"})."""
  rows = tasks.subset(num_offline, len(data.train_x), seed=config.seed)
  x, y = data.train_x[rows], data.train_y[rows]
  reward, report = _fit_reward(x, y, tasks.NUM_DIGITS, config,
                               jax.random.fold_in(jax.random.key(config.seed), 10))
  truth = _truth(candidates, lambda xs, ys: oracle_log_prob(data, xs, ys), tasks.NUM_DIGITS,
                 config.seed)
  real = {d: data.train_x[data.train_y == d] for d in range(tasks.NUM_DIGITS)}

  def score(samples: study.Samples) -> dict[str, float]:
    requested = np.concatenate([np.full(len(v), y) for y, v in samples.items()])
    called = oracle_digits(data, np.concatenate(list(samples.values())))
    accuracy = float(np.mean(called == requested))
    return {"accuracy": accuracy,
            "accuracy_binomial_se": evaluation.binomial_se(accuracy, len(requested)),
            "macro_f1": evaluation.macro_f1(called, requested, tasks.NUM_DIGITS),
            "fd_truth": _mean_fd(samples, truth), "fd_real": _mean_fd(samples, real)}

  problem = study.Problem(num_labels=tasks.NUM_DIGITS, reward=reward.log_prob, labelled_x=x,
                          labelled_y=y, score=score, truth=truth)
  return problem, {"reward_classifier": report,
                   "truth_accepted": {str(k): len(v) for k, v in truth.items()}}


def ink_problem(config, data: DigitsData, candidates: np.ndarray
                ) -> tuple[study.Problem, dict[str, Any]]:
  """digits_class_ink: (problem, {"reward_classifier": {"digit", "ink"}, "truth_accepted"})."""
  group = config.digits.ink
  offline = tasks.ink_offline(data.train_x, data.train_y, data.ink, num_digit=group.num_digit,
                              num_ink=group.num_ink, num_both=group.num_both, seed=config.seed)
  key = jax.random.fold_in(jax.random.key(config.seed), 20)
  digit_reward, digit_report = _fit_reward(offline.digit_x, offline.digit_y, tasks.NUM_DIGITS,
                                           config, jax.random.fold_in(key, 0))
  ink_reward, ink_report = _fit_reward(offline.ink_x, offline.ink_y, 2, config,
                                       jax.random.fold_in(key, 1))
  num_labels = 2 * tasks.NUM_DIGITS

  def reward(x0, label):
    digit, ink_label = label // 2, label % 2
    return digit_reward.log_prob(x0, digit) + ink_reward.log_prob(x0, ink_label)

  def true_log_prob(xs, labels):
    digit, ink_label = tasks.split_joint_label(labels)
    exact_ink = np.where(data.ink.labels(xs) == ink_label, 0.0, -np.inf)
    return oracle_log_prob(data, xs, digit) + exact_ink

  truth = _truth(candidates, true_log_prob, num_labels, config.seed)
  train_joint = tasks.joint_label(data.train_y, data.ink.labels(data.train_x))
  real = {y: data.train_x[train_joint == y] for y in range(num_labels)}

  def score(samples: study.Samples) -> dict[str, float]:
    requested = np.concatenate([np.full(len(v), y) for y, v in samples.items()])
    x = np.concatenate(list(samples.values()))
    want_digit, want_ink = tasks.split_joint_label(requested)
    right_digit = oracle_digits(data, x) == want_digit
    right_ink = data.ink.labels(x) == want_ink
    # A label whose truth accepted < 2 samples has no covariance: left out of the FD mean.
    usable = {y: v for y, v in samples.items() if len(truth[y]) >= 2 and len(real[y]) >= 2}
    return {"acc_class": float(np.mean(right_digit)), "acc_ink": float(np.mean(right_ink)),
            "acc_joint": float(np.mean(right_digit & right_ink)),
            "fd_truth": _mean_fd(usable, truth), "fd_real": _mean_fd(usable, real)}

  problem = study.Problem(num_labels=num_labels, reward=reward, labelled_x=offline.joint_x,
                          labelled_y=offline.joint_y, score=score, truth=truth)
  return problem, {"reward_classifier": {"digit": digit_report, "ink": ink_report},
                   "truth_accepted": {str(k): len(v) for k, v in truth.items()}}


def candidates_of(config, prior: priors.Prior) -> np.ndarray:
  """The prior's samples the truth is accepted from (one draw, the shared chain)."""
  return study.prior_draws(prior, config.digits.eval.num_candidates,
                           config.ctrl.sample_steps,
                           [config.seed * 3 + 7])[0]


def run(config: ml_collections.ConfigDict, prior: priors.Prior, selected: list[str],
        workdir: str) -> dict[str, Any]:
  """The selected digits tasks: {task: {"n<N>": row}} plus "oracle_test_accuracy"."""
  data = load_data(config)
  candidates = candidates_of(config, prior)
  out: dict[str, Any] = {"oracle_test_accuracy": data.oracle_test_accuracy}
  if "digits_class" in selected:
    rows = {}
    for size in config.data.offline_sizes:
      problem, extra = class_problem(config, data, candidates, int(size))
      row = study.run_methods(config, prior, problem, config.digits.eval.num_samples,
                              os.path.join(workdir, "digits_class", f"n{size}"),
                              desc=f"ctrl digits_class n={size}")
      rows[f"n{size}"] = dict(row, **extra)
    out["digits_class"] = rows
  if "digits_class_ink" in selected:
    problem, extra = ink_problem(config, data, candidates)
    size = config.digits.ink.num_both
    row = study.run_methods(config, prior, problem, config.digits.eval.num_samples,
                            os.path.join(workdir, "digits_class_ink", f"n{size}"),
                            desc="ctrl digits_class_ink")
    out["digits_class_ink"] = {f"n{size}": dict(row, **extra)}
  return out
