"""DDPM and DDIM samplers: exact paths against a plain loop, marginals on Gaussian data, noise
handling, gradients (remat or not, against finite differences) and image-shaped inputs.

With data x0 ~ N(MU, SD^2) the optimal denoiser is linear in xt and known in closed form, so a
sampler that uses it must reproduce the data distribution up to its discretisation error. That
error is itself computable: every step is affine in x plus Gaussian noise, so the output is
Gaussian with moments propagated exactly in float64 (`sampler_output_moments`). The marginal tests
check both: the sample moments equal the propagated ones to a few standard errors (this catches
any mistake in a step), and those are within a few percent of (MU, SD).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import sampling
from jaxlab.diffusion import schedules

MU, SD = 1.5, 0.5
NUM_SAMPLES = 20_000


def normal(shape, seed, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def per_example(coef, x):
  """[B] -> [B, 1, ..., 1] to broadcast against x."""
  return coef.reshape(coef.shape + (1,) * (x.ndim - 1))


def posterior_mean_coefficients(alpha_bar):
  """E[x0 | xt] = a xt + b for x0 ~ N(MU, SD^2), xt = sqrt(alpha_bar) x0 + sqrt(1 - alpha_bar) eps.

  alpha_bar: a NumPy or JAX array.
  """
  a = alpha_bar**0.5 * SD**2 / (alpha_bar * SD**2 + 1 - alpha_bar)
  return a, MU - a * alpha_bar**0.5 * MU


def gaussian_denoiser(schedule, parameterization):
  """The exact denoiser for Gaussian data, as an eps, x0 or v predictor (written out here, not
  through the library's conversions)."""
  def denoise(xt, t):
    alpha_bar = per_example(schedule.alphas_cumprod[t], xt)
    a, b = posterior_mean_coefficients(alpha_bar)
    x0 = a * xt + b
    eps = (xt - jnp.sqrt(alpha_bar) * x0) / jnp.sqrt(1 - alpha_bar)
    return {"eps": eps, "x0": x0,
            "v": jnp.sqrt(alpha_bar) * eps - jnp.sqrt(1 - alpha_bar) * x0}[parameterization]
  return denoise


def sampler_output_moments(schedule, sampler, num_steps, eta):
  """(mean, std) of the sampler's output with the exact denoiser, x_T from the true marginal.

  Each step maps x to c x + d + sigma z with x0_hat = a x + b and eps_hat =
  (x - sqrt(alpha_bar) x0_hat) / sqrt(1 - alpha_bar), so N(m, v) goes to N(c m + d, c^2 v + sigma^2).
  """
  alpha_bar_all = np.asarray(schedule.alphas_cumprod, np.float64)
  betas = np.asarray(schedule.betas, np.float64)
  if sampler == "ddpm":
    steps = np.arange(len(alpha_bar_all))[::-1]
  else:
    steps = sampling.ddim_timesteps(len(alpha_bar_all), num_steps)
  mean = np.sqrt(alpha_bar_all[steps[0]]) * MU
  var = alpha_bar_all[steps[0]] * SD**2 + 1 - alpha_bar_all[steps[0]]
  for i, t in enumerate(steps):
    alpha_bar = alpha_bar_all[t]
    a, b = posterior_mean_coefficients(alpha_bar)
    if sampler == "ddpm":
      if t == 0:
        x0_coef, x_coef, sigma = 1.0, 0.0, 0.0
      else:
        alpha_bar_prev = alpha_bar_all[t - 1]
        x0_coef = np.sqrt(alpha_bar_prev) * betas[t] / (1 - alpha_bar)
        x_coef = np.sqrt(1 - betas[t]) * (1 - alpha_bar_prev) / (1 - alpha_bar)
        sigma = np.sqrt(betas[t] * (1 - alpha_bar_prev) / (1 - alpha_bar))
      c, d = x0_coef * a + x_coef, x0_coef * b
    else:
      alpha_bar_next = alpha_bar_all[steps[i + 1]] if i + 1 < len(steps) else 1.0
      sigma = (eta * np.sqrt((1 - alpha_bar_next) / (1 - alpha_bar))
               * np.sqrt(1 - alpha_bar / alpha_bar_next))
      eps_coef = np.sqrt(max(1 - alpha_bar_next - sigma**2, 0.0))
      eps_a = (1 - np.sqrt(alpha_bar) * a) / np.sqrt(1 - alpha_bar)
      eps_b = -np.sqrt(alpha_bar) * b / np.sqrt(1 - alpha_bar)
      c = np.sqrt(alpha_bar_next) * a + eps_coef * eps_a
      d = np.sqrt(alpha_bar_next) * b + eps_coef * eps_b
    mean, var = c * mean + d, c**2 * var + sigma**2
  return mean, np.sqrt(var)


def true_marginal_noise(schedule, shape, seed):
  """x at step T-1 drawn from q(x_{T-1}): also right for schedules that stop short of N(0, 1)."""
  alpha_bar = float(schedule.alphas_cumprod[-1])
  std = np.sqrt(alpha_bar * SD**2 + 1 - alpha_bar)
  return jnp.asarray(np.sqrt(alpha_bar) * MU + std * np.random.default_rng(seed).normal(size=shape),
                     jnp.float32)


SCHEDULES = {
    "linear": lambda: schedules.linear_schedule(200, 5e-4, 0.1),  # the T=1000 betas, scaled up
    "linear_short": lambda: schedules.linear_schedule(200),  # alpha_bar_{T-1} ~ 0.13
    "cosine": lambda: schedules.cosine_schedule(200),
}


# (sampler, eta, schedule, parameterization, bound on |std - SD| / SD for the sampler's exact
# output law). Large steps shrink the std (a step uses the posterior mean of x0, not a posterior
# sample): DDPM over 200 steps by 2-3.5%, DDIM over 50 by ~3% (eta = 0) and ~6% (eta = 1).
MARGINAL_CASES = [
    ("ddpm", None, "linear", "eps", 0.05),
    ("ddpm", None, "linear_short", "x0", 0.03),
    ("ddpm", None, "cosine", "v", 0.03),
    ("ddim", 0.0, "linear_short", "v", 0.04),
    ("ddim", 0.0, "cosine", "eps", 0.045),
    ("ddim", 1.0, "cosine", "x0", 0.08),
    ("ddim", 1.0, "linear_short", "eps", 0.075),
]


@pytest.mark.parametrize("sampler,eta,schedule_name,parameterization,std_tolerance",
                         MARGINAL_CASES, ids=[f"{c[0]}_{c[1]}_{c[2]}_{c[3]}" for c in MARGINAL_CASES])
def test_marginals_on_gaussian_data(sampler, eta, schedule_name, parameterization,
                                    std_tolerance):
  schedule = SCHEDULES[schedule_name]()
  denoise = gaussian_denoiser(schedule, parameterization)
  x_T = true_marginal_noise(schedule, (NUM_SAMPLES, 1), seed=3)
  if sampler == "ddpm":
    keys = jax.random.split(jax.random.key(4), schedule.num_steps)
    samples = jax.jit(lambda x, k: sampling.ddpm_sample(
        denoise, schedule, x, k, parameterization=parameterization))(x_T, keys)
    num_steps = schedule.num_steps
  else:
    num_steps = 50
    keys = jax.random.split(jax.random.key(4), num_steps)
    samples = jax.jit(lambda x, k: sampling.ddim_sample(
        denoise, schedule, x, k, num_steps=num_steps, eta=eta,
        parameterization=parameterization))(x_T, keys)
  samples = np.asarray(samples, np.float64)
  assert samples.shape == (NUM_SAMPLES, 1) and np.all(np.isfinite(samples))
  mean, std = samples.mean(), samples.std()
  expected_mean, expected_std = sampler_output_moments(schedule, sampler, num_steps, eta)
  # The output is Gaussian: standard errors sd / sqrt(N) for the mean, sd / sqrt(2N) for the std.
  assert abs(mean - expected_mean) < 4.5 * expected_std / np.sqrt(NUM_SAMPLES)
  assert abs(std - expected_std) < 4.5 * expected_std / np.sqrt(2 * NUM_SAMPLES)
  assert abs(expected_mean - MU) < 1e-3 * MU
  assert abs(expected_std - SD) < std_tolerance * SD
  assert abs(mean - MU) < 0.01 * MU and abs(std - SD) < (std_tolerance + 0.02) * SD


def toy_denoiser(params):
  """A small nonlinear, t-dependent eps predictor with parameters params = (w, b)."""
  w, b = params
  def denoise(xt, t):
    time = per_example(t.astype(xt.dtype), xt) / 10
    return jnp.tanh(w * xt) * (1 + time) + b
  return denoise


def toy_denoiser_numpy(xt, t, params=(0.9, 0.3)):
  w, b = params
  return np.tanh(w * xt) * (1 + t / 10) + b


def reference_ddpm(schedule, x_T, keys, clip_x0, variance_kind="fixed_small"):
  """The DDPM loop written out in float64 NumPy for the toy eps predictor."""
  alpha_bar_all = np.asarray(schedule.alphas_cumprod, np.float64)
  betas = np.asarray(schedule.betas, np.float64)
  x = np.asarray(x_T, np.float64)
  for t in range(schedule.num_steps - 1, -1, -1):
    alpha_bar = alpha_bar_all[t]
    eps = toy_denoiser_numpy(x, t)
    x0 = np.clip((x - np.sqrt(1 - alpha_bar) * eps) / np.sqrt(alpha_bar), -clip_x0, clip_x0)
    if t == 0:
      return x0
    alpha_bar_prev = alpha_bar_all[t - 1]
    mean = (np.sqrt(alpha_bar_prev) * betas[t] / (1 - alpha_bar) * x0
            + np.sqrt(1 - betas[t]) * (1 - alpha_bar_prev) / (1 - alpha_bar) * x)
    variance = (betas[t] if variance_kind == "fixed_large"
                else betas[t] * (1 - alpha_bar_prev) / (1 - alpha_bar))
    x = mean + np.sqrt(variance) * np.asarray(jax.random.normal(keys[t], x.shape, jnp.float32))


def reference_ddim(schedule, x_T, keys, timesteps, eta, clip_x0):
  """The DDIM loop written out in float64 NumPy for the toy eps predictor."""
  alpha_bar_all = np.asarray(schedule.alphas_cumprod, np.float64)
  x = np.asarray(x_T, np.float64)
  for i, t in enumerate(timesteps):
    alpha_bar = alpha_bar_all[t]
    alpha_bar_next = alpha_bar_all[timesteps[i + 1]] if i + 1 < len(timesteps) else 1.0
    eps = toy_denoiser_numpy(x, t)
    x0 = np.clip((x - np.sqrt(1 - alpha_bar) * eps) / np.sqrt(alpha_bar), -clip_x0, clip_x0)
    eps = (x - np.sqrt(alpha_bar) * x0) / np.sqrt(1 - alpha_bar)
    sigma = (eta * np.sqrt((1 - alpha_bar_next) / (1 - alpha_bar))
             * np.sqrt(1 - alpha_bar / alpha_bar_next))
    noise = np.asarray(jax.random.normal(keys[i], x.shape, jnp.float32))
    x = (np.sqrt(alpha_bar_next) * x0 + np.sqrt(1 - alpha_bar_next - sigma**2) * eps
         + sigma * noise)
  return x


@pytest.mark.parametrize("variance", schedules.REVERSE_VARIANCES)
def test_ddpm_matches_reference_loop(variance):
  schedule = schedules.linear_schedule(8, beta_start=0.05, beta_end=0.5)
  x_T = normal((5, 2), seed=5)
  keys = jax.random.split(jax.random.key(6), 8)
  clip_x0 = 1.2  # binds for some examples
  got = sampling.ddpm_sample(toy_denoiser((0.9, 0.3)), schedule, x_T, keys, clip_x0=clip_x0,
                             variance=variance)
  np.testing.assert_allclose(got, reference_ddpm(schedule, x_T, keys, clip_x0, variance),
                             atol=1e-5)


def test_ddim_matches_reference_loop():
  schedule = schedules.linear_schedule(12, beta_start=0.05, beta_end=0.5)
  timesteps = sampling.ddim_timesteps(12, 4)
  x_T = normal((5, 2), seed=5)
  keys = jax.random.split(jax.random.key(6), 4)
  got = sampling.ddim_sample(toy_denoiser((0.9, 0.3)), schedule, x_T, keys, num_steps=4, eta=0.5,
                             clip_x0=1.2)
  np.testing.assert_allclose(got, reference_ddim(schedule, x_T, keys, timesteps, 0.5, 1.2),
                             atol=1e-5)


def test_ddim_timesteps():
  np.testing.assert_array_equal(sampling.ddim_timesteps(200, 50), np.arange(199, 0, -4))
  np.testing.assert_array_equal(sampling.ddim_timesteps(10, 10), np.arange(9, -1, -1))
  steps = sampling.ddim_timesteps(1000, 30)
  assert steps.dtype == np.int32 and steps.shape == (30,) and steps[0] == 999
  assert np.all(np.abs(np.diff(steps) + 1000 / 30) < 1)  # evenly spaced, decreasing
  for bad in (0, 11):
    with pytest.raises(ValueError):
      sampling.ddim_timesteps(10, bad)


def test_ddim_with_eta_zero_is_deterministic():
  schedule = schedules.linear_schedule(50, 1e-3, 0.08)
  denoise = toy_denoiser((0.9, 0.3))
  x_T = normal((4, 3), seed=7)
  sample = jax.jit(lambda keys, eta: sampling.ddim_sample(denoise, schedule, x_T, keys,
                                                          num_steps=10, eta=eta),
                   static_argnums=1)
  keys_a = jax.random.split(jax.random.key(0), 10)
  keys_b = jax.random.split(jax.random.key(1), 10)
  np.testing.assert_array_equal(sample(keys_a, 0.0), sample(keys_b, 0.0))
  np.testing.assert_array_equal(sample(keys_a, 0.0), sample(None, 0.0))
  assert np.all(np.asarray(sample(keys_a, 1.0)) != np.asarray(sample(keys_b, 1.0)))
  np.testing.assert_array_equal(sample(keys_a, 1.0), sample(keys_a, 1.0))


def test_ddpm_fixed_keys_give_fixed_samples():
  schedule = schedules.linear_schedule(20, 1e-3, 0.2)
  denoise = toy_denoiser((0.9, 0.3))
  x_T = normal((4, 3), seed=7)
  sample = jax.jit(lambda keys: sampling.ddpm_sample(denoise, schedule, x_T, keys))
  keys = jax.random.split(jax.random.key(0), 20)
  np.testing.assert_array_equal(sample(keys), sample(keys))
  other = sample(jax.random.split(jax.random.key(1), 20))
  assert np.all(np.asarray(sample(keys)) != np.asarray(other))
  # keys[0] is unused (no noise at t = 0); every other key matters.
  np.testing.assert_array_equal(sample(keys), sample(keys.at[0].set(jax.random.key(9))))
  assert np.any(np.asarray(sample(keys)) != np.asarray(sample(keys.at[1].set(jax.random.key(9)))))


def test_wrong_number_of_keys_raises():
  schedule = schedules.linear_schedule(10)
  x_T = jnp.zeros((2, 1))
  denoise = toy_denoiser((0.9, 0.3))
  with pytest.raises(ValueError, match="one key per step"):
    sampling.ddpm_sample(denoise, schedule, x_T, jax.random.split(jax.random.key(0), 9))
  with pytest.raises(ValueError, match="one key per step"):
    sampling.ddim_sample(denoise, schedule, x_T, jax.random.split(jax.random.key(0), 9),
                         num_steps=5, eta=1.0)
  with pytest.raises(ValueError, match="parameterization"):
    sampling.ddim_sample(denoise, schedule, x_T, None, num_steps=5, parameterization="score")


# ---------------------------------------------------------------------------------------------
# Gradients.


def sampler_loss(sampler, schedule, num_steps, remat):
  """loss(params, x_T, keys): a scalar of the sample, through the chosen sampler."""
  def loss(params, x_T, keys):
    denoise = toy_denoiser(params)
    if sampler == "ddpm":
      x0 = sampling.ddpm_sample(denoise, schedule, x_T, keys, remat=remat)
    else:
      x0 = sampling.ddim_sample(denoise, schedule, x_T, keys, num_steps=num_steps, eta=1.0,
                                remat=remat)
    return jnp.sum(jnp.sin(x0) * x0)
  return loss


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_remat_gradient_equals_plain_gradient(sampler):
  schedule = schedules.linear_schedule(40, 1e-3, 0.1)
  num_steps = 40 if sampler == "ddpm" else 8
  params = (jnp.float32(0.9), jnp.float32(0.3))
  x_T = normal((4, 4, 4, 3), seed=8)
  keys = jax.random.split(jax.random.key(2), num_steps)
  grads = {}
  for remat in (False, True):
    loss = sampler_loss(sampler, schedule, num_steps, remat)
    grads[remat] = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x_T, keys)
    jaxpr = str(jax.make_jaxpr(jax.grad(loss))(params, x_T, keys))
    assert ("remat" in jaxpr or "checkpoint" in jaxpr) == remat
  for plain, rematted in zip(jax.tree.leaves(grads[False]), jax.tree.leaves(grads[True])):
    assert np.all(np.isfinite(np.asarray(plain)))
    np.testing.assert_allclose(rematted, plain, rtol=1e-5, atol=1e-6)
  assert abs(float(grads[False][0][0])) > 1e-3  # the parameters do move the sample


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_unrolled_sampler_equals_rolled_one(sampler):
  schedule = schedules.linear_schedule(12, 1e-3, 0.2)
  denoise = toy_denoiser((0.9, 0.3))
  x_T = normal((3, 4, 4, 1), seed=9)
  keys = jax.random.split(jax.random.key(4), 12 if sampler == "ddpm" else 4)

  def sample(x, unroll):
    if sampler == "ddpm":
      return sampling.ddpm_sample(denoise, schedule, x, keys, unroll=unroll,
                                  variance="fixed_large")
    return sampling.ddim_sample(denoise, schedule, x, keys, num_steps=4, eta=1.0, unroll=unroll)
  for unroll in (True, 5):
    np.testing.assert_allclose(sample(x_T, unroll), sample(x_T, 1), rtol=1e-5, atol=1e-6)
    rolled = jax.grad(lambda x: jnp.sum(jnp.sin(sample(x, 1))))(x_T)
    unrolled = jax.grad(lambda x: jnp.sum(jnp.sin(sample(x, unroll))))(x_T)
    np.testing.assert_allclose(unrolled, rolled, rtol=1e-5, atol=1e-6)
  num_steps = keys.shape[0]
  assert f"unroll={num_steps}" in str(jax.make_jaxpr(lambda x: sample(x, True))(x_T))
  assert "unroll=1" in str(jax.make_jaxpr(lambda x: sample(x, 1))(x_T))


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_gradient_matches_finite_differences(sampler):
  with jax.enable_x64(True):
    schedule = jax.tree.map(lambda a: a.astype(jnp.float64),
                            schedules.linear_schedule(10, 0.02, 0.4))
    num_steps = 10 if sampler == "ddpm" else 4
    loss = jax.jit(sampler_loss(sampler, schedule, num_steps, remat=True))
    params = (jnp.float64(0.9), jnp.float64(0.3))
    x_T = normal((3, 2), seed=9, dtype=jnp.float64)
    keys = jax.random.split(jax.random.key(3), num_steps)
    grad_params, grad_x = jax.grad(loss, argnums=(0, 1))(params, x_T, keys)
    h = 1e-6
    for i in range(2):
      shift = lambda d: tuple(p + d if j == i else p for j, p in enumerate(params))
      numeric = (loss(shift(h), x_T, keys) - loss(shift(-h), x_T, keys)) / (2 * h)
      np.testing.assert_allclose(grad_params[i], numeric, rtol=1e-6)
    direction = normal((3, 2), seed=10, dtype=jnp.float64)
    numeric = (loss(params, x_T + h * direction, keys)
               - loss(params, x_T - h * direction, keys)) / (2 * h)
    np.testing.assert_allclose(jnp.sum(grad_x * direction), numeric, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Shapes.


@pytest.mark.parametrize("parameterization", schedules.PARAMETERIZATIONS)
def test_image_shaped_samples(parameterization):
  schedule = schedules.linear_schedule(20, 1e-3, 0.2)
  denoise = toy_denoiser((0.9, 0.3))
  x_T = normal((2, 4, 4, 3), seed=11)
  ddpm = sampling.ddpm_sample(denoise, schedule, x_T, jax.random.split(jax.random.key(0), 20),
                              parameterization=parameterization, clip_x0=1.0)
  ddim = jax.jit(sampling.ddim_sample, static_argnums=0,
                 static_argnames=("num_steps", "eta", "parameterization", "clip_x0", "remat"))(
                     denoise, schedule, x_T, jax.random.split(jax.random.key(0), 5),
                     num_steps=5, eta=0.5, parameterization=parameterization, remat=True)
  for sample in (ddpm, ddim):
    assert sample.shape == (2, 4, 4, 3) and sample.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(sample)))
  assert float(jnp.max(jnp.abs(ddpm))) <= 1.0  # the last step returns the clipped x0_hat


def test_ddpm_from_an_intermediate_step_recovers_the_data_distribution():
  """Purification / SDEdit: diffuse data to t*, run the reverse chain from t*; with the exact
  denoiser the output is distributed like the data (within the sampler's discretisation)."""
  schedule = schedules.cosine_schedule(100)
  start = 30
  x0 = MU + SD * normal((NUM_SAMPLES, 1), seed=11)
  t = jnp.full((NUM_SAMPLES,), start, jnp.int32)
  x_start = schedules.q_sample(schedule, x0, t, normal((NUM_SAMPLES, 1), seed=12))
  keys = jax.random.split(jax.random.key(13), start + 1)
  out = np.asarray(sampling.ddpm_sample(gaussian_denoiser(schedule, "eps"), schedule, x_start,
                                        keys, start_step=start))
  assert abs(out.mean() - MU) < 0.02 and abs(out.std() / SD - 1) < 0.05


def test_ddpm_start_step_matches_the_tail_of_a_full_chain():
  """Starting at T-1 is the default; starting at 0 is one x0 estimate; bad steps raise."""
  schedule = schedules.linear_schedule(8, beta_start=0.05, beta_end=0.5)
  x = normal((5, 2), seed=5)
  keys = jax.random.split(jax.random.key(6), 8)
  denoise = toy_denoiser((0.9, 0.3))
  np.testing.assert_allclose(sampling.ddpm_sample(denoise, schedule, x, keys, start_step=7),
                             sampling.ddpm_sample(denoise, schedule, x, keys))
  t0 = jnp.zeros((5,), jnp.int32)
  x0_hat, _ = schedules.to_x0_and_eps(schedule, x, t0, denoise(x, t0), "eps")
  np.testing.assert_allclose(sampling.ddpm_sample(denoise, schedule, x, keys[:1], start_step=0),
                             x0_hat, rtol=1e-6)
  with pytest.raises(ValueError, match="start_step"):
    sampling.ddpm_sample(denoise, schedule, x, keys, start_step=8)
