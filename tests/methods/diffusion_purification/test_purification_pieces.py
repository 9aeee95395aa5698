"""diffusion_purification building blocks: RBGM, deterministic DW-box purification, gradients
through the sampler, PGD."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxlab.attacks import linf as attacks
from jaxlab.diffusion import schedules
from jaxlab.methods.diffusion_purification import evaluation
from jaxlab.methods.diffusion_purification import purification
from jaxlab.methods.diffusion_purification import rbgm


def test_rbgm_is_a_permutation_of_a_gaussian_sample_in_the_guidance_order():
  guidance = jax.random.normal(jax.random.key(0), (3, 4, 5, 2))
  key = jax.random.key(1)
  delta = rbgm.rank_gaussian_map(guidance, key)
  gaussian = np.asarray(rbgm.sorted_gaussian(key, (3, 2, 20)))
  for b in range(3):
    for c in range(2):
      g, d = np.asarray(guidance[b, ..., c]).ravel(), np.asarray(delta[b, ..., c]).ravel()
      np.testing.assert_allclose(np.sort(d), gaussian[b, c], rtol=1e-6)   # same values
      np.testing.assert_array_equal(np.argsort(g), np.argsort(d))         # same order


def test_sorted_gaussian_is_an_increasing_standard_normal_sample():
  draws = np.asarray(rbgm.sorted_gaussian(jax.random.key(0), (64, 1024)))
  assert np.all(np.diff(draws, axis=-1) >= 0)
  assert stats.kstest(draws.ravel(), "norm").pvalue > 0.01
  # The k-th value has the mean of the k-th order statistic (estimated by sorting draws).
  reference = np.sort(np.random.default_rng(0).normal(size=(4000, 16)), axis=-1).mean(0)
  ours = np.asarray(rbgm.sorted_gaussian(jax.random.key(1), (4000, 16))).mean(0)
  np.testing.assert_allclose(ours, reference, atol=0.05)
  assert stats.kstest(np.random.default_rng(1).uniform(size=1000), "norm").pvalue < 0.01


def tiny_denoiser(weight):
  return lambda xt, t: weight * xt


def test_dw_box_purification_is_deterministic_given_its_keys():
  schedule = schedules.cosine_schedule(50)
  x = jax.random.uniform(jax.random.key(0), (4, 3, 3, 1)) * 2 - 1
  keys = jax.random.split(jax.random.key(1), purification.num_keys(10))
  first = purification.purify(tiny_denoiser(0.3), schedule, x, 10, keys)
  second = purification.purify(tiny_denoiser(0.3), schedule, x, 10, keys)
  other = purification.purify(tiny_denoiser(0.3), schedule, x, 10,
                              jax.random.split(jax.random.key(2), purification.num_keys(10)))
  np.testing.assert_array_equal(first, second)
  assert not np.allclose(first, other)


def test_gradient_through_the_purifier_matches_finite_differences():
  with jax.enable_x64(True):
    schedule = schedules.cosine_schedule(30)
    schedule = schedules.Schedule(*(a.astype(jnp.float64) for a in schedule))
    x = jax.random.uniform(jax.random.key(0), (2, 2, 2, 1), jnp.float64) * 1.6 - 0.8
    keys = jax.random.split(jax.random.key(1), purification.num_keys(6))

    def objective(x, weight):
      out = purification.purify(tiny_denoiser(weight), schedule, x, 6, keys, clip_x0=None)
      return jnp.sum(jnp.sin(3 * out))

    grad_x, grad_w = jax.grad(objective, argnums=(0, 1))(x, 0.4)
    eps = 1e-6
    bump = jnp.zeros_like(x).at[1, 0, 1, 0].set(eps)
    fd_x = (objective(x + bump, 0.4) - objective(x - bump, 0.4)) / (2 * eps)
    fd_w = (objective(x, 0.4 + eps) - objective(x, 0.4 - eps)) / (2 * eps)
    np.testing.assert_allclose(grad_x[1, 0, 1, 0], fd_x, rtol=1e-6)
    np.testing.assert_allclose(grad_w, fd_w, rtol=1e-6)


def test_pgd_raises_the_loss_inside_the_ball_and_dw_box_keys_are_fixed():
  weights = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)), jnp.float32)
  labels = jnp.array([0, 1, 2, 0])
  x = jax.random.uniform(jax.random.key(0), (4, 4, 4, 1)) * 2 - 1

  def loss(x_in, key):
    noisy = x_in + 0.05 * jax.random.normal(key, x_in.shape)
    logits = noisy.reshape(4, -1) @ weights
    return -jnp.sum(jax.nn.log_softmax(logits)[jnp.arange(4), labels])

  keys = attacks.stochastic_keys(jax.random.key(1), 10, 3)
  x_adv = attacks.pgd_linf(loss, x, keys, epsilon=0.1, step_size=0.03,
                           bounds=evaluation.PIXEL_RANGE)
  assert float(jnp.max(jnp.abs(x_adv - x))) <= 0.1 + 1e-6
  assert float(loss(x_adv, jax.random.key(5))) > float(loss(x, jax.random.key(5)))
  fixed = attacks.fixed_keys(jax.random.key(2), 10)
  assert fixed.shape == (10, 1)
  assert all(np.array_equal(jax.random.key_data(fixed[i, 0]),
                            jax.random.key_data(fixed[0, 0])) for i in range(10))


def test_pgd_iterates_are_the_shorter_attacks():
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(16, 3)), jnp.float32)
  labels = jnp.array([0, 1, 2, 0])
  x = jax.random.uniform(jax.random.key(3), (4, 4, 4, 1)) * 2 - 1

  def loss(x_in, key):
    logits = (x_in + 0.05 * jax.random.normal(key, x_in.shape)).reshape(4, -1) @ weights
    return -jnp.sum(jax.nn.log_softmax(logits)[jnp.arange(4), labels])

  keys = attacks.stochastic_keys(jax.random.key(4), 10, 2)
  bounds = evaluation.PIXEL_RANGE
  iterates = attacks.pgd_linf_iterates(loss, x, keys, epsilon=0.2, step_size=0.03, bounds=bounds,
                                       record_at=(3, 10))
  assert iterates.shape == (2,) + x.shape
  for row, steps in enumerate((3, 10)):
    shorter = attacks.pgd_linf(loss, x, keys[:steps], epsilon=0.2, step_size=0.03,
                               bounds=bounds)
    np.testing.assert_allclose(iterates[row], shorter, rtol=0, atol=1e-6)
  assert not np.allclose(iterates[0], iterates[1])
  step = jax.jit(lambda x_adv, x_clean, k: attacks.pgd_step(loss, x_adv, x_clean, k, epsilon=0.2,
                                                            step_size=0.03, bounds=bounds))
  host = attacks.pgd_linf_host_loop(step, x, keys, record_at=(10, 3))
  np.testing.assert_allclose(host, iterates[::-1], rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match="record_at"):
    attacks.pgd_linf_iterates(loss, x, keys, epsilon=0.2, step_size=0.03, bounds=bounds,
                              record_at=(11,))
