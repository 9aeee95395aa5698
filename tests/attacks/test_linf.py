"""jaxlab.attacks.linf: PGD (bitwise as it was in diffusion_purification), random start, FGSM and
the soft-ball (UDR) attack."""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.attacks import linf

# Written by the old `jaxlab.methods.diffusion_purification.attacks` (before the move, jax
# 0.10.2, CPU), all float32:
#   x = jax.random.uniform(jax.random.key(0), (4, 6), minval=-1.0, maxval=1.0)
#   w = jax.random.normal(jax.random.key(2), (6, 3))
#   y = jax.random.normal(jax.random.key(3), (4, 3))
#   keys = stochastic_keys(jax.random.key(1), 7, 2)   (key_data = jax.random.key_data(keys))
#   loss(x, key) = jnp.sum(jnp.tanh(x @ (w + 0.1 * jax.random.normal(key, (6, 3)))) * y)
#   x_adv = pgd_linf(loss, x, keys, epsilon=0.1, step_size=0.03)
#   iterates = pgd_linf_iterates(loss, x, keys, epsilon=0.1, step_size=0.03, record_at=(3, 7))
# The old module clipped to [-1, 1] with no random start; several coordinates of x_adv sit on
# those bounds, so the clip is exercised.
REFERENCE = pathlib.Path(__file__).parent / "data" / "pgd_reference.npz"
UNIT_RANGE = (-1.0, 1.0)


def _reference():
  data = np.load(REFERENCE)
  w, y = jnp.asarray(data["w"]), jnp.asarray(data["y"])

  def loss(x_in, key):
    return jnp.sum(jnp.tanh(x_in @ (w + 0.1 * jax.random.normal(key, (6, 3)))) * y)
  return data, loss


def _cross_entropy_loss(seed: int, batch: int = 4, features: int = 8):
  """A linear classifier's summed cross-entropy, loss(x [batch, features]) -> scalar."""
  rng = np.random.default_rng(seed)
  weights = jnp.asarray(rng.normal(size=(features, 3)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 3, size=batch))

  def loss(x_in):
    return -jnp.sum(jax.nn.log_softmax(x_in @ weights)[jnp.arange(batch), labels])
  return loss


def _inputs(seed: int, shape=(4, 8)):
  # Uniform over the whole valid range: some coordinates lie within eps of a bound.
  return jax.random.uniform(jax.random.key(seed), shape, minval=-1.0, maxval=1.0)


def test_pgd_reproduces_the_old_diffusion_purification_attack_bitwise():
  data, loss = _reference()
  x = jnp.asarray(data["x"])
  keys = linf.stochastic_keys(jax.random.key(1), 7, 2)
  np.testing.assert_array_equal(jax.random.key_data(keys), data["key_data"])
  x_adv = linf.pgd_linf(loss, x, keys, epsilon=0.1, step_size=0.03, bounds=UNIT_RANGE)
  iterates = linf.pgd_linf_iterates(loss, x, keys, epsilon=0.1, step_size=0.03,
                                    bounds=UNIT_RANGE, record_at=(3, 7))
  np.testing.assert_array_equal(x_adv, data["x_adv"])
  np.testing.assert_array_equal(iterates, data["iterates"])
  step = jax.jit(lambda x_adv, x_clean, k: linf.pgd_step(loss, x_adv, x_clean, k, epsilon=0.1,
                                                         step_size=0.03, bounds=UNIT_RANGE))
  host = linf.pgd_linf_host_loop(step, x, keys, record_at=(7, 3))
  np.testing.assert_allclose(host, data["iterates"][::-1], rtol=0, atol=1e-6)


def test_random_start_stays_within_eps_and_bounds_and_moves():
  x, epsilon, bounds = _inputs(0), 0.3, (-0.9, 0.9)
  x = jnp.clip(x, *bounds)
  start = linf.random_start_point(jax.random.key(1), x, epsilon, bounds)
  assert start.shape == x.shape and start.dtype == x.dtype
  assert float(jnp.max(jnp.abs(start - x))) <= epsilon + 1e-6
  assert float(jnp.min(start)) >= bounds[0] and float(jnp.max(start)) <= bounds[1]
  # Only a coordinate already on a bound, pushed outwards, can stay put.
  assert bool(jnp.all((start != x) | (jnp.abs(x) == bounds[1])))
  assert bool(jnp.any(start == bounds[1])), "no coordinate was clipped: the test lost its point"


@pytest.mark.parametrize("random_start", [False, True])
def test_pgd_stays_within_the_eps_ball_and_bounds(random_start):
  keyless = _cross_entropy_loss(0)
  loss = lambda x_in, key: keyless(x_in)
  x, epsilon, bounds = jnp.clip(_inputs(2), 0.0, 1.0), 0.2, (0.0, 1.0)
  keys = linf.fixed_keys(jax.random.key(3), 6)
  start = jax.random.key(4) if random_start else None
  # A step larger than eps: every step has to be projected back.
  x_adv = linf.pgd_linf(loss, x, keys, epsilon=epsilon, step_size=0.5, bounds=bounds,
                        random_start=start)
  assert float(jnp.max(jnp.abs(x_adv - x))) <= epsilon + 1e-6
  assert float(jnp.min(x_adv)) >= 0.0 and float(jnp.max(x_adv)) <= 1.0
  assert float(keyless(x_adv)) > float(keyless(x))


def test_fgsm_on_a_linear_loss_is_a_signed_step():
  x = jnp.array([[0.95, -0.5, 0.0, -0.97], [0.2, 0.99, -0.99, 0.5]])
  w = jnp.array([[1.0, -2.0, 0.0, -0.5], [3.0, 1.0, 1.0, -4.0]])
  loss = lambda x_in, key: jnp.sum(x_in * w)
  x_adv = linf.fgsm(loss, x, jax.random.key(0), epsilon=0.1, bounds=UNIT_RANGE)
  expected = np.clip(np.asarray(x) + 0.1 * np.sign(np.asarray(w)), -1.0, 1.0)
  np.testing.assert_allclose(x_adv, expected, rtol=0, atol=1e-7)


def test_soft_ball_at_lam_one_is_pgd_with_the_same_random_start():
  keyless = _cross_entropy_loss(1)
  x, key = _inputs(5), jax.random.key(6)
  settings = dict(epsilon=0.1, step_size=0.03, bounds=UNIT_RANGE)
  pgd = linf.pgd_linf(lambda x_in, _: keyless(x_in), x, linf.fixed_keys(key, 10),
                      random_start=key, **settings)
  soft = linf.soft_ball_linf(keyless, x, key, num_steps=10, lam=1.0, **settings)
  np.testing.assert_allclose(soft, pgd, rtol=0, atol=1e-6)
  assert not np.allclose(soft, x)


def test_soft_ball_one_step_matches_the_formula():
  x = _inputs(7, (2, 5))
  w = jnp.array([[1.0, -2.0, 0.5, -0.5, 3.0], [-1.0, 1.0, 2.0, -4.0, 0.0]])
  key, epsilon, step_size, tau, lam = jax.random.key(8), 0.1, 0.15, 0.2, 0.5
  x_adv = linf.soft_ball_linf(lambda x_in: jnp.sum(x_in * w), x, key, epsilon=epsilon,
                              step_size=step_size, num_steps=1, lam=lam, bounds=UNIT_RANGE,
                              tau=tau)
  x_np = np.asarray(x)
  noise = np.asarray(jax.random.uniform(key, x.shape, x.dtype, -epsilon, epsilon))
  delta = np.clip(x_np + noise, -1.0, 1.0) - x_np
  delta = delta + step_size * np.sign(np.asarray(w))
  outside = np.abs(delta) > epsilon
  assert outside.any() and not outside.all(), "the hand case should pull some coordinates only"
  pulled = delta - lam * (step_size / tau) * (delta - np.sign(delta) * epsilon)
  delta = np.clip(x_np + np.where(outside, pulled, delta), -1.0, 1.0) - x_np
  np.testing.assert_allclose(x_adv, x_np + delta, rtol=0, atol=1e-6)


def test_soft_ball_jits_and_vmaps_over_lam_and_a_weaker_pull_goes_further():
  keyless = _cross_entropy_loss(2)
  x, key, epsilon = _inputs(9), jax.random.key(10), 0.1
  lams = jnp.array([1.0, 0.5, 0.2, 0.0])

  @jax.jit
  def attack(lam):
    return linf.soft_ball_linf(keyless, x, key, epsilon=epsilon, step_size=0.03, num_steps=10,
                               lam=lam, bounds=UNIT_RANGE)
  x_adv = jax.vmap(attack)(lams)
  assert x_adv.shape == (4,) + x.shape
  np.testing.assert_allclose(x_adv[1], attack(lams[1]), rtol=0, atol=1e-6)
  size = jnp.abs(x_adv - x[None])
  mean_size = np.asarray(jnp.mean(size, axis=(1, 2)))
  assert np.all(np.diff(mean_size) > 0), mean_size
  assert float(jnp.max(size[0])) <= epsilon + 1e-6
  assert float(jnp.max(size[2])) > epsilon
  assert float(jnp.min(x_adv)) >= -1.0 and float(jnp.max(x_adv)) <= 1.0


def test_soft_ball_without_random_start_needs_no_key():
  keyless = _cross_entropy_loss(3)
  x = _inputs(11)
  x_adv = linf.soft_ball_linf(keyless, x, None, epsilon=0.1, step_size=0.03, num_steps=3,
                              lam=1.0, bounds=UNIT_RANGE, random_start=False)
  pgd = linf.pgd_linf(lambda x_in, _: keyless(x_in), x, linf.fixed_keys(jax.random.key(0), 3),
                      epsilon=0.1, step_size=0.03, bounds=UNIT_RANGE)
  np.testing.assert_allclose(x_adv, pgd, rtol=0, atol=1e-6)


@pytest.mark.parametrize("record_at", [(), (0,), (8,), (3, 8)])
def test_bad_record_at_raises(record_at):
  _, loss = _reference()
  x, keys = _inputs(0, (4, 6)), linf.stochastic_keys(jax.random.key(1), 7, 2)
  with pytest.raises(ValueError, match="record_at"):
    linf.pgd_linf_iterates(loss, x, keys, epsilon=0.1, step_size=0.03, bounds=UNIT_RANGE,
                           record_at=record_at)
  with pytest.raises(ValueError, match="record_at"):
    linf.pgd_linf_host_loop(lambda x_adv, x_clean, k: x_adv, x, keys, record_at=record_at)
