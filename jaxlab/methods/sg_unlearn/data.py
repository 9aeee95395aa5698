"""Digits splits for unlearning: train / test / validation, forget sets, auditor samples.

scikit-learn's 8x8 digits (bundled, via the TFDS builder `jaxlab.data.digits`): `num_train`
images train the model (few, so that it overfits and membership inference beats chance); the
rest is held out and split 50/50, class-stratified, into a test set (reported accuracy, the
evaluation MIA's non-members) and a validation set (the training auditor's non-members).

`pixel_noise` adds fixed Gaussian noise (std in units of the [0, 1] pixel range, one draw per
image, the same in every run) to every image. Clean digits are too easy for membership inference:
an MLP classifies a typical unseen digit as confidently as a training digit, so their losses
overlap (the loss AUC of forget vs test images is ~0.56 on the original model). With the noise
each image is partly unique, the network memorises its training images' noise, and it behaves
like the over-parameterised image models of the paper (training accuracy 100%, a clear loss gap,
a loss AUC of ~0.7).

A forget set is a boolean mask over the training images: `random` forgets a random `fraction`,
`classwise` every training image of one class. Each seed draws its own forget set (and its own
initialisation), so seeds are independent replicas that train side by side under `vmap`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxlab.data import digits

SETTINGS = ("random", "classwise")
NUM_CLASSES = 10
NUM_IMAGES = 1797


@dataclasses.dataclass(frozen=True)
class DigitsSplits:
  x_train: np.ndarray   # [N_train, 64] float32 in [0, 1]
  y_train: np.ndarray   # [N_train] int32
  x_test: np.ndarray
  y_test: np.ndarray
  x_val: np.ndarray
  y_val: np.ndarray


def _flatten(images: np.ndarray) -> np.ndarray:
  return (images.reshape(len(images), -1) / 16.0).astype(np.float32)


def load_splits(num_train: int, *, seed: int = 0, pixel_noise: float = 0.0,
                data_dir: str | None = None) -> DigitsSplits:
  if not 0 < num_train < NUM_IMAGES - 1:
    raise ValueError(f"num_train must be in (0, {NUM_IMAGES - 1}), got {num_train}")
  if pixel_noise < 0:
    raise ValueError(f"pixel_noise must be >= 0, got {pixel_noise}")
  config = digits.digits_config(num_test=NUM_IMAGES - num_train, seed=seed)
  train_images, train_labels = digits.load_arrays("train", config, data_dir)
  held_images, held_labels = digits.load_arrays("test", config, data_dir)
  val, test = digits.stratified_split(held_labels, len(held_labels) // 2, seed + 1)
  noise = np.random.default_rng(seed + 2)
  noisy = lambda x: (x + pixel_noise * noise.normal(size=x.shape)).astype(np.float32)
  return DigitsSplits(
      x_train=noisy(_flatten(train_images)), y_train=train_labels.astype(np.int32),
      x_test=noisy(_flatten(held_images[test])), y_test=held_labels[test].astype(np.int32),
      x_val=noisy(_flatten(held_images[val])), y_val=held_labels[val].astype(np.int32))


def forget_mask(labels: np.ndarray, setting: str, seed: int, *, fraction: float = 0.1
                ) -> np.ndarray:
  """bool [N]: `random` forgets round(fraction N) images; `classwise` all images of class
  `seed % 10`."""
  rng = np.random.default_rng(seed)
  mask = np.zeros(len(labels), bool)
  if setting == "random":
    mask[rng.choice(len(labels), size=max(1, round(fraction * len(labels))), replace=False)] = True
  elif setting == "classwise":
    mask[labels == seed % NUM_CLASSES] = True
  else:
    raise ValueError(f"unknown setting {setting!r}; choose one of {SETTINGS}")
  return mask


def wrong_labels(labels: np.ndarray, seed: int, num_classes: int = NUM_CLASSES) -> np.ndarray:
  """A uniformly random label different from the true one, per image (the RL baseline)."""
  shift = np.random.default_rng(seed).integers(1, num_classes, size=len(labels))
  return ((labels + shift) % num_classes).astype(np.int32)
