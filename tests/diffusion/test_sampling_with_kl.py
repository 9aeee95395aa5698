"""`ddim_sample_with_kl` and the samplers' guidance hook.

The path-KL test takes two linear eps-denoisers on 1-D data, so that each chain is a Gaussian
Markov chain; the KL between the two path laws is then computed by brute force, from the joint
covariance of (x_T, x_1, ..., x_K) built in float64 from the DDIM step coefficients written out
here again, and compared with the sampler's mean summed KL over many chains.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import sampling
from jaxlab.diffusion import schedules

T, STEPS = 10, 3


def linear_eps(coef):
  return lambda x, t: coef * x


def chain_matrices(schedule, coef, eta):
  """(A [K], s [K]): x_{i+1} = A_i x_i + s_i z under eps_hat = coef * x, from the DDIM formula."""
  alpha_bar = np.asarray(schedule.alphas_cumprod, np.float64)
  steps = sampling.ddim_timesteps(T, STEPS)
  levels = np.concatenate([alpha_bar[steps], alpha_bar[:1]])
  a_matrix, s_vector = [], []
  for ab, ab_next in zip(levels[:-1], levels[1:]):
    sigma = eta * np.sqrt((1 - ab_next) / (1 - ab)) * np.sqrt(1 - ab / ab_next)
    x0_per_x = (1 - np.sqrt(1 - ab) * coef) / np.sqrt(ab)
    a_matrix.append(np.sqrt(ab_next) * x0_per_x + np.sqrt(1 - ab_next - sigma**2) * coef)
    s_vector.append(sigma)
  return np.array(a_matrix), np.array(s_vector)


def joint_covariance(a_matrix, s_vector):
  """Covariance of (x_T, x_1, ..., x_K) for x_T ~ N(0, 1): x = L z with L lower triangular."""
  k = len(a_matrix)
  lower = np.zeros((k + 1, k + 1))
  lower[0, 0] = 1.0
  for i in range(k):
    lower[i + 1] = a_matrix[i] * lower[i]
    lower[i + 1, i + 1] = s_vector[i]
  return lower @ lower.T


def gaussian_kl(cov_p, cov_q):
  d = cov_p.shape[0]
  q_inv = np.linalg.inv(cov_q)
  return 0.5 * (np.trace(q_inv @ cov_p) - d + np.linalg.slogdet(cov_q)[1]
                - np.linalg.slogdet(cov_p)[1])


def test_summed_step_kl_is_the_brute_force_path_kl_of_a_three_step_chain():
  schedule = schedules.linear_schedule(T, beta_start=1e-3, beta_end=0.3)
  policy_coef, reference_coef, eta = 0.9, 0.6, 1.0
  num = 200_000
  x_T = jax.random.normal(jax.random.key(0), (num, 1))
  keys = jax.random.split(jax.random.key(1), STEPS)
  _, kl = jax.jit(lambda x, k: sampling.ddim_sample_with_kl(
      linear_eps(policy_coef), linear_eps(reference_coef), schedule, x, k, num_steps=STEPS,
      eta=eta))(x_T, keys)
  assert kl.shape == (STEPS, num)
  exact = gaussian_kl(joint_covariance(*chain_matrices(schedule, policy_coef, eta)),
                      joint_covariance(*chain_matrices(schedule, reference_coef, eta)))
  estimate = float(jnp.mean(jnp.sum(kl, axis=0)))
  assert exact > 0.05
  np.testing.assert_allclose(estimate, exact, rtol=0.02)


def test_the_chain_is_the_policy_one_and_the_kl_is_zero_against_itself():
  schedule = schedules.linear_schedule(T, beta_start=1e-3, beta_end=0.3)
  x_T = jax.random.normal(jax.random.key(0), (4096, 1))
  keys = jax.random.split(jax.random.key(1), STEPS)
  x0, kl = sampling.ddim_sample_with_kl(linear_eps(0.7), linear_eps(0.7), schedule, x_T, keys,
                                        num_steps=STEPS)
  assert float(jnp.max(jnp.abs(kl))) == 0.0
  a_matrix, s_vector = chain_matrices(schedule, 0.7, 1.0)
  expected_var = joint_covariance(a_matrix, s_vector)[-1, -1]
  np.testing.assert_allclose(float(jnp.var(x0)), expected_var, rtol=0.06)
  assert s_vector[-1] > 0     # the last step is noisy: no unpenalised jump to x0


def test_the_kl_gradient_matches_finite_differences():
  """Through x_t too: the reference's mean depends on the policy's earlier steps."""
  schedule = schedules.linear_schedule(T, beta_start=1e-3, beta_end=0.3)
  x_T = jax.random.normal(jax.random.key(0), (512, 1))
  keys = jax.random.split(jax.random.key(1), STEPS)
  # eps = a_t x + b_t per visited step t: a policy whose early steps move the later x_t.
  def total_kl(params):
    policy = lambda x, t: params[0][t][:, None] * x + params[1][t][:, None]
    reference = lambda x, t: 0.5 * x
    _, kl = sampling.ddim_sample_with_kl(policy, reference, schedule, x_T, keys,
                                         num_steps=STEPS)
    return jnp.mean(jnp.sum(kl, 0))
  params = (jnp.full(T, 0.6), jnp.full(T, 0.05))
  grad = jax.grad(total_kl)(params)
  first = int(sampling.ddim_timesteps(T, STEPS)[0])
  for which in (0, 1):
    step = 1e-3
    plus = list(params); minus = list(params)
    plus[which] = params[which].at[first].add(step)
    minus[which] = params[which].at[first].add(-step)
    numeric = (total_kl(tuple(plus)) - total_kl(tuple(minus))) / (2 * step)
    np.testing.assert_allclose(float(grad[which][first]), float(numeric), rtol=2e-2, atol=1e-5)


def test_grad_mask_cuts_only_the_gradient():
  schedule = schedules.linear_schedule(T, beta_start=1e-3, beta_end=0.3)
  x_T = jax.random.normal(jax.random.key(0), (64, 1))
  keys = jax.random.split(jax.random.key(1), STEPS)

  def objective(coef, mask):
    x0, kl = sampling.ddim_sample_with_kl(linear_eps(coef), linear_eps(0.5), schedule, x_T, keys,
                                          num_steps=STEPS, grad_mask=mask)
    return jnp.mean(x0**2) + jnp.mean(jnp.sum(kl, 0)), (x0, kl)

  grads, outputs = {}, {}
  for name, mask in (("all", None), ("last", jnp.array([False, False, True])),
                     ("none", jnp.zeros(STEPS, bool))):
    grads[name], outputs[name] = jax.grad(objective, has_aux=True)(0.8, mask)
  for name in ("last", "none"):
    for got, want in zip(outputs[name], outputs["all"]):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert grads["none"] == 0.0
  assert grads["last"] != 0.0 and grads["last"] != grads["all"]


@pytest.mark.parametrize("sampler", ["ddpm", "ddim", "ddim_with_kl"])
def test_guidance_is_an_eps_correction(sampler):
  """A constant correction d equals a denoiser whose eps output is shifted by d."""
  schedule = schedules.linear_schedule(T, beta_start=1e-3, beta_end=0.3)
  x_T = jax.random.normal(jax.random.key(0), (8, 2))
  shift = 0.3
  base, shifted = linear_eps(0.7), (lambda x, t: 0.7 * x + shift)
  guide = lambda x, t, x0_hat: jnp.full_like(x, shift)
  if sampler == "ddpm":
    keys = jax.random.split(jax.random.key(1), T)
    run = lambda d, g: sampling.ddpm_sample(d, schedule, x_T, keys, guidance=g)
  elif sampler == "ddim":
    keys = jax.random.split(jax.random.key(1), STEPS)
    run = lambda d, g: sampling.ddim_sample(d, schedule, x_T, keys, num_steps=STEPS, eta=1.0,
                                            guidance=g)
  else:
    keys = jax.random.split(jax.random.key(1), STEPS)
    run = lambda d, g: sampling.ddim_sample_with_kl(d, base, schedule, x_T, keys,
                                                    num_steps=STEPS, guidance=g)
  np.testing.assert_allclose(np.asarray(jax.tree.leaves(run(base, guide))[0]),
                             np.asarray(jax.tree.leaves(run(shifted, None))[0]), atol=1e-5)


def test_bad_arguments_fail_with_a_reason():
  schedule = schedules.linear_schedule(T)
  x_T = jnp.zeros((2, 1))
  with pytest.raises(ValueError, match="eta > 0"):
    sampling.ddim_sample_with_kl(linear_eps(0.1), linear_eps(0.1), schedule, x_T,
                                 jax.random.split(jax.random.key(0), STEPS), num_steps=STEPS,
                                 eta=0.0)
  with pytest.raises(ValueError, match="visit t = 0"):
    sampling.ddim_sample_with_kl(linear_eps(0.1), linear_eps(0.1), schedule, x_T,
                                 jax.random.split(jax.random.key(0), T), num_steps=T)
  with pytest.raises(ValueError, match="grad_mask"):
    sampling.ddim_sample_with_kl(linear_eps(0.1), linear_eps(0.1), schedule, x_T,
                                 jax.random.split(jax.random.key(0), STEPS), num_steps=STEPS,
                                 grad_mask=jnp.ones(2, bool))
