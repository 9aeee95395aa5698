"""Scores of a restyled image against the exact ideal, and of a correspondence against classes.

* `psnr(a, b)`: 10 log10(1 / MSE) for images in [0, 1], per image.
* `ssim(a, b)`: the structural similarity (Wang et al. 2004) with a 7x7 Gaussian window
  (sigma 1.5), C1 = 0.01^2, C2 = 0.03^2, averaged over pixels and channels, per image.
* `class_colour_error(out, ideal, classes)`: mean over the classes present in the context of
  the L2 distance between the output's and the ideal's mean RGB on that class's mask, per image.
* `class_agreement(weights, context_classes, reference_classes)`: the share of context positions
  whose match (the argmax of its matching weights) lies on a reference position of the same
  class.
All take numpy or JAX arrays, [N, H, W, 3] images and [N, H, W] int class maps.
"""
from __future__ import annotations

import numpy as np


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  mse = np.mean(np.square(np.asarray(a, np.float64) - np.asarray(b, np.float64)), axis=(1, 2, 3))
  return 10.0 * np.log10(1.0 / np.maximum(mse, 1e-12))


def _gaussian_window(size: int = 7, sigma: float = 1.5) -> np.ndarray:
  x = np.arange(size) - (size - 1) / 2
  g = np.exp(-x ** 2 / (2 * sigma ** 2))
  return g / g.sum()


def _filter(image: np.ndarray, window: np.ndarray) -> np.ndarray:
  """Separable 'valid' filtering of [N, H, W, C] along H and W."""
  size = window.size
  rows = sum(window[i] * image[:, i:image.shape[1] - size + 1 + i] for i in range(size))
  return sum(window[i] * rows[:, :, i:rows.shape[2] - size + 1 + i] for i in range(size))


def ssim(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  window = _gaussian_window()
  c1, c2 = 0.01 ** 2, 0.03 ** 2
  mu_a, mu_b = _filter(a, window), _filter(b, window)
  var_a = _filter(a * a, window) - mu_a ** 2
  var_b = _filter(b * b, window) - mu_b ** 2
  cov = _filter(a * b, window) - mu_a * mu_b
  value = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)
           / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2)))
  return value.mean(axis=(1, 2, 3))


def class_colour_error(out: np.ndarray, ideal: np.ndarray, classes: np.ndarray) -> np.ndarray:
  out, ideal, classes = np.asarray(out, np.float64), np.asarray(ideal, np.float64), np.asarray(
      classes)
  errors = []
  for image, target, labels in zip(out, ideal, classes):
    distances = []
    for label in np.unique(labels):
      mask = labels == label
      distances.append(np.linalg.norm(image[mask].mean(0) - target[mask].mean(0)))
    errors.append(np.mean(distances))
  return np.asarray(errors)


def downsample_classes(classes: np.ndarray, side: int) -> np.ndarray:
  """[N, H, W] class maps at a tap's side x side grid (the class at each cell's centre)."""
  classes = np.asarray(classes)
  height = classes.shape[1]
  index = (np.arange(side) * height) // side + height // (2 * side)
  return classes[:, index][:, :, index]


def class_agreement(weights: np.ndarray, context_classes: np.ndarray,
                    reference_classes: np.ndarray) -> np.ndarray:
  """Per pair, the share of context positions matched into the same class. weights: [N, n, n]
  on a side x side grid (n = side^2); class maps at full resolution."""
  weights = np.asarray(weights)
  side = int(round(np.sqrt(weights.shape[1])))
  ctx = downsample_classes(context_classes, side).reshape(len(weights), -1)
  ref = downsample_classes(reference_classes, side).reshape(len(weights), -1)
  matched = np.take_along_axis(ref, weights.argmax(-1), axis=1)
  return (matched == ctx).mean(axis=1)
