"""Ancestral DDPM and DDIM samplers, and DDIM with per-step KL, each one `jax.lax.scan`.

A denoiser is any function (xt [B, ...], t [B] int32) -> output [B, ...], where the output
predicts eps, x0 or v (see `schedules`). Each step turns the output into an estimate x0_hat
(optionally clipped to [-clip_x0, clip_x0]) and steps to a less noisy x:

* `ddpm_sample` (Ho et al. 2020) visits every t = T-1 .. 0 and draws x_{t-1} from a Gaussian
  with the mean of the posterior q(x_{t-1} | x_t, x0 = x0_hat) and the variance `variance` picks
  (`schedules.reverse_variance`): the posterior's own beta_tilde_t =
  beta_t (1 - alpha_bar_{t-1}) / (1 - alpha_bar_t) ("fixed_small", the default) or beta_t
  ("fixed_large"). The last step returns x0_hat, without noise.
* `ddim_sample` (Song et al. 2021) visits `num_steps` evenly spaced steps (`ddim_timesteps`) and
  moves from t to the next step t' (alpha_bar' = 1 after the last, i.e. x0) as

      x_t' = sqrt(alpha_bar') x0_hat + sqrt(1 - alpha_bar' - sigma^2) eps_hat + sigma z,
      sigma = eta sqrt((1 - alpha_bar') / (1 - alpha_bar)) sqrt(1 - alpha_bar / alpha_bar').

  eta = 0 is the deterministic DDIM; eta = 1 with every step taken is DDPM.

* `ddim_sample_with_kl` (for methods that fine-tune a sampler against a reference, e.g. by RL)
  runs the same DDIM chain under a policy denoiser and returns, next to the sample, the KL of every
  step to the reference denoiser's step from the same x_t: both steps are Gaussians with the same
  sigma, so KL_t = |mu_policy - mu_reference|^2 / (2 sigma_t^2), summed over the dimensions; their
  sum over t is the KL between the two chains' path laws. Every step, the last included, ends with
  noise (sigma > 0): the chain stops at the least noisy level t = 0 (alpha_bar_0 < 1), not by a
  noiseless jump to x0 that the KL could not see.

Every sampler takes an optional `guidance(x_t, t, x0_hat) -> eps correction` added to the
denoiser's eps estimate before the step (x0_hat is recomputed from the corrected eps), the hook
for classifier and reconstruction guidance.

Randomness is explicit: `keys` holds one PRNG key per step, and the noise z of a step is
`jax.random.normal(key, x.shape, x.dtype)`, so a fixed set of keys gives a fixed sample path, as
methods that optimise through the sampler (or compare samplers) need.

Both samplers are plain traceable functions: call them inside `jax.jit` (with `num_steps`,
`parameterization`, `clip_x0`, `remat` and `eta` static) and differentiate them with `jax.grad`
with respect to x_T or whatever the denoiser closes over. Backpropagating through a scan stores
every step's activations; `remat=True` wraps the scan body in `jax.checkpoint`, so only the carry
(x) is stored per step and each step's denoiser activations are recomputed in the backward pass.
`unroll` (static; `jax.lax.scan`'s argument: an int, or True for every step) unrolls the loop:
XLA:CPU runs a convolution's backward pass about 6x slower inside a while loop than in straight-
line code (a UNet's gradient through 11 reverse steps: 13 s rolled, 2.1 s unrolled), so a
convolutional denoiser differentiated on CPU wants `unroll=True`; compilation grows with the
number of unrolled steps, and an MLP denoiser gains nothing.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.diffusion.schedules import Schedule
from jaxlab.diffusion.schedules import check_parameterization
from jaxlab.diffusion.schedules import eps_from_x0
from jaxlab.diffusion.schedules import reverse_variance
from jaxlab.diffusion.schedules import to_x0_and_eps
from jaxlab.diffusion.schedules import x0_from_eps

# (xt [B, ...], t [B] int32) -> model output [B, ...] (eps, x0 or v, per `parameterization`).
DenoiseFn = Callable[[jax.Array, jax.Array], jax.Array]
# (xt [B, ...], t [B] int32, x0_hat [B, ...]) -> a correction [B, ...] added to eps_hat.
GuidanceFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def _clip(x0: jax.Array, clip_x0: float | None) -> jax.Array:
  return x0 if clip_x0 is None else jnp.clip(x0, -clip_x0, clip_x0)


def _estimates(schedule: Schedule, x: jax.Array, t_batch: jax.Array, output: jax.Array,
               parameterization: str, clip_x0: float | None,
               guidance: GuidanceFn | None) -> tuple[jax.Array, jax.Array]:
  """(x0_hat, eps_hat) of one step: the denoiser's, guided, then clipped (eps kept consistent)."""
  x0_hat, eps_hat = to_x0_and_eps(schedule, x, t_batch, output, parameterization)
  if guidance is not None:
    eps_hat = eps_hat + guidance(x, t_batch, x0_hat).astype(x.dtype)
    x0_hat = x0_from_eps(schedule, x, t_batch, eps_hat)
  if clip_x0 is not None:
    x0_hat = _clip(x0_hat, clip_x0)
    eps_hat = eps_from_x0(schedule, x, t_batch, x0_hat)
  return x0_hat, eps_hat


def _run_scan(step, x_T: jax.Array, per_step_inputs, remat: bool,
              unroll: int | bool = 1) -> jax.Array:
  """Folds `step(x, inputs) -> (x_next, None)` over the leading axis of `per_step_inputs`."""
  body = jax.checkpoint(step) if remat else step
  x0, _ = jax.lax.scan(body, x_T, per_step_inputs, unroll=unroll)
  return x0


def _check_keys(keys, num_steps: int):
  if keys.shape[0] != num_steps:
    raise ValueError(f"need one key per step ({num_steps}), got keys of shape {keys.shape}")


def ddpm_sample(denoise: DenoiseFn, schedule: Schedule, x_T: jax.Array, keys: jax.Array, *,
                parameterization: str = "eps", clip_x0: float | None = None,
                remat: bool = False, start_step: int | None = None,
                variance: str = "fixed_small", unroll: int | bool = 1,
                guidance: GuidanceFn | None = None) -> jax.Array:
  """Ancestral sampling over t = start .. 0 (start = T-1 by default); returns x0 [B, ...].

  x_T: [B, ...] the sample at step `start` (pure noise when start = T-1; a diffused input for
  SDEdit-style editing or purification). keys: [start + 1] PRNG keys; the step at t draws its
  noise from keys[t] (keys[0] goes unused: the step at t = 0 returns x0_hat without noise).
  """
  check_parameterization(parameterization)
  start = schedule.num_steps - 1 if start_step is None else int(start_step)
  if not 0 <= start < schedule.num_steps:
    raise ValueError(f"start_step must be in [0, {schedule.num_steps}), got {start_step}")
  num_steps = start + 1
  _check_keys(keys, num_steps)
  batch = x_T.shape[0]

  alpha_bar = schedule.alphas_cumprod[:num_steps]
  alpha_bar_prev = jnp.concatenate([jnp.ones_like(alpha_bar[:1]), alpha_bar[:-1]])
  betas = schedule.betas[:num_steps]
  # Posterior q(x_{t-1} | x_t, x0) = N(x0_coef x0 + xt_coef x_t, std^2), for each t [T]. At t = 0
  # it is the point mass at x0; setting that exactly avoids beta_0 / (1 - alpha_bar_0) != 1 from
  # float32 rounding of alpha_bar_0 close to 1.
  is_first = jnp.arange(num_steps) == 0
  x0_coef = jnp.where(is_first, 1.0, jnp.sqrt(alpha_bar_prev) * betas / (1.0 - alpha_bar))
  xt_coef = jnp.where(is_first, 0.0,
                      jnp.sqrt(1.0 - betas) * (1.0 - alpha_bar_prev) / (1.0 - alpha_bar))
  std = jnp.sqrt(reverse_variance(schedule, variance)[:num_steps])

  def step(x, inputs):
    t, key, x0_c, xt_c, noise_std = inputs
    t_batch = jnp.full((batch,), t, jnp.int32)
    x0_hat, _ = _estimates(schedule, x, t_batch, denoise(x, t_batch), parameterization,
                           clip_x0, guidance)
    noise = jax.random.normal(key, x.shape, x.dtype)
    x_prev = (x0_c.astype(x.dtype) * x0_hat + xt_c.astype(x.dtype) * x
              + noise_std.astype(x.dtype) * noise)
    return x_prev.astype(x.dtype), None

  reverse = lambda a: a[::-1]
  per_step_inputs = (jnp.arange(num_steps - 1, -1, -1, dtype=jnp.int32), reverse(keys),
                     reverse(x0_coef), reverse(xt_coef), reverse(std))
  return _run_scan(step, x_T, per_step_inputs, remat, unroll)


def ddim_timesteps(num_train_steps: int, num_steps: int) -> np.ndarray:
  """The steps DDIM visits: int32 [num_steps], decreasing from num_train_steps - 1, spacing
  num_train_steps / num_steps (rounded), the "trailing" spacing of Lin et al. (2024).

  The last visited step is about num_train_steps / num_steps - 1, from which the sampler jumps
  to x0; num_steps = num_train_steps visits every step.
  """
  if not 1 <= num_steps <= num_train_steps:
    raise ValueError(f"need 1 <= num_steps <= num_train_steps, got {num_steps}, {num_train_steps}")
  stride = num_train_steps / num_steps
  steps = np.round(num_train_steps - stride * np.arange(num_steps)) - 1
  return steps.astype(np.int32)


def ddim_sample(denoise: DenoiseFn, schedule: Schedule, x_T: jax.Array, keys: jax.Array | None,
                *, num_steps: int, eta: float = 0.0, parameterization: str = "eps",
                clip_x0: float | None = None, remat: bool = False,
                unroll: int | bool = 1, guidance: GuidanceFn | None = None) -> jax.Array:
  """DDIM over `ddim_timesteps(T, num_steps)`; returns x0 [B, ...] like x_T.

  x_T: [B, ...] starting noise. keys: [num_steps] PRNG keys, keys[i] for the i-th step taken
  (the one from ddim_timesteps(...)[i]); unused when eta = 0, and then they may be None.
  eta: static Python float, the noise scale (0: deterministic; 1: DDPM-like posterior noise).
  With clip_x0, eps_hat is recomputed from the clipped x0_hat so the step stays consistent.
  """
  check_parameterization(parameterization)
  stochastic = eta != 0
  if stochastic:
    if keys is None:
      raise ValueError("ddim_sample with eta != 0 needs keys")
    _check_keys(keys, num_steps)
  batch = x_T.shape[0]

  timesteps = ddim_timesteps(schedule.num_steps, num_steps)
  alpha_bar = schedule.alphas_cumprod[timesteps]
  alpha_bar_next = jnp.concatenate([alpha_bar[1:], jnp.ones_like(alpha_bar[:1])])
  sigma = (eta * jnp.sqrt((1.0 - alpha_bar_next) / (1.0 - alpha_bar))
           * jnp.sqrt(1.0 - alpha_bar / alpha_bar_next))
  x0_coef = jnp.sqrt(alpha_bar_next)
  eps_coef = jnp.sqrt(jnp.maximum(1.0 - alpha_bar_next - sigma**2, 0.0))

  def step(x, inputs):
    t, key, x0_c, eps_c, noise_std = inputs
    t_batch = jnp.full((batch,), t, jnp.int32)
    x0_hat, eps_hat = _estimates(schedule, x, t_batch, denoise(x, t_batch), parameterization,
                                 clip_x0, guidance)
    x_next = x0_c.astype(x.dtype) * x0_hat + eps_c.astype(x.dtype) * eps_hat
    if stochastic:
      x_next = x_next + noise_std.astype(x.dtype) * jax.random.normal(key, x.shape, x.dtype)
    return x_next.astype(x.dtype), None

  per_step_keys = keys if stochastic else jnp.zeros((num_steps,), jnp.int32)  # placeholders
  per_step_inputs = (jnp.asarray(timesteps), per_step_keys, x0_coef, eps_coef, sigma)
  return _run_scan(step, x_T, per_step_inputs, remat, unroll)


def ddim_sample_with_kl(policy: DenoiseFn, reference: DenoiseFn, schedule: Schedule,
                        x_T: jax.Array, keys: jax.Array, *, num_steps: int, eta: float = 1.0,
                        parameterization: str = "eps", clip_x0: float | None = None,
                        remat: bool = False, unroll: int | bool = 1,
                        grad_mask: jax.Array | None = None,
                        guidance: GuidanceFn | None = None,
                        shared_time: bool = False) -> tuple[jax.Array, jax.Array]:
  """DDIM under `policy` with each step's KL to `reference`'s; returns (x0 [B, ...], kl [K, B]).

  The chain visits t_1 > ... > t_K = `ddim_timesteps(T, num_steps)` and steps from t_i to
  t_{i+1}, the last step to t = 0 (alpha_bar_0 < 1), every step with the DDIM noise sigma of
  `eta` (> 0, so that each step's KL is finite). kl[i, b] = sum over dimensions of
  (mu_policy - mu_reference)^2 / (2 sigma_i^2), both means taken at the policy's x_{t_i};
  `guidance` corrects the policy only. keys: [K] PRNG keys, one per step. The KL is
  differentiable in everything the policy influences, x_t included (through both means).

  grad_mask: optional bool [K]; where False, the step's outputs (its x and its KL) are cut from
  the gradient, so that only the steps where it is True are back-propagated through (truncated
  back-propagation). The forward values are unchanged.

  shared_time: the two denoisers get each step's t as a scalar int32 instead of t [B] (every row
  of the chain shares it), so that a network whose time path depends on t alone (the zoo's
  `ResidualMLP`) runs that path once per step rather than once per row; `guidance` still gets
  t [B].
  """
  check_parameterization(parameterization)
  if not eta > 0:
    raise ValueError(f"ddim_sample_with_kl needs eta > 0 (a noiseless step has no KL), got {eta}")
  _check_keys(keys, num_steps)
  timesteps = ddim_timesteps(schedule.num_steps, num_steps)
  if timesteps[-1] == 0:
    raise ValueError(
        f"{num_steps} DDIM steps of T = {schedule.num_steps} visit t = 0 itself; the chain must end "
        "with a noisy step into t = 0: use num_steps <= T // 2")
  if grad_mask is not None and grad_mask.shape != (num_steps,):
    raise ValueError(f"grad_mask must have shape ({num_steps},), got {grad_mask.shape}")
  batch = x_T.shape[0]
  alpha_bar = schedule.alphas_cumprod[timesteps]
  alpha_bar_next = jnp.concatenate([alpha_bar[1:], schedule.alphas_cumprod[:1]])
  sigma = (eta * jnp.sqrt((1.0 - alpha_bar_next) / (1.0 - alpha_bar))
           * jnp.sqrt(1.0 - alpha_bar / alpha_bar_next))
  x0_coef = jnp.sqrt(alpha_bar_next)
  eps_coef = jnp.sqrt(jnp.maximum(1.0 - alpha_bar_next - sigma**2, 0.0))
  mask = jnp.ones((num_steps,), bool) if grad_mask is None else jnp.asarray(grad_mask, bool)
  reduce_axes = tuple(range(1, x_T.ndim))

  def mean_of(denoise, x, t, t_batch, x0_c, eps_c, guide):
    output = denoise(x, t if shared_time else t_batch)
    x0_hat, eps_hat = _estimates(schedule, x, t_batch, output, parameterization, clip_x0, guide)
    return x0_c.astype(x.dtype) * x0_hat + eps_c.astype(x.dtype) * eps_hat

  def step(x, inputs):
    t, key, x0_c, eps_c, noise_std, keep_grad = inputs
    t = jnp.asarray(t, jnp.int32)
    t_batch = jnp.full((batch,), t, jnp.int32)
    mu_policy = mean_of(policy, x, t, t_batch, x0_c, eps_c, guidance)
    # Not stop_gradient: the reference's parameters are constants here, but its mean depends on
    # x_t, which depends on the policy; cutting that dependence biases the KL's gradient.
    mu_reference = mean_of(reference, x, t, t_batch, x0_c, eps_c, None)
    kl = (jnp.sum(jnp.square(mu_policy - mu_reference), axis=reduce_axes)
          / (2.0 * jnp.square(noise_std).astype(x.dtype)))
    x_next = mu_policy + noise_std.astype(x.dtype) * jax.random.normal(key, x.shape, x.dtype)
    cut = lambda a: jnp.where(keep_grad, a, jax.lax.stop_gradient(a))
    return cut(x_next).astype(x.dtype), cut(kl)

  body = jax.checkpoint(step) if remat else step
  per_step_inputs = (jnp.asarray(timesteps), keys, x0_coef, eps_coef, sigma, mask)
  x0, kl = jax.lax.scan(body, x_T, per_step_inputs, unroll=unroll)
  return x0, kl
