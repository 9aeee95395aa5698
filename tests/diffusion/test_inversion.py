"""diffusion.inversion: edit-friendly DDPM inversion replays to its input exactly."""
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import inversion
from jaxlab.diffusion import schedules
from jaxlab.zoo import unet

SCHEDULE = schedules.cosine_schedule(50)


def denoiser():
  model = unet.UNet(in_channels=3, out_channels=3, base_channels=8, channel_multipliers=(1, 2),
                    groups=4, attention_at_lowest=False, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(3), len(leaves))
  nnx.update(model, jax.tree.unflatten(treedef, [l + 0.05 * jax.random.normal(k, l.shape)
                                                 for l, k in zip(leaves, keys)]))
  return lambda x, t: model(x, t)


def test_replay_reproduces_the_input_from_the_start_and_from_midway():
  denoise = denoiser()
  x0 = jax.random.uniform(jax.random.key(0), (2, 8, 8, 3), minval=-1, maxval=1)
  steps = inversion.evenly_spaced(50, 20)
  xs, maps = inversion.ddpm_invert(denoise, SCHEDULE, x0, jax.random.split(jax.random.key(1),
                                                                         len(steps)), steps)
  assert xs.shape == maps.shape == (len(steps),) + x0.shape
  # From every step with alpha_bar >= 0.01 the replay is exact to float32 rounding.
  usable = int(np.flatnonzero(np.asarray(SCHEDULE.alphas_cumprod)[steps] >= 0.01)[-1])
  for start in (usable, 7, 0):
    out = inversion.replay(denoise, SCHEDULE, xs[start], maps, steps, start_index=start)
    np.testing.assert_allclose(out, x0, atol=1e-5)
  # The cosine schedule's last step keeps alpha_bar ~ 1e-6 of the signal, so x0_hat = x /
  # sqrt(alpha_bar) magnifies the rounding of that first step a thousandfold.
  out = inversion.replay(denoise, SCHEDULE, xs[-1], maps, steps)
  np.testing.assert_allclose(out, x0, atol=2e-3)


def test_x_at_each_step_is_drawn_from_q_of_x_given_x0():
  x0 = jnp.full((1, 8, 8, 3), 0.5)
  steps = np.asarray([5, 30, 49], np.int32)
  xs, _ = inversion.ddpm_invert(lambda x, t: jnp.zeros_like(x), SCHEDULE, x0,
                                jax.random.split(jax.random.key(0), 3), steps)
  for k, t in enumerate(steps):
    abar = float(SCHEDULE.alphas_cumprod[t])
    noise = (xs[k] - np.sqrt(abar) * x0) / np.sqrt(1 - abar)
    assert abs(float(noise.mean())) < 0.3 and 0.6 < float(noise.std()) < 1.4


def test_a_zero_guidance_changes_nothing_and_bad_steps_raise():
  denoise = denoiser()
  x0 = jax.random.uniform(jax.random.key(0), (1, 8, 8, 3), minval=-1, maxval=1)
  steps = inversion.evenly_spaced(50, 10)
  xs, maps = inversion.ddpm_invert(denoise, SCHEDULE, x0,
                                   jax.random.split(jax.random.key(1), 10), steps)
  zero = lambda x, t, k: jnp.zeros_like(x)
  np.testing.assert_allclose(
      inversion.replay(denoise, SCHEDULE, xs[-2], maps, steps, start_index=8, guidance=zero),
      x0, atol=1e-5)
  with pytest.raises(ValueError, match="increase strictly"):
    inversion.check_timesteps(SCHEDULE, [3, 3, 9])
  with pytest.raises(ValueError, match="start_index"):
    inversion.replay(denoise, SCHEDULE, xs[-1], maps, steps, start_index=10)
