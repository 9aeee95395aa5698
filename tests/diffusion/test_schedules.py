"""Schedules against hand and closed-form values; conversions between eps / x0 / v round-trip.

Data come from NumPy, so no test compiles jax.random. Exact algebra is checked in float64 (the
schedule cast up under `jax.enable_x64`); float32 is checked to 1e-5 plus the rounding of xt
amplified by the division some conversions make (by sqrt(1 - alpha_bar_0) ~ 0.01 at t = 0, by
sqrt(alpha_bar_{T-1}) at t = T-1): no float32 implementation can do better there.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import schedules

FLOAT32_EPS = float(np.finfo(np.float32).eps)


def normal(shape, seed, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def as_float64(schedule):
  return jax.tree.map(lambda a: a.astype(jnp.float64), schedule)


@pytest.mark.parametrize("make", [
    lambda: schedules.linear_schedule(),
    lambda: schedules.linear_schedule(200, 5e-4, 0.1),
    lambda: schedules.cosine_schedule(),
    lambda: schedules.cosine_schedule(200),
], ids=["linear_1000", "linear_200", "cosine_1000", "cosine_200"])
def test_alphas_cumprod_decreasing_in_unit_interval(make):
  schedule = make()
  alpha_bar = np.asarray(schedule.alphas_cumprod)
  betas = np.asarray(schedule.betas)
  assert schedule.betas.dtype == schedule.alphas_cumprod.dtype == jnp.float32
  assert betas.shape == alpha_bar.shape == (schedule.num_steps,)
  assert np.all(alpha_bar > 0) and np.all(alpha_bar < 1)
  assert np.all(np.diff(alpha_bar) < 0)
  assert np.all(betas > 0) and np.all(betas < 1)


def test_linear_schedule_matches_hand_computation():
  schedule = schedules.linear_schedule(4, beta_start=0.1, beta_end=0.4)
  assert schedule.num_steps == 4
  np.testing.assert_allclose(schedule.betas, [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
  np.testing.assert_allclose(
      schedule.alphas_cumprod, [0.9, 0.9 * 0.8, 0.9 * 0.8 * 0.7, 0.9 * 0.8 * 0.7 * 0.6],
      rtol=1e-6)
  default = schedules.linear_schedule(1000)
  np.testing.assert_allclose(np.asarray(default.betas)[[0, -1]], [1e-4, 2e-2], rtol=1e-6)


@pytest.mark.parametrize("num_steps", [10, 200, 1000])
def test_cosine_schedule_matches_closed_form(num_steps):
  offset = 0.008
  f = lambda u: math.cos((u / num_steps + offset) / (1 + offset) * math.pi / 2) ** 2
  schedule = schedules.cosine_schedule(num_steps, offset=offset, max_beta=0.999)
  # Step t takes alpha_bar to f(t + 1) / f(0); only the last beta (where f(T) = 0) is clipped.
  expected = np.array([f(t + 1) / f(0) for t in range(num_steps - 1)])
  np.testing.assert_allclose(schedule.alphas_cumprod[:-1], expected, rtol=1e-5)
  assert float(schedule.betas[-1]) == pytest.approx(0.999)
  assert float(schedule.alphas_cumprod[-1]) == pytest.approx(0.001 * expected[-1], rel=1e-5)
  assert np.all(np.asarray(schedule.betas[:-1]) < 0.999)


def test_schedule_is_a_pytree_usable_under_jit():
  schedule = schedules.linear_schedule(16)

  @jax.jit
  def last_alpha_bar(schedule):
    return schedule.alphas_cumprod[schedule.num_steps - 1]

  assert float(last_alpha_bar(schedule)) == float(schedule.alphas_cumprod[-1])


def test_invalid_schedules_raise():
  with pytest.raises(ValueError):
    schedules.linear_schedule(0)
  with pytest.raises(ValueError):
    schedules.linear_schedule(10, beta_start=0.3, beta_end=0.1)
  with pytest.raises(ValueError):
    schedules.cosine_schedule(0)


# ---------------------------------------------------------------------------------------------
# Forward process and conversions.

STEPS = np.array([0, 1, 37, 500, 998, 999], np.int32)  # one example per t: [B] = [6]


def data(dtype):
  """x0, eps [6, 3, 2, 2]: one example per entry of STEPS."""
  return normal((6, 3, 2, 2), seed=1, dtype=dtype), normal((6, 3, 2, 2), seed=2, dtype=dtype)


def scales(schedule):
  """sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t) for STEPS, in float64, shaped [6, 1, 1, 1]."""
  alpha_bar = np.asarray(schedule.alphas_cumprod, np.float64)[STEPS].reshape(6, 1, 1, 1)
  return np.sqrt(alpha_bar), np.sqrt(1 - alpha_bar)


def test_q_sample_and_v_match_formulas():
  schedule = schedules.linear_schedule()
  x0, eps = data(jnp.float32)
  signal, sigma = scales(schedule)
  t = jnp.asarray(STEPS)
  np.testing.assert_allclose(schedules.q_sample(schedule, x0, t, eps),
                             signal * np.asarray(x0) + sigma * np.asarray(eps), atol=1e-6)
  np.testing.assert_allclose(schedules.v_from_x0_eps(schedule, t, x0, eps),
                             signal * np.asarray(eps) - sigma * np.asarray(x0), atol=1e-6)


@pytest.mark.parametrize("make", [schedules.linear_schedule, schedules.cosine_schedule],
                         ids=["linear", "cosine"])
def test_conversions_round_trip_float32(make):
  schedule = make(1000)
  x0, eps = data(jnp.float32)
  t = jnp.asarray(STEPS)
  xt = schedules.q_sample(schedule, x0, t, eps)
  v = schedules.v_from_x0_eps(schedule, t, x0, eps)
  signal, sigma = scales(schedule)
  # The rounding of xt (and of the product subtracted from it), divided by the scale divided by.
  rounding = 4 * FLOAT32_EPS * (np.abs(np.asarray(xt)) + 1)
  recovered = {
      "eps_from_x0": (schedules.eps_from_x0(schedule, xt, t, x0), eps, rounding / sigma),
      "x0_from_eps": (schedules.x0_from_eps(schedule, xt, t, eps), x0, rounding / signal),
      "x0_from_v": (schedules.x0_from_v(schedule, xt, t, v), x0, 0.0),
      "eps_from_v": (schedules.eps_from_v(schedule, xt, t, v), eps, 0.0),
  }
  for name, (value, truth, amplified) in recovered.items():
    error = np.abs(np.asarray(value) - np.asarray(truth))
    assert np.all(error <= 1e-5 + amplified), (name, error.max())
    assert value.dtype == jnp.float32


def test_conversions_round_trip_exactly_in_float64():
  with jax.enable_x64(True):
    schedule = as_float64(schedules.cosine_schedule(1000))
    x0, eps = data(jnp.float64)
    t = jnp.asarray(STEPS)
    xt = schedules.q_sample(schedule, x0, t, eps)
    v = schedules.v_from_x0_eps(schedule, t, x0, eps)
    # alpha_bar_{T-1} ~ 2e-9 for this cosine schedule: x0_from_eps divides by ~5e-5.
    np.testing.assert_allclose(schedules.eps_from_x0(schedule, xt, t, x0), eps, atol=1e-10)
    np.testing.assert_allclose(schedules.x0_from_eps(schedule, xt, t, eps), x0, atol=1e-10)
    np.testing.assert_allclose(schedules.x0_from_v(schedule, xt, t, v), x0, atol=1e-12)
    np.testing.assert_allclose(schedules.eps_from_v(schedule, xt, t, v), eps, atol=1e-12)


@pytest.mark.parametrize("parameterization", schedules.PARAMETERIZATIONS)
def test_to_x0_and_eps_inverts_target_for(parameterization):
  with jax.enable_x64(True):
    schedule = as_float64(schedules.linear_schedule(1000))
    x0, eps = data(jnp.float64)
    t = jnp.asarray(STEPS)
    xt = schedules.q_sample(schedule, x0, t, eps)
    target = schedules.target_for(schedule, t, x0, eps, parameterization)
    signal, sigma = scales(schedule)
    expected_target = {"eps": np.asarray(eps), "x0": np.asarray(x0),
                       "v": signal * np.asarray(eps) - sigma * np.asarray(x0)}[parameterization]
    np.testing.assert_allclose(target, expected_target, atol=1e-12)
    x0_hat, eps_hat = schedules.to_x0_and_eps(schedule, xt, t, target, parameterization)
    np.testing.assert_allclose(x0_hat, x0, atol=1e-10)
    np.testing.assert_allclose(eps_hat, eps, atol=1e-10)


def test_unknown_parameterization_raises():
  schedule = schedules.linear_schedule(10)
  x = jnp.zeros((2, 3))
  t = jnp.zeros((2,), jnp.int32)
  with pytest.raises(ValueError, match="parameterization"):
    schedules.to_x0_and_eps(schedule, x, t, x, "score")
  with pytest.raises(ValueError, match="parameterization"):
    schedules.target_for(schedule, t, x, x, "epsilon")


def test_reverse_variances_match_their_formulas():
  schedule = schedules.cosine_schedule(50)
  betas = np.asarray(schedule.betas, np.float64)
  alpha_bar = np.asarray(schedule.alphas_cumprod, np.float64)
  small = np.asarray(schedules.reverse_variance(schedule, "fixed_small"))
  large = np.asarray(schedules.reverse_variance(schedule, "fixed_large"))
  np.testing.assert_allclose(small[1:], betas[1:] * (1 - alpha_bar[:-1]) / (1 - alpha_bar[1:]),
                             rtol=1e-5)
  np.testing.assert_allclose(large[1:], betas[1:], rtol=1e-6)
  assert small[0] == large[0] == 0.0 and np.all(small <= large + 1e-9)
  with pytest.raises(ValueError, match="reverse variance"):
    schedules.reverse_variance(schedule, "learned")
