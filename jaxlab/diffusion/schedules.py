"""Noise schedules, the forward process, and conversions between model parameterizations.

The discrete forward process of DDPM (Ho et al. 2020) has T steps t = 0 .. T-1 (t = 0 the least
noisy) with variances `betas` [T] and alpha_bar_t = prod_{s <= t} (1 - beta_s), so that

    xt = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) eps,   eps ~ N(0, I).

A denoiser sees (xt, t) and predicts one of three equivalent quantities, its parameterization:

* "eps": the noise eps;
* "x0":  the clean signal x0;
* "v":   the velocity v = sqrt(alpha_bar_t) eps - sqrt(1 - alpha_bar_t) x0 (Salimans & Ho 2022).

Given xt, any one of them determines the other two, and the functions below convert between them,
so samplers and losses are written once and work for every parameterization.

Schedules are built in float64 NumPy and stored as float32: the cumulative product of a thousand
factors close to 1 loses several digits when accumulated in float32.

Arrays x0, xt, eps and v share one shape [B, ...] (any trailing axes, e.g. [B, H, W, C]); t is an
int32 vector [B] of per-example steps, whose coefficients are reshaped to broadcast against x.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PARAMETERIZATIONS = ("eps", "x0", "v")
# The variance of an ancestral sampler's step from t to t-1 (Ho et al. 2020, section 3.2; the
# names are guided-diffusion's): "fixed_small", the posterior q(x_{t-1} | x_t, x0)'s
# beta_tilde_t = beta_t (1 - alpha_bar_{t-1}) / (1 - alpha_bar_t), or "fixed_large", beta_t.
REVERSE_VARIANCES = ("fixed_small", "fixed_large")


class Schedule(NamedTuple):
  """A discrete noise schedule. A NamedTuple, so a pytree that can be passed into `jax.jit`.

  betas: [T] float32, the variance added at each step.
  alphas_cumprod: [T] float32, alpha_bar_t = prod_{s <= t} (1 - beta_s); decreasing, in (0, 1).
  """
  betas: jax.Array
  alphas_cumprod: jax.Array

  @property
  def num_steps(self) -> int:
    """T, static (read off the array shape), so usable for Python control flow under jit."""
    return self.betas.shape[0]


def _schedule_from_betas(betas: np.ndarray) -> Schedule:
  """float64 betas [T] -> Schedule in float32, with the cumulative product taken in float64."""
  alphas_cumprod = np.cumprod(1.0 - betas)
  return Schedule(betas=jnp.asarray(betas, jnp.float32),
                  alphas_cumprod=jnp.asarray(alphas_cumprod, jnp.float32))


def _check_num_steps(num_steps: int):
  if num_steps < 1:
    raise ValueError(f"num_steps must be at least 1, got {num_steps}")


def linear_betas(num_steps: int = 1000, beta_start: float = 1e-4,
                 beta_end: float = 2e-2) -> np.ndarray:
  """float64 [T]: DDPM's betas, evenly spaced from `beta_start` to `beta_end` (inclusive).

  The endpoints are DDPM's for T = 1000; with far fewer steps they add too little noise for
  x_T to be N(0, I) (T = 50: alpha_bar_T = 0.60; see `terminal_alpha_bar`).
  """
  _check_num_steps(num_steps)
  if not 0 < beta_start <= beta_end < 1:
    raise ValueError(f"need 0 < beta_start <= beta_end < 1, got {beta_start}, {beta_end}")
  return np.linspace(beta_start, beta_end, num_steps, dtype=np.float64)


def linear_schedule(num_steps: int = 1000, beta_start: float = 1e-4,
                    beta_end: float = 2e-2) -> Schedule:
  """DDPM's schedule (`linear_betas`)."""
  return _schedule_from_betas(linear_betas(num_steps, beta_start, beta_end))


def cosine_betas(num_steps: int = 1000, offset: float = 0.008,
                 max_beta: float = 0.999) -> np.ndarray:
  """float64 [T]: the cosine schedule of Nichol & Dhariwal (2021).

  With f(u) = cos(((u / T + offset) / (1 + offset)) * pi / 2)^2, step t takes alpha_bar from
  f(t) / f(0) to f(t + 1) / f(0), so beta_t = 1 - f(t + 1) / f(t), clipped at `max_beta` (the
  last steps, where f reaches 0). Hence alphas_cumprod[t] = f(t + 1) / f(0) wherever no beta up
  to t was clipped: step t = 0 already adds a little noise.
  """
  _check_num_steps(num_steps)
  steps = np.arange(num_steps + 1, dtype=np.float64)
  f = np.cos((steps / num_steps + offset) / (1 + offset) * (math.pi / 2)) ** 2
  return np.minimum(1.0 - f[1:] / f[:-1], max_beta)


def cosine_schedule(num_steps: int = 1000, offset: float = 0.008,
                    max_beta: float = 0.999) -> Schedule:
  """The cosine schedule (`cosine_betas`)."""
  return _schedule_from_betas(cosine_betas(num_steps, offset, max_beta))


def terminal_alpha_bar(betas: np.ndarray) -> float:
  """alpha_bar_T of `betas`: how much of x_0 the last noisy state keeps. A sampler that starts
  from N(0, I) assumes it is ~0; far above, the chain starts from a law the model never saw."""
  return float(np.prod(1.0 - np.asarray(betas, np.float64)))


# ---------------------------------------------------------------------------------------------
# The forward process and conversions.


def _expand(coef: jax.Array, x: jax.Array) -> jax.Array:
  """A per-example coefficient [B] reshaped to [B, 1, ..., 1] (x's rank) and cast to x's dtype.

  Rank promotion is explicit in this code base: [B] never silently broadcasts against [B, ...].
  """
  coef = jnp.asarray(coef)
  return jnp.reshape(coef, coef.shape + (1,) * (x.ndim - coef.ndim)).astype(x.dtype)


def _scales(schedule: Schedule, t: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t)), each [B, 1, ..., 1] to broadcast against x."""
  alpha_bar = schedule.alphas_cumprod[t]
  return _expand(jnp.sqrt(alpha_bar), x), _expand(jnp.sqrt(1.0 - alpha_bar), x)


def q_sample(schedule: Schedule, x0: jax.Array, t: jax.Array, noise: jax.Array) -> jax.Array:
  """xt = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise. x0, noise [B, ...]; t [B] int32."""
  signal, sigma = _scales(schedule, t, x0)
  return signal * x0 + sigma * noise


def eps_from_x0(schedule: Schedule, xt: jax.Array, t: jax.Array, x0: jax.Array) -> jax.Array:
  """The noise that takes x0 to xt: (xt - sqrt(alpha_bar) x0) / sqrt(1 - alpha_bar)."""
  signal, sigma = _scales(schedule, t, xt)
  return (xt - signal * x0) / sigma


def x0_from_eps(schedule: Schedule, xt: jax.Array, t: jax.Array, eps: jax.Array) -> jax.Array:
  """The clean signal given the noise: (xt - sqrt(1 - alpha_bar) eps) / sqrt(alpha_bar)."""
  signal, sigma = _scales(schedule, t, xt)
  return (xt - sigma * eps) / signal


def v_from_x0_eps(schedule: Schedule, t: jax.Array, x0: jax.Array, eps: jax.Array) -> jax.Array:
  """The velocity v = sqrt(alpha_bar) eps - sqrt(1 - alpha_bar) x0."""
  signal, sigma = _scales(schedule, t, x0)
  return signal * eps - sigma * x0


def x0_from_v(schedule: Schedule, xt: jax.Array, t: jax.Array, v: jax.Array) -> jax.Array:
  """x0 = sqrt(alpha_bar) xt - sqrt(1 - alpha_bar) v (a rotation of (xt, v): well conditioned)."""
  signal, sigma = _scales(schedule, t, xt)
  return signal * xt - sigma * v


def eps_from_v(schedule: Schedule, xt: jax.Array, t: jax.Array, v: jax.Array) -> jax.Array:
  """eps = sqrt(1 - alpha_bar) xt + sqrt(alpha_bar) v."""
  signal, sigma = _scales(schedule, t, xt)
  return sigma * xt + signal * v


def reverse_variance(schedule: Schedule, kind: str = "fixed_small") -> jax.Array:
  """The noise variance [T] of the reverse step from each t to t-1 (`REVERSE_VARIANCES`); 0 at
  t = 0, whose step returns the clean estimate. "fixed_large" (beta_t) is the larger of the two
  (beta_tilde_t <= beta_t), so a sampler using it is more stochastic."""
  if kind not in REVERSE_VARIANCES:
    raise ValueError(f"reverse variance must be one of {REVERSE_VARIANCES}, got {kind!r}")
  alpha_bar = schedule.alphas_cumprod
  alpha_bar_prev = jnp.concatenate([jnp.ones_like(alpha_bar[:1]), alpha_bar[:-1]])
  variance = (schedule.betas if kind == "fixed_large"
              else schedule.betas * (1.0 - alpha_bar_prev) / (1.0 - alpha_bar))
  return jnp.where(jnp.arange(schedule.num_steps) == 0, 0.0, jnp.maximum(variance, 0.0))


def check_parameterization(parameterization: str):
  """Raises ValueError unless `parameterization` is one of PARAMETERIZATIONS."""
  if parameterization not in PARAMETERIZATIONS:
    raise ValueError(
        f"parameterization must be one of {PARAMETERIZATIONS}, got {parameterization!r}")


def to_x0_and_eps(schedule: Schedule, xt: jax.Array, t: jax.Array, output: jax.Array,
                  parameterization: str) -> tuple[jax.Array, jax.Array]:
  """(x0, eps) implied by a denoiser's `output` at (xt, t), each [B, ...] like xt.

  `parameterization` (static) says what the output predicts: "eps", "x0" or "v".
  """
  check_parameterization(parameterization)
  if parameterization == "eps":
    return x0_from_eps(schedule, xt, t, output), output
  if parameterization == "x0":
    return output, eps_from_x0(schedule, xt, t, output)
  return x0_from_v(schedule, xt, t, output), eps_from_v(schedule, xt, t, output)


def target_for(schedule: Schedule, t: jax.Array, x0: jax.Array, eps: jax.Array,
               parameterization: str) -> jax.Array:
  """The regression target [B, ...] of a denoiser with this parameterization, for
  xt = q_sample(schedule, x0, t, eps)."""
  check_parameterization(parameterization)
  if parameterization == "eps":
    return eps
  if parameterization == "x0":
    return x0
  return v_from_x0_eps(schedule, t, x0, eps)
