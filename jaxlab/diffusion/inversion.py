"""Edit-friendly DDPM inversion (Huberman-Spiegelglas et al., CVPR 2024) and exact replay.

An ancestral DDPM sampler is a deterministic function of its start x_T and its per-step noise
maps z_t. Inversion picks them so that the sampler returns a given image x0:

1. draw every visited x_t independently from q(x_t | x0) = N(sqrt(abar_t) x0, (1 - abar_t) I)
   (not along one forward chain: the maps then carry more of the image, which is what makes them
   "edit friendly");
2. for each step from x_t to the next visited level x_t' (the last step goes to x0 itself),
   z_t = (x_t' - mu(x_t)) / sigma_t, with mu and sigma the DDPM step of `replay`.

`replay` then runs the same steps with the stored maps: from x at any visited step it returns
x0 (up to float rounding, tested to 1e-5), and with a `guidance` correction of the denoiser's eps
it produces an edit that keeps the maps' structure.

Steps between visited levels are DDPM's generalised to skipped steps (DDIM with eta = 1):

    x_t' = sqrt(abar') x0_hat + sqrt(1 - abar' - sigma^2) eps_hat + sigma z,
    sigma^2 = (1 - abar') / (1 - abar) (1 - abar / abar').

The last step goes to abar' = 1 (x0), where sigma = 0: there the "map" is the residual
x0 - x0_hat itself (its scale is taken as 1), so replay still ends exactly at x0.

Timesteps are a strictly increasing int sequence tau_0 < ... < tau_{K-1} (< T); `xs[k]` is the
sample at tau_k and `noise_maps[k]` the map of the step from tau_k down (to tau_{k-1}, or to x0
for k = 0). A denoiser is `(x [B, ...], t [B] int32) -> eps` (or x0 / v, per
`parameterization`).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.diffusion.schedules import Schedule
from jaxlab.diffusion.schedules import _expand
from jaxlab.diffusion.schedules import to_x0_and_eps
from jaxlab.diffusion.schedules import x0_from_eps

DenoiseFn = Callable[[jax.Array, jax.Array], jax.Array]
# (x_t [B, ...], t [B] int32, step index k) -> a correction [B, ...] added to eps_hat.
GuidanceFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def check_timesteps(schedule: Schedule, timesteps) -> np.ndarray:
  """The visited timesteps as int32 numpy, checked: strictly increasing, within [0, T)."""
  steps = np.asarray(timesteps)
  if steps.ndim != 1 or steps.size < 1 or not np.issubdtype(steps.dtype, np.integer):
    raise ValueError(f"timesteps must be a non-empty 1-D int sequence, got {timesteps!r}")
  if np.any(np.diff(steps) <= 0) or steps[0] < 0 or steps[-1] >= schedule.num_steps:
    raise ValueError(f"timesteps must increase strictly within [0, {schedule.num_steps}), got "
                     f"{steps.tolist()}")
  return steps.astype(np.int32)


def evenly_spaced(num_train_steps: int, num_visited: int) -> np.ndarray:
  """`num_visited` timesteps spread evenly over [0, T), ending at T - 1."""
  if not 1 <= num_visited <= num_train_steps:
    raise ValueError(f"num_visited must be in 1..{num_train_steps}, got {num_visited}")
  return np.unique(np.round(np.linspace(num_train_steps - 1, 0, num_visited)[::-1]).astype(
      np.int32))


def step_coefficients(schedule: Schedule, timesteps: np.ndarray
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per visited step k (from tau_k down): (sqrt(abar'), sqrt(1 - abar' - sigma^2), sigma'),
  each [K]; sigma' is sigma, or 1 at the last step (to x0), whose map is the plain residual."""
  alpha_bar = schedule.alphas_cumprod[jnp.asarray(timesteps)]
  alpha_bar_next = jnp.concatenate([jnp.ones((1,), alpha_bar.dtype), alpha_bar[:-1]])
  variance = ((1.0 - alpha_bar_next) / (1.0 - alpha_bar)
              * (1.0 - alpha_bar / alpha_bar_next))
  variance = jnp.clip(variance, 0.0, 1.0 - alpha_bar_next)
  eps_coef = jnp.sqrt(jnp.maximum(1.0 - alpha_bar_next - variance, 0.0))
  is_last = jnp.arange(len(timesteps)) == 0
  scale = jnp.where(is_last, 1.0, jnp.sqrt(variance))
  return jnp.sqrt(alpha_bar_next), eps_coef, scale


def _mean(schedule: Schedule, denoise: DenoiseFn, x: jax.Array, t: jax.Array,
          signal_coef: jax.Array, eps_coef: jax.Array, parameterization: str,
          correction: jax.Array | None = None) -> jax.Array:
  """The step's mean sqrt(abar') x0_hat + sqrt(1 - abar' - sigma^2) eps_hat."""
  t_batch = jnp.full((x.shape[0],), t, jnp.int32)
  x0_hat, eps_hat = to_x0_and_eps(schedule, x, t_batch, denoise(x, t_batch), parameterization)
  if correction is not None:
    eps_hat = eps_hat + correction.astype(x.dtype)
    x0_hat = x0_from_eps(schedule, x, t_batch, eps_hat)
  return signal_coef.astype(x.dtype) * x0_hat + eps_coef.astype(x.dtype) * eps_hat


def ddpm_invert(denoise: DenoiseFn, schedule: Schedule, x0: jax.Array, keys: jax.Array,
                timesteps, *, parameterization: str = "eps") -> tuple[jax.Array, jax.Array]:
  """(xs [K, B, ...], noise_maps [K, B, ...]) of `x0` [B, ...] over the visited `timesteps`
  (K of them); keys: [K] PRNG keys, one per independent draw of x_tau_k."""
  steps = check_timesteps(schedule, timesteps)
  if keys.shape[0] != steps.size:
    raise ValueError(f"need one key per visited step ({steps.size}), got {keys.shape[0]}")
  noise = jax.vmap(lambda key: jax.random.normal(key, x0.shape, x0.dtype))(keys)
  alpha_bar = schedule.alphas_cumprod[jnp.asarray(steps)]
  xs = (_expand(jnp.sqrt(alpha_bar), noise) * x0[None]
        + _expand(jnp.sqrt(1.0 - alpha_bar), noise) * noise)
  targets = jnp.concatenate([x0[None], xs[:-1]])      # where each step must land
  signal_coef, eps_coef, scale = step_coefficients(schedule, steps)

  def one(x, t, target, s_coef, e_coef, s):
    mean = _mean(schedule, denoise, x, t, s_coef, e_coef, parameterization)
    return (target - mean) / s.astype(x.dtype)

  maps = jax.lax.map(lambda a: one(*a), (xs, jnp.asarray(steps), targets, signal_coef,
                                         eps_coef, scale))
  return xs, maps


def replay(denoise: DenoiseFn, schedule: Schedule, x_start: jax.Array, noise_maps: jax.Array,
           timesteps, *, start_index: int | None = None, parameterization: str = "eps",
           guidance: GuidanceFn | None = None, unroll: int | bool = 1,
           remat: bool = False) -> jax.Array:
  """Runs the visited steps k = start_index .. 0 from `x_start` (the sample at
  tau_{start_index}; default: the last) with the stored maps; returns x0 [B, ...].

  `guidance(x, t, k)` adds a correction to eps_hat at step k (the hook for energy guidance);
  return zeros to leave a step alone. One `lax.scan` (`unroll`, `remat` as in `sampling`).
  """
  steps = check_timesteps(schedule, timesteps)
  start = steps.size - 1 if start_index is None else int(start_index)
  if not 0 <= start < steps.size:
    raise ValueError(f"start_index must be in [0, {steps.size}), got {start_index}")
  if noise_maps.shape[0] != steps.size or noise_maps.shape[1:] != x_start.shape:
    raise ValueError(f"noise_maps must be [{steps.size}, *x.shape], got {noise_maps.shape} for x "
                     f"{x_start.shape}")
  signal_coef, eps_coef, scale = step_coefficients(schedule, steps)

  def step(x, inputs):
    k, t, z, s_coef, e_coef, s = inputs
    correction = None
    if guidance is not None:
      correction = guidance(x, jnp.full((x.shape[0],), t, jnp.int32), k)
    mean = _mean(schedule, denoise, x, t, s_coef, e_coef, parameterization, correction)
    return (mean + s.astype(x.dtype) * z).astype(x.dtype), None

  order = slice(start, None, -1) if start > 0 else slice(0, 1)
  per_step = (jnp.arange(steps.size)[order], jnp.asarray(steps)[order], noise_maps[order],
              signal_coef[order], eps_coef[order], scale[order])
  body = jax.checkpoint(step) if remat else step
  x0, _ = jax.lax.scan(body, x_start, per_step, unroll=unroll)
  return x0
