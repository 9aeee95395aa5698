"""jetformer: tokens, curriculum, the bits-per-dim loss, sampling and understanding shapes."""
import math
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import train_loop
from jaxlab.data import digits
from jaxlab.methods.jetformer import sampling
from jaxlab.methods.jetformer import tokens
from jaxlab.methods.jetformer import training

CONFIG = pathlib.Path(__file__).resolve().parents[3] / "configs" / "jetformer.py"


def smoke_config(**overrides):
  config = config_lib.load_config(CONFIG, "smoke")
  return config_lib.with_overrides(config, overrides) if overrides else config


def test_patchify_round_trip_and_layout():
  images = jnp.arange(2 * 8 * 8).reshape(2, 8, 8, 1)
  patches = tokens.patchify(images, 2)
  assert patches.shape == (2, 16, 4)
  np.testing.assert_array_equal(patches[0, 0], [0, 1, 8, 9])     # top-left 2x2 patch
  np.testing.assert_array_equal(patches[0, 1], [2, 3, 10, 11])   # its right neighbour
  np.testing.assert_array_equal(tokens.unpatchify(patches, 2, 8, 8, 1), images)
  with pytest.raises(ValueError, match="not divisible"):
    tokens.patchify(images, 3)


def test_levels_dequantisation_and_back():
  levels = jnp.arange(17)
  x = tokens.dequantize(jax.random.key(0), levels, 17)
  assert float(x.min()) >= -1.0 and float(x.max()) < 1.0 + 1 / 8
  np.testing.assert_array_equal(tokens.unit_to_levels(x, 17), levels)


def test_curriculum_endpoints_and_monotone():
  std = tokens.curriculum_std(jnp.linspace(0, 1, 11), 4.0, 0.5)
  np.testing.assert_allclose([std[0], std[-1]], [4.0, 0.5], rtol=1e-6)
  assert np.all(np.diff(np.asarray(std)) <= 0)
  np.testing.assert_allclose(tokens.curriculum_std(jnp.asarray(0.5), 4.0), 2.0, rtol=1e-6)
  levels = jnp.full((1000,), 8)
  np.testing.assert_array_equal(tokens.add_curriculum_noise(jax.random.key(0), levels, 0.0, 17),
                                levels)
  noisy = tokens.add_curriculum_noise(jax.random.key(0), levels, 3.0, 17)
  assert noisy.min() >= 0 and noisy.max() <= 16 and 2.5 < float(jnp.std(noisy)) < 3.5


def test_bits_per_dim_of_a_standard_normal_prior_through_the_loss():
  """Jet at initialisation is the identity, so flow_only's bpd is the N(0, 1) code length of the
  dequantised pixels, plus log2(bin_scale) bits for the bin width."""
  config = smoke_config(model={"use_decoder": False})
  model = training.make_model(config).module(training.make_model(config).init(jax.random.key(0)))
  arrays = training.train_arrays(config, "test")
  batch = {k: jnp.asarray(v[:40]) for k, v in arrays.items()}
  key = jax.random.key(3)
  _, metrics = training.loss_fn(model, batch, key, config=config, noise_std=jnp.zeros([]),
                                train=False)
  x = np.asarray(tokens.dequantize(jax.random.split(key, 5)[1], batch["image"], 17), np.float64)
  nats = (0.5 * x**2 + 0.5 * math.log(2 * math.pi)).reshape(40, -1).sum(1)
  expected = np.mean(nats / (64 * math.log(2)) + math.log2(8))
  np.testing.assert_allclose(float(metrics["bpd"]), expected, rtol=1e-5)


def test_sampling_and_understanding_shapes():
  config = smoke_config()
  functional = training.make_model(config)
  model = functional.module(functional.init(jax.random.key(0)))
  labels = jnp.array([0, 3, 9])
  levels = sampling.sample_levels(model, jax.random.key(1), labels, temperature=0.9,
                                  cfg_weight=3.0, num_candidates=4, num_levels=17, patch=2,
                                  image_shape=digits.IMAGE_SHAPE)
  assert levels.shape == (3, 8, 8, 1) and levels.min() >= 0 and levels.max() <= 16
  predictions = sampling.predict_classes(model, levels, num_levels=17, patch=2)
  assert predictions.shape == (3,) and predictions.max() < 10


def test_train_step_compiles_once(tmp_path):
  config = smoke_config(train={"steps": 4, "eval_every": 4, "ckpt_every": 4, "log_every": 1})
  experiment = training.make_experiment(config)
  traced = chex.assert_max_traces(experiment.update, n=1)
  experiment = train_loop.Experiment(init=experiment.init, update=traced,
                                     train_data=experiment.train_data,
                                     evaluate=experiment.evaluate, eval_data=experiment.eval_data)
  result = train_loop.run(experiment, config, tmp_path)
  assert result.step == 4 and np.isfinite(result.eval_metrics["eval/bpd"])


def test_guided_rejection_sampler_matches_the_closed_form_gaussian():
  """N(m_c, s_c)^(1+w) / N(m_u, s_u)^w is Gaussian when its precision is positive: precision
  (1+w)/s_c^2 - w/s_u^2, mean ((1+w) m_c/s_c^2 - w m_u/s_u^2) / precision."""
  n, w = 40_000, 2.0
  shape = (n,)
  m_c, s_c, m_u, s_u = 0.5, 1.0, -0.5, 1.5
  full = lambda v: jnp.full(shape, v)
  draws = np.asarray(sampling.guided_gaussian_sample(
      jax.random.key(0), full(m_c), full(s_c), full(m_u), full(s_u), w))
  precision = (1 + w) / s_c**2 - w / s_u**2
  mean = ((1 + w) * m_c / s_c**2 - w * m_u / s_u**2) / precision
  assert abs(draws.mean() - mean) < 0.02 and abs(draws.std() - precision**-0.5) < 0.02
  plain = np.asarray(sampling.guided_gaussian_sample(
      jax.random.key(1), full(m_c), full(s_c), full(m_u), full(s_u), 0.0))
  assert abs(plain.mean() - m_c) < 0.02 and abs(plain.std() - s_c) < 0.02
