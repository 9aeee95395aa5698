"""The digits task of the reproduction: 8x8 scikit-learn digits in [0, 1] and seeded label noise.

Clean digits at 500 training images do not robust-overfit (PGD-AT's best-to-last gap was 0.002
over 300 epochs), so the `noisy` setting flips a fraction of the training labels to another
class; the test labels stay clean.
"""
from __future__ import annotations

import numpy as np

from jaxlab.data import digits

NUM_CLASSES = 10
NUM_FEATURES = 64


def digit_arrays(num_test: int, seed: int = 0, data_dir: str | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(x_train [N, 64] float32 in [0, 1], y_train [N] int32, x_test, y_test): a stratified split
  with `num_test` test images (1,797 in all)."""
  config = digits.digits_config(num_test=num_test, seed=seed)
  out = []
  for split in ("train", "test"):
    images, labels = digits.load_arrays(split, config, data_dir)
    scaled = images.reshape(len(images), -1).astype(np.float32) / (digits.NUM_LEVELS - 1)
    out += [scaled, labels.astype(np.int32)]
  return tuple(out)


def flip_labels(labels: np.ndarray, fraction: float, seed: int,
                num_classes: int = NUM_CLASSES) -> np.ndarray:
  """Exactly round(fraction * N) labels, chosen at random, moved to a uniformly drawn *other*
  class."""
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f"label noise fraction must be in [0, 1), got {fraction}")
  rng = np.random.default_rng(seed)
  labels = np.asarray(labels).copy()
  flipped = rng.choice(labels.size, size=int(round(fraction * labels.size)), replace=False)
  shift = rng.integers(1, num_classes, size=flipped.size)
  labels[flipped] = (labels[flipped] + shift) % num_classes
  return labels
