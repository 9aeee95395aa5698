"""CTRL's evaluation numbers: sample quality, label accuracy and calibration (NumPy, float64).

* `frechet_distance(a, b)`: the Frechet distance of Gaussians fitted to two sample sets
  (|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2))), here on raw pixels or 2-D points.
* `energy_distance(a, b)`: 2 E|X - Y| - E|X - X'| - E|Y - Y'| with the within-set means over
  distinct pairs (unbiased; 0 in expectation when both sets come from one law).
* `macro_f1`, `binomial_se`: accuracy-side numbers for generated samples scored by an oracle.
* `expected_calibration_error`: |accuracy - confidence| averaged over equal-width confidence bins
  (weighted by their counts), the reward classifier's before and after temperature scaling.
* `fit_temperature`: the temperature T > 0 minimising the held-out NLL of softmax(logits / T).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import linalg
from scipy import optimize
from scipy import special


def _as_rows(samples: np.ndarray) -> np.ndarray:
  samples = np.asarray(samples, np.float64)
  return samples.reshape(samples.shape[0], -1)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
  a, b = _as_rows(a), _as_rows(b)
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"sample dimensions differ: {a.shape[1]} vs {b.shape[1]}")
  mean_gap = np.sum(np.square(a.mean(0) - b.mean(0)))
  cov_a = np.atleast_2d(np.cov(a, rowvar=False))
  cov_b = np.atleast_2d(np.cov(b, rowvar=False))
  with warnings.catch_warnings():
    # Pixel data have constant pixels (a digit's corners), so covariances are singular: the
    # square root of their product still exists, and scipy only warns.
    warnings.simplefilter("ignore", linalg.LinAlgWarning)
    root = linalg.sqrtm(cov_a @ cov_b)
  if np.iscomplexobj(root):
    root = root.real   # round-off makes tiny imaginary parts for near-singular covariances
  return float(max(mean_gap + np.trace(cov_a + cov_b - 2.0 * root), 0.0))


def _mean_distance(a: np.ndarray, b: np.ndarray, same: bool) -> float:
  total, count = 0.0, 0
  for start in range(0, len(a), 1024):
    block = a[start:start + 1024]
    distances = np.sqrt(np.maximum(
        np.sum(block**2, 1)[:, None] + np.sum(b**2, 1)[None, :] - 2.0 * block @ b.T, 0.0))
    if same:
      rows = np.arange(start, start + len(block))
      distances[np.arange(len(block)), rows] = 0.0
    total += distances.sum()
    count += distances.size - (len(block) if same else 0)
  return total / count


def energy_distance(a: np.ndarray, b: np.ndarray) -> float:
  a, b = _as_rows(a), _as_rows(b)
  if len(a) < 2 or len(b) < 2:
    raise ValueError("energy distance needs at least 2 samples in each set")
  return float(2.0 * _mean_distance(a, b, False) - _mean_distance(a, a, True)
               - _mean_distance(b, b, True))


def macro_f1(predicted: np.ndarray, target: np.ndarray, num_classes: int) -> float:
  """Mean over classes of 2 TP / (2 TP + FP + FN); a class absent from both counts as 1."""
  predicted, target = np.asarray(predicted), np.asarray(target)
  scores = []
  for c in range(num_classes):
    tp = np.sum((predicted == c) & (target == c))
    fp = np.sum((predicted == c) & (target != c))
    fn = np.sum((predicted != c) & (target == c))
    scores.append(1.0 if tp + fp + fn == 0 else 2.0 * tp / (2.0 * tp + fp + fn))
  return float(np.mean(scores))


def binomial_se(p: float, n: int) -> float:
  return math.sqrt(max(p * (1.0 - p), 0.0) / max(n, 1))


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray,
                               num_bins: int = 15) -> float:
  probabilities = np.asarray(probabilities, np.float64)
  confidence = probabilities.max(-1)
  correct = (probabilities.argmax(-1) == np.asarray(labels)).astype(np.float64)
  edges = np.linspace(0.0, 1.0, num_bins + 1)
  which = np.clip(np.digitize(confidence, edges[1:-1]), 0, num_bins - 1)
  error = 0.0
  for b in range(num_bins):
    members = which == b
    if members.any():
      error += members.mean() * abs(correct[members].mean() - confidence[members].mean())
  return float(error)


def _nll(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
  scaled = logits / temperature
  return float(np.mean(special.logsumexp(scaled, -1)
                       - np.take_along_axis(scaled, labels[:, None], -1)[:, 0]))


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
  """argmin_T NLL(softmax(logits / T)) over T in [0.05, 20] (a 1-D bounded search in log T)."""
  logits = np.asarray(logits, np.float64)
  labels = np.asarray(labels).astype(np.int64)
  found = optimize.minimize_scalar(lambda log_t: _nll(logits, labels, math.exp(log_t)),
                                   bounds=(math.log(0.05), math.log(20.0)), method="bounded",
                                   options={"xatol": 1e-4})
  return float(math.exp(found.x))
