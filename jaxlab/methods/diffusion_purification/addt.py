"""ADDT: Adversarial Denoising Diffusion Training, as the official `train_ADDT.py` does it.

For a batch of clean images x0 [B, H, W, C] with labels y and timesteps t [B]:

  lambda_t = clip(scale * sqrt(ab_t) / sqrt(1 - ab_t), 0, max)         (scale 0.03, max 0.3)

so the adversarial part of the noise moves x_t by at most `scale * sqrt(ab_t)` in image units
(the clip binds only at small t). Classifier-Guided Perturbation Optimisation (CGPO) finds the
perturbation delta: start from delta ~ N(0, I), guidance g = 0, and repeat `iterations` times

  eps ~ N(0, I);  x_t = sqrt(ab) x0 + sqrt(1 - ab) (sqrt(1 - lambda^2) eps + lambda delta)
  x0_hat = (x_t - sqrt(1 - ab) eps_theta(x_t, t)) / sqrt(ab)    (or the model's own x0 prediction)
  g += d CE(classifier(x0_hat), y) / d delta;   delta <- map(g)

where `map` is RBGM (a permutation of a fresh Gaussian sample in the rank order of g: the noise
stays exactly Gaussian) or, for the ablation, g standardised per (image, channel). The training
step then draws a fresh eps, uses n = sqrt(1 - lambda^2) eps + lambda delta as the noise, and
regresses eps_theta(x_t(n), t) onto n (an x0-prediction model regresses onto x0, the same
objective weighted by 1 / SNR_t). The classifier is frozen; delta carries no gradient into
the diffusion model's update. `plain` fine-tuning is the same step with lambda = 0 (n = eps).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxlab.diffusion import schedules
from jaxlab.methods.diffusion_purification import rbgm

PERTURBATIONS = ("plain", "addt_no_rbgm", "addt")

# (x_t [B, H, W, C], t [B]) -> x0_hat (from eps_hat for an eps-prediction model);
# (x0_hat [B, H, W, C]) -> logits [B, K]
PredictX0 = Callable[[jax.Array, jax.Array], jax.Array]
Classify = Callable[[jax.Array], jax.Array]


def adversarial_weight(schedule: schedules.Schedule, t: jax.Array, *, scale: float,
                       maximum: float) -> jax.Array:
  """lambda_t [B] for timesteps t [B]."""
  alpha_bar = schedule.alphas_cumprod[t]
  return jnp.clip(scale * jnp.sqrt(alpha_bar) / jnp.sqrt(1.0 - alpha_bar), 0.0, maximum)


def mix_noise(eps: jax.Array, delta: jax.Array, weight: jax.Array) -> jax.Array:
  """sqrt(1 - lambda^2) eps + lambda delta, lambda [B] broadcast over the image."""
  weight = weight.reshape((-1,) + (1,) * (eps.ndim - 1)).astype(eps.dtype)
  return jnp.sqrt(1.0 - weight**2) * eps + weight * delta


def standardise(guidance: jax.Array) -> jax.Array:
  """The non-RBGM map: g [B, H, W, C] -> zero mean, unit variance per (image, channel)."""
  mean = jnp.mean(guidance, axis=(1, 2), keepdims=True)
  std = jnp.std(guidance, axis=(1, 2), keepdims=True)
  return (guidance - mean) / jnp.maximum(std, 1e-12)


def guidance_map(perturbation: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  if perturbation == "addt":
    return rbgm.rank_gaussian_map
  if perturbation == "addt_no_rbgm":
    return lambda guidance, key: standardise(guidance)
  raise ValueError(f"{perturbation!r} has no guidance map; choose 'addt' or 'addt_no_rbgm'")


def cgpo(predict_x0: PredictX0, classify: Classify, schedule: schedules.Schedule, x0: jax.Array,
         labels: jax.Array, t: jax.Array, weight: jax.Array, key: jax.Array, *,
         iterations: int, perturbation: str) -> tuple[jax.Array, jax.Array]:
  """(delta, accumulated guidance g), both [B, H, W, C]; one `lax.scan` over the iterations."""
  to_delta = guidance_map(perturbation)
  init_key, loop_key = jax.random.split(key)

  def attack_loss(delta, eps):
    noise = mix_noise(eps, delta, weight)
    x_t = schedules.q_sample(schedule, x0, t, noise)
    logits = classify(predict_x0(x_t, t))
    return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1))

  def iteration(carry, step_key):
    delta, guidance = carry
    eps_key, map_key = jax.random.split(step_key)
    eps = jax.random.normal(eps_key, x0.shape, x0.dtype)
    guidance = guidance + jax.grad(attack_loss)(delta, eps)
    return (to_delta(guidance, map_key), guidance), None

  delta = jax.random.normal(init_key, x0.shape, x0.dtype)
  # Unrolled: a handful of iterations, and XLA:CPU runs a convolutional denoiser's gradient
  # several times slower inside a while loop (see `sampling`).
  (delta, guidance), _ = jax.lax.scan(iteration, (delta, jnp.zeros_like(x0)),
                                      jax.random.split(loop_key, iterations), unroll=True)
  return jax.lax.stop_gradient(delta), jax.lax.stop_gradient(guidance)


def training_noise(predict_x0: PredictX0, classify: Classify, schedule: schedules.Schedule,
                   x0: jax.Array, labels: jax.Array, t: jax.Array, key: jax.Array, *,
                   perturbation: str, scale: float, maximum: float, iterations: int
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The noise n [B, H, W, C] the fine-tuning step diffuses with and regresses onto."""
  if perturbation not in PERTURBATIONS:
    raise ValueError(f"unknown perturbation {perturbation!r}; choose one of {PERTURBATIONS}")
  cgpo_key, eps_key = jax.random.split(key)
  eps = jax.random.normal(eps_key, x0.shape, x0.dtype)
  if perturbation == "plain":
    return eps, {}
  weight = adversarial_weight(schedule, t, scale=scale, maximum=maximum)
  delta, _ = cgpo(predict_x0, classify, schedule, x0, labels, t, weight, cgpo_key,
                  iterations=iterations, perturbation=perturbation)
  return mix_noise(eps, delta, weight), {"mean_lambda": jnp.mean(weight)}
