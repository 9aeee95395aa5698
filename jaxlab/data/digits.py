"""scikit-learn's bundled handwritten digits (8x8, grey levels 0..16, 10 classes) as a TFDS dataset.

The 1,797 images ship inside scikit-learn, so nothing is downloaded. A seeded, class-stratified
split keeps `num_test` images out for evaluation (each class in proportion); the rest train. Images are stored as uint8
[8, 8, 1] with their original 17 grey levels, labels as a 10-way ClassLabel.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import tensorflow_datasets as tfds

from jaxlab.data import pipeline

NUM_LEVELS = 17          # grey levels 0..16
IMAGE_SHAPE = (8, 8, 1)


@dataclasses.dataclass
class DigitsConfig(tfds.core.BuilderConfig):
  num_test: int = 360
  seed: int = 0


def digits_config(*, num_test: int = 360, seed: int = 0) -> DigitsConfig:
  return DigitsConfig(name=f"test{num_test}_seed{seed}", num_test=num_test, seed=seed)


def stratified_split(labels: np.ndarray, num_test: int, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(train indices, test indices): each class contributes to the test split in proportion."""
  rng = np.random.default_rng(seed)
  classes, counts = np.unique(labels, return_counts=True)
  exact = num_test * counts / len(labels)
  shares = np.floor(exact).astype(int)
  # Largest remainders get the leftover places, so the split holds exactly num_test images.
  shares[np.argsort(shares - exact)[:num_test - shares.sum()]] += 1
  test = []
  for label, share in zip(classes, shares):
    test.extend(rng.permutation(np.flatnonzero(labels == label))[:share].tolist())
  test = np.sort(np.asarray(test))
  train = np.setdiff1d(np.arange(len(labels)), test)
  return train, test


class Digits(tfds.core.GeneratorBasedBuilder):
  """sklearn.datasets.load_digits: 8x8 grey-level (0..16) images of the digits 0-9."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [digits_config()]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=type(self).__doc__,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Tensor(shape=IMAGE_SHAPE, dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=10)}))

  def _split_generators(self, dl_manager):
    del dl_manager   # bundled with scikit-learn, never downloaded
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    images = digits.images.astype(np.uint8)[..., None]
    labels = digits.target.astype(np.int64)
    train, test = stratified_split(labels, self.builder_config.num_test,
                                   self.builder_config.seed)
    return {"train": self._generate_examples(images, labels, train),
            "test": self._generate_examples(images, labels, test)}

  def _generate_examples(self, images, labels, indices):
    for i in indices:
      yield int(i), {"image": images[i], "label": int(labels[i])}


def load(config: DigitsConfig | None = None, data_dir: str | None = None
         ) -> tfds.core.DatasetBuilder:
  """Builds (once, cached under data_dir) and returns the prepared builder for a config."""
  return pipeline.build(Digits, config or digits_config(), data_dir)


def load_arrays(split: str, config: DigitsConfig | None = None, data_dir: str | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, 8, 8, 1], labels int [N]) of a split, in a fixed order."""
  source = pipeline.data_source(load(config, data_dir), split)
  batch = source.__getitems__(list(range(len(source))))
  order = np.lexsort((batch["image"].reshape(len(source), -1).sum(1), batch["label"]))
  return batch["image"][order], batch["label"][order].astype(np.int64)


def scaled_arrays(split: str, *, size: int = 8, num_test: int = 360, seed: int = 0,
                  data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(images float32 [N, size, size, 1] in [-1, 1], labels int32 [N]) of a split.

  Grey levels 0..16 map linearly onto [-1, 1]; size > 8 upsamples bilinearly (no information is
  added: a model then sees as many coordinates as a real image has).
  """
  if size < IMAGE_SHAPE[0]:
    raise ValueError(f"size must be at least the digits' {IMAGE_SHAPE[0]} pixels, got {size}")
  images, labels = load_arrays(split, digits_config(num_test=num_test, seed=seed), data_dir)
  scaled = images.astype(np.float32) / (NUM_LEVELS - 1) * 2 - 1
  if size != scaled.shape[1]:
    scaled = np.asarray(jax.image.resize(scaled, (len(scaled), size, size, IMAGE_SHAPE[-1]),
                                         "bilinear"))
  return scaled, labels.astype(np.int32)
