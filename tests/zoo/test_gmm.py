"""Diagonal Gaussian mixtures: exact log-densities, stability far out and for many components,
sampling frequencies and moments, squareplus and the scale floor, and the head at init.

Test data come from NumPy and each check is one `jax.jit`; references are float64 NumPy.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import functional
from jaxlab.zoo import gmm


def random_mixture(rng, batch, k, d):
  logits = rng.normal(size=(batch, k)) * 2
  means = rng.normal(size=(batch, k, d)) * 2
  scales = np.exp(rng.normal(size=(batch, k, d)) * 0.5)
  return logits, means, scales


def brute_force_log_prob(x, logits, means, scales):
  """float64 log of sum_k w_k prod_d N(x_d; mu_kd, s_kd), one component at a time."""
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  density = np.zeros(x.shape[:-1])
  for k in range(logits.shape[-1]):
    z = (x - means[:, k]) / scales[:, k]
    gauss = np.exp(-0.5 * z**2) / (np.sqrt(2 * np.pi) * scales[:, k])
    density += weights[:, k] * np.prod(gauss, axis=-1)
  return np.log(density)


def test_log_prob_matches_brute_force_mixture_sum():
  rng = np.random.default_rng(0)
  logits, means, scales = random_mixture(rng, batch=6, k=5, d=3)
  x = rng.normal(size=(6, 3)) * 2
  with jax.enable_x64(True):
    got = jax.jit(gmm.log_prob)(*(jnp.asarray(a, jnp.float64) for a in (x, logits, means, scales)))
    np.testing.assert_allclose(np.asarray(got), brute_force_log_prob(x, logits, means, scales),
                               rtol=1e-12, atol=1e-12)


def test_log_prob_is_stable_far_away_and_for_many_components():
  rng = np.random.default_rng(1)
  # Two components 1e3 and ~1e3 + 2 scales from x: every density underflows, log_prob must not.
  far_x = np.full((1, 4), 1000.0, np.float32)
  far_logits = np.log(np.array([[0.25, 0.75]], np.float32))
  far_means = np.array([[[0.0] * 4, [2.0] * 4]], np.float32)
  far_scales = np.ones((1, 2, 4), np.float32)
  # K = 1024 components, every one at least 100 scales away from x in every dim.
  k, d = 1024, 8
  many_logits, many_means, many_scales = random_mixture(rng, batch=3, k=k, d=d)
  many_scales = many_scales * 0.05
  many_x = np.full((3, d), 300.0)

  @jax.jit
  def run(far, many):
    value_and_grad = jax.value_and_grad(lambda m: gmm.log_prob(far[0], far[1], m, far[2]).sum())
    return value_and_grad(far[3]), gmm.log_prob(*many)

  (far_value, far_grad), many_value = run(
      (far_x, far_logits, far_scales, far_means),
      tuple(jnp.asarray(a, jnp.float32) for a in (many_x, many_logits, many_means, many_scales)))
  # The far component's share is exp(-0.5 * 4 * (1000^2 - 998^2)) of the near one's: nothing.
  dominant = math.log(0.75) + 4 * (-0.5 * 998.0**2 - 0.5 * math.log(2 * math.pi))
  np.testing.assert_allclose(float(far_value), dominant, rtol=1e-6)
  assert np.all(np.isfinite(far_grad))
  np.testing.assert_allclose(far_grad[0, 1], 998.0, rtol=1e-6)   # d/dmu = (x - mu) / s^2.

  # Reference: float64 logsumexp over the same terms (a plain sum of densities is 0 here).
  log_weights = many_logits - np.log(np.exp(many_logits).sum(-1, keepdims=True))
  z = (many_x[:, None, :] - many_means) / many_scales
  terms = log_weights + np.sum(-0.5 * z**2 - np.log(many_scales) - 0.5 * np.log(2 * np.pi), -1)
  assert np.all(np.exp(terms) == 0), "the test point should underflow a direct sum"
  top = terms.max(-1)
  reference = top + np.log(np.exp(terms - top[:, None]).sum(-1))
  assert np.all(np.isfinite(np.asarray(many_value)))
  np.testing.assert_allclose(np.asarray(many_value), reference, rtol=1e-5)


def test_sampling_follows_the_mixture_weights_and_temperature_scales_the_spread():
  n = 20_000
  two_logits = jnp.log(jnp.array([0.3, 0.7]))
  two_means = jnp.array([[-5.0, -5.0], [5.0, 5.0]])
  two_scales = jnp.full((2, 2), 0.5)
  one_mean = jnp.array([[1.0, -2.0]])
  one_scale = jnp.array([[0.5, 2.0]])
  temperature = 0.6

  @jax.jit
  def run(key):
    key_two, key_one = jax.random.split(key)
    batched = lambda a: jnp.broadcast_to(a, (n,) + a.shape)
    two = gmm.sample(key_two, batched(two_logits), batched(two_means), batched(two_scales))
    one = gmm.sample(key_one, jnp.zeros((n, 1)), batched(one_mean), batched(one_scale),
                     temperature=temperature)
    return two, one

  two, one = (np.asarray(a) for a in run(jax.random.key(0)))
  assert two.shape == (n, 2) and one.shape == (n, 2)
  near_first = np.all(np.abs(two + 5) < 3, axis=-1).mean()
  near_second = np.all(np.abs(two - 5) < 3, axis=-1).mean()
  # Binomial standard error is sqrt(0.21 / 20000) ~ 0.0032.
  assert abs(near_first - 0.3) < 0.015 and abs(near_second - 0.7) < 0.015
  assert near_first + near_second > 0.999
  np.testing.assert_allclose(one.mean(0), [1.0, -2.0], atol=0.05)
  np.testing.assert_allclose(one.std(0), np.array([0.5, 2.0]) * temperature, rtol=0.03)


def test_squareplus_and_the_scale_floor():
  x = np.array([-1e18, -1e8, -50.0, -1.0, 0.0, 0.5, 3.0, 1e4], np.float32)
  k, d = 2, 3
  raw = np.zeros((4, gmm.num_mixture_params(k, d)), np.float32)
  raw[:, k + k * d:] = np.array([-1e7, -10.0, 0.0, 1.0, 100.0, -1e3])   # raw scales
  raw[:, :k] = [1.0, 2.0]
  raw[:, k:k + k * d] = np.arange(k * d)

  @jax.jit
  def run(x, raw):
    return gmm.squareplus(x), jax.vmap(jax.grad(gmm.squareplus))(x), gmm.split_mixture_params(
        raw, k, d)

  values, grads, (logits, means, scales) = run(x, raw)
  x64 = x.astype(np.float64)
  exact = np.where(x64 >= 0, (x64 + np.sqrt(x64**2 + 4)) / 2, 2 / (np.sqrt(x64**2 + 4) - x64))
  np.testing.assert_allclose(np.asarray(values), exact, rtol=1e-6)
  assert float(values[4]) == 1.0 and np.all(np.asarray(values) > 0)
  assert np.all(np.isfinite(np.asarray(grads)))
  np.testing.assert_allclose(np.asarray(grads)[2:-1], (1 + x64 / np.sqrt(x64**2 + 4))[2:-1] / 2,
                             rtol=1e-5)

  np.testing.assert_array_equal(logits, np.broadcast_to([1.0, 2.0], (4, 2)))
  np.testing.assert_array_equal(means[0], np.arange(6.0).reshape(2, 3))
  # squareplus(-1e7) = 1e-7 and squareplus(-1e3) = 1e-3: only the first is floored.
  expected = [gmm.MIN_SCALE, 2 / (math.sqrt(104) + 10), 1.0, (1 + math.sqrt(5)) / 2,
              (100 + math.sqrt(10004)) / 2, 2 / (math.sqrt(1e6 + 4) + 1e3)]
  np.testing.assert_allclose(scales[0].reshape(-1), expected, rtol=1e-6)
  assert float(scales.min()) == np.float32(gmm.MIN_SCALE)
  with pytest.raises(ValueError, match="needs 14 raw parameters, got 13"):
    gmm.split_mixture_params(jnp.zeros((13,)), k, d)


def test_mixture_head_starts_uniform_with_standard_normal_components():
  k, d = 4, 3
  head = functional.Functional(lambda rngs: gmm.MixtureHead(5, k, d, rngs=rngs))
  params = head.init(jax.random.key(0))
  assert params["proj"]["kernel"].shape == (5, k + 2 * k * d)
  h = np.random.default_rng(0).normal(size=(2, 7, 5)).astype(np.float32)
  x = np.random.default_rng(1).normal(size=(2, 7, d)).astype(np.float32)

  @jax.jit
  def run(params, h, x):
    logits, means, scales = head.apply(params, h)
    return logits, means, scales, gmm.log_prob(x, logits, means, scales)

  logits, means, scales, lp = run(params, h, x)
  assert logits.shape == (2, 7, k) and means.shape == scales.shape == (2, 7, k, d)
  np.testing.assert_array_equal(logits, 0.0)
  np.testing.assert_array_equal(means, 0.0)
  np.testing.assert_array_equal(scales, 1.0)
  # Identical standard-normal components: the mixture is N(0, I).
  np.testing.assert_allclose(lp, np.sum(-0.5 * x**2 - 0.5 * np.log(2 * np.pi), -1), rtol=1e-5)
