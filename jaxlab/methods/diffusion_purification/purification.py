"""Diffusion-based purification (DiffPure-style) with every noise draw explicit.

purify(x) = reverse DDPM chain from t* applied to x_t* = sqrt(ab_t*) x + sqrt(1 - ab_t*) eps.
All randomness comes from `keys` [t* + 2]: keys[0] draws the forward noise eps, keys[1:] the
reverse steps (`sampling.ddpm_sample`'s keys, one per step t* .. 0). Fresh keys per call give the
stochastic defence; keys fixed once and reused for the attack and the evaluation give the paper's
Deterministic White-Box (DW-box) protocol, under which the defence is a fixed function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab.diffusion import sampling
from jaxlab.diffusion import schedules


def num_keys(t_star: int) -> int:
  return t_star + 2


def purify(denoise: sampling.DenoiseFn, schedule: schedules.Schedule, x: jax.Array,
           t_star: int, keys: jax.Array, *, remat: bool = True, clip_x0: float | None = 1.0,
           parameterization: str = "eps", variance: str = "fixed_small",
           unroll: int | bool = 1) -> jax.Array:
  """x [B, ...] in [-1, 1] -> purified [B, ...]; differentiable in x (and the denoiser).
  `variance`: the reverse steps' noise variance (`schedules.REVERSE_VARIANCES`); `unroll`: the
  reverse scan's unrolling (`sampling.ddpm_sample`: a convolutional denoiser on CPU wants True)."""
  if keys.shape[0] != num_keys(t_star):
    raise ValueError(f"purify needs t* + 2 = {num_keys(t_star)} keys, got {keys.shape[0]}")
  eps = jax.random.normal(keys[0], x.shape, x.dtype)
  t = jnp.full((x.shape[0],), t_star, jnp.int32)
  x_t = schedules.q_sample(schedule, x, t, eps)
  return sampling.ddpm_sample(denoise, schedule, x_t, keys[1:], start_step=t_star,
                              clip_x0=clip_x0, remat=remat, parameterization=parameterization,
                              variance=variance, unroll=unroll)
