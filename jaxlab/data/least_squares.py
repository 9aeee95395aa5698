"""The least-squares task family: random problems `b = A x*` and random sequences for primitives.

`sample_problems` / `sample_sequences` define the distributions once, in JAX, so a method can draw
fresh samples inside a jitted step; the TFDS builders below store fixed train/test splits drawn
from the same functions (array_record, no TensorFlow).

Problems: rows a_i ~ N(0, I_d), x* ~ N(0, I_d), x_init ~ N(0, I_d), b = A x* (no noise). With
`condition_number > 1`, A's singular values are mapped affinely onto [1, condition_number].
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import tensorflow_datasets as tfds

from jaxlab.data import pipeline
from jaxlab.data import sampled


def sample_problems(key: jax.Array, count: int, n: int, d: int,
                    condition_number: float = 0.0, dtype=jnp.float64) -> dict[str, jax.Array]:
  """`count` problems: A [count, n, d], b [count, n], x_star [count, d], x_init [count, d]."""
  key_a, key_x, key_init = jax.random.split(key, 3)
  a = jax.random.normal(key_a, (count, n, d), dtype)
  if condition_number and condition_number > 1:
    u, s, vt = jnp.linalg.svd(a, full_matrices=False)
    s_min, s_max = s.min(-1, keepdims=True), s.max(-1, keepdims=True)
    s = 1 + (s - s_min) / (s_max - s_min) * (condition_number - 1)
    a = jnp.einsum("cnk,ck,ckd->cnd", u, s, vt)
  x_star = jax.random.normal(key_x, (count, d), dtype)
  x_init = jax.random.normal(key_init, (count, d), dtype)
  b = jnp.einsum("cnd,cd->cn", a, x_star)
  return {"A": a, "b": b, "x_star": x_star, "x_init": x_init}


def sample_sequences(key: jax.Array, count: int, length: int, width: int,
                     dtype=jnp.float64) -> dict[str, jax.Array]:
  """`count` Gaussian sequences u [count, length, width] (inputs of the primitive tasks)."""
  return {"u": jax.random.normal(key, (count, length, width), dtype)}


@dataclasses.dataclass
class LeastSquaresConfig(sampled.SampledConfig):
  d: int = 5
  n: int = 20
  condition_number: float = 0.0


def least_squares_config(*, d: int, n: int, num_train: int, num_test: int,
                         condition_number: float = 0.0, seed: int = 0) -> LeastSquaresConfig:
  """A builder config whose name encodes every parameter (so each size is cached separately)."""
  kappa = f"_kappa{condition_number:g}" if condition_number > 1 else ""
  return LeastSquaresConfig(
      name=f"d{d}_n{n}{kappa}_train{num_train}_test{num_test}_seed{seed}", d=d, n=n,
      condition_number=condition_number, num_train=num_train, num_test=num_test, seed=seed)


class LeastSquaresProblems(sampled.SampledBuilder):
  """Random least-squares problems b = A x* (float64): A, b, x_star, x_init."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "float64 stored exactly (bytes encoding)."}
  BUILDER_CONFIGS = [least_squares_config(d=5, n=20, num_train=65536, num_test=4096)]

  def features(self):
    c = self.builder_config
    tensor = lambda *shape: sampled.float64_tensor(shape)
    return {"A": tensor(c.n, c.d), "b": tensor(c.n), "x_star": tensor(c.d),
            "x_init": tensor(c.d)}

  def sample(self, key, count):
    c = self.builder_config
    return sample_problems(key, count, c.n, c.d, c.condition_number)


@dataclasses.dataclass
class GaussianSequencesConfig(sampled.SampledConfig):
  length: int = 40
  width: int = 20


def gaussian_sequences_config(*, length: int, width: int, num_train: int, num_test: int,
                              seed: int = 0) -> GaussianSequencesConfig:
  return GaussianSequencesConfig(
      name=f"l{length}_w{width}_train{num_train}_test{num_test}_seed{seed}", length=length,
      width=width, num_train=num_train, num_test=num_test, seed=seed)


class GaussianSequences(sampled.SampledBuilder):
  """Standard-normal sequences u [length, width] (float64), the inputs of primitive tasks."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "float64 stored exactly (bytes encoding)."}
  BUILDER_CONFIGS = [gaussian_sequences_config(length=40, width=20, num_train=65536,
                                               num_test=4096)]

  def features(self):
    c = self.builder_config
    return {"u": sampled.float64_tensor((c.length, c.width))}

  def sample(self, key, count):
    c = self.builder_config
    return sample_sequences(key, count, c.length, c.width)


def load(builder_config: tfds.core.BuilderConfig, data_dir: str | None = None
         ) -> tfds.core.DatasetBuilder:
  """Builds (once, cached under data_dir) and returns the prepared builder for a config."""
  builder_cls = (LeastSquaresProblems if isinstance(builder_config, LeastSquaresConfig)
                 else GaussianSequences)
  return pipeline.build(builder_cls, builder_config, data_dir)


_SPLITS: dict[tuple[str, str, str | None, str], pipeline.InMemorySource] = {}


def in_memory_split(builder_config: tfds.core.BuilderConfig, split: str,
                    data_dir: str | None = None) -> pipeline.InMemorySource:
  """A split held in memory, read once per process: a reproduction's variants share their
  dataset, and re-reading it from disk for each took seconds. The config name encodes every
  parameter, so it identifies the data; the arrays are only ever read."""
  key = (type(builder_config).__name__, builder_config.name, data_dir, split)
  if key not in _SPLITS:
    _SPLITS[key] = pipeline.data_source(load(builder_config, data_dir), split)
  return _SPLITS[key]
