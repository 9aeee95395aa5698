"""TFDS builders whose examples are drawn by a JAX sampler, in float64, chunk by chunk.

A subclass names its features and its sampler; this base class writes a `train` and a `test` split
(array_record, no TensorFlow) with keys derived from the config's seed, so a dataset is a pure
function of its config and the sampler. Methods that draw fresh samples inside a jitted step call
the same sampler, so both see one distribution.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Mapping

import jax
import numpy as np
import tensorflow_datasets as tfds

_CHUNK = 8192


def float64_tensor(shape: tuple[int, ...]) -> tfds.features.Tensor:
  """A float64 feature stored as raw bytes: the default encoding goes through tf.train.Example's
  float32 FloatList and would silently round every value to single precision."""
  return tfds.features.Tensor(shape=shape, dtype=np.float64,
                              encoding=tfds.features.Encoding.BYTES)


@dataclasses.dataclass
class SampledConfig(tfds.core.BuilderConfig):
  num_train: int = 1024
  num_test: int = 256
  seed: int = 0


class SampledBuilder(tfds.core.GeneratorBasedBuilder, abc.ABC):
  """Train/test splits of `num_train` / `num_test` examples from `sample(key, count)`."""

  @abc.abstractmethod
  def features(self) -> Mapping[str, tfds.features.FeatureConnector]:
    """The example's features (use `float64_tensor` for float64 arrays)."""

  @abc.abstractmethod
  def sample(self, key: jax.Array, count: int) -> Mapping[str, jax.Array]:
    """`count` examples stacked on the leading axis (called with float64 enabled)."""

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, description=type(self).__doc__,
                                 features=tfds.features.FeaturesDict(dict(self.features())))

  def _split_generators(self, dl_manager):
    del dl_manager   # generated, never downloaded
    c = self.builder_config
    return {"train": self._generate_examples(0, c.num_train),
            "test": self._generate_examples(1, c.num_test)}

  def _generate_examples(self, split_index: int, count: int):
    key = jax.random.fold_in(jax.random.key(self.builder_config.seed), split_index)
    for start in range(0, count, _CHUNK):
      size = min(_CHUNK, count - start)
      with jax.enable_x64(True):
        chunk = jax.device_get(dict(self.sample(jax.random.fold_in(key, start), size)))
      for i in range(size):
        yield start + i, {name: np.asarray(value[i]) for name, value in chunk.items()}
