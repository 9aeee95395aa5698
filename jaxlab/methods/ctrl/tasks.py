"""CTRL's offline tasks: the labelled data a reward is learnt from, and the laws a tuned model
should sample.

Every task conditions an unconditional pretrained prior on a label y. What a method may use is
the task's offline labelled set (N examples); what it is judged against is the "truth", the
prior's own samples accepted with the true p(y | x) (rejection sampling of p_pre(x) p(y | x),
the law CTRL's KL-regularised objective targets at alpha = 1).

* `toy2d`: the 8-Gaussian ring; y in {0, 1} with p(y = 1 | x) = sigmoid(4 x_1), known exactly.
  The offline set is N ring points with y drawn from that law.
* `digits_class`: 8x8 digits; y = the digit. The true p(y | x) is the oracle's (an independent
  classifier trained on the whole training split); the offline set is N training images with
  their labels.
* `digits_class_ink`: y = (digit, ink), ink = 1 when an image's mean grey level is above the
  training split's median (exact, no classifier). The offline set has digit labels on
  `num_digit` images and ink labels on `num_ink` others' overlap: `num_both` images carry both,
  and only those are a joint-label method's (CFG's) data. Label index = 2 * digit + ink.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
from scipy import special

from jaxlab.data import digits
from jaxlab.data import toy2d

TASKS = ("toy2d", "digits_class", "digits_class_ink")
TOY2D_SLOPE = 4.0
NUM_DIGITS = 10

# (x [B, ...], y [B]) -> log p(y | x) [B], NumPy.
LogProb = Callable[[np.ndarray, np.ndarray], np.ndarray]


def check_task(name: str) -> str:
  if name not in TASKS:
    raise ValueError(f"unknown ctrl task {name!r}; choose one of {', '.join(TASKS)}")
  return name


def num_labels(task: str) -> int:
  return {"toy2d": 2, "digits_class": NUM_DIGITS, "digits_class_ink": 2 * NUM_DIGITS}[
      check_task(task)]


# ---------------------------------------------------------------------------------------------
# toy2d


def toy2d_log_prob(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """The exact log p(y | x) of toy2d: p(y = 1 | x) = sigmoid(4 x_1)."""
  logit = TOY2D_SLOPE * np.asarray(x, np.float64)[:, 0]
  return np.where(np.asarray(y) == 1, -np.logaddexp(0.0, -logit), -np.logaddexp(0.0, logit))


def toy2d_offline(num: int, *, seed: int, ring_options: dict) -> tuple[np.ndarray, np.ndarray]:
  """N ring points (a draw independent of the prior's training points) and labels from the
  exact law."""
  x = toy2d.gaussian_ring(num, seed=10_000 + seed, **ring_options)
  rng = np.random.default_rng(seed)
  p_one = special.expit(TOY2D_SLOPE * x[:, 0].astype(np.float64))
  return x, (rng.random(num) < p_one).astype(np.int32)


# ---------------------------------------------------------------------------------------------
# Digits


def ink(images: np.ndarray) -> np.ndarray:
  """Mean grey level of each image ([-1, 1] scale)."""
  images = np.asarray(images, np.float64)
  return images.reshape(images.shape[0], -1).mean(-1)


@dataclasses.dataclass(frozen=True)
class InkRule:
  """ink label = mean grey level above the training split's median."""
  threshold: float

  def labels(self, images: np.ndarray) -> np.ndarray:
    return (ink(images) > self.threshold).astype(np.int32)


def ink_rule(train_images: np.ndarray) -> InkRule:
  return InkRule(float(np.median(ink(train_images))))


def joint_label(digit: np.ndarray, ink_label: np.ndarray) -> np.ndarray:
  return (2 * np.asarray(digit) + np.asarray(ink_label)).astype(np.int32)


def split_joint_label(label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  label = np.asarray(label)
  return label // 2, label % 2


def subset(num: int, total: int, *, seed: int) -> np.ndarray:
  """`num` distinct indices of `total`, seeded."""
  if not 1 <= num <= total:
    raise ValueError(f"an offline set of {num} examples needs 1 <= N <= {total} (the training "
                     "split's size)")
  return np.random.default_rng(seed).permutation(total)[:num]


@dataclasses.dataclass(frozen=True)
class InkOffline:
  """digits_class_ink's offline data: which images carry which labels."""
  digit_x: np.ndarray      # [num_digit, ...] images with a digit label
  digit_y: np.ndarray
  ink_x: np.ndarray        # [num_ink, ...] images with an ink label
  ink_y: np.ndarray
  joint_x: np.ndarray      # [num_both, ...] images with both (CFG's only data)
  joint_y: np.ndarray      # joint labels 2 * digit + ink


def ink_offline(images: np.ndarray, labels: np.ndarray, rule: InkRule, *, num_digit: int,
                num_ink: int, num_both: int, seed: int) -> InkOffline:
  """Digit labels on `num_digit` images, ink labels on `num_ink`, `num_both` of them shared."""
  if not 0 <= num_both <= min(num_digit, num_ink):
    raise ValueError(f"num_both = {num_both} must be at most min(num_digit, num_ink) = "
                     f"{min(num_digit, num_ink)}")
  order = subset(num_digit + num_ink - num_both, len(images), seed=seed)
  digit_rows = order[:num_digit]
  ink_rows = order[num_digit - num_both:]
  both = order[num_digit - num_both:num_digit]
  ink_labels = rule.labels(images)
  return InkOffline(digit_x=images[digit_rows], digit_y=labels[digit_rows],
                    ink_x=images[ink_rows], ink_y=ink_labels[ink_rows],
                    joint_x=images[both], joint_y=joint_label(labels[both], ink_labels[both]))


# ---------------------------------------------------------------------------------------------
# The truth: prior samples accepted with the true p(y | x).


def rejection_sample(candidates: np.ndarray, log_prob: LogProb, label: int, *,
                     rng: np.random.Generator) -> np.ndarray:
  """The candidates (prior samples) accepted with probability p(label | x): a sample of
  p_pre(x) p(label | x) / Z."""
  values = log_prob(candidates, np.full(len(candidates), label))
  return candidates[np.log(rng.random(len(candidates))) < values]


def digits_split(split: str, size: int, *, num_test: int, split_seed: int,
                 data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  return digits.scaled_arrays(split, size=size, num_test=num_test, seed=split_seed,
                              data_dir=data_dir)
