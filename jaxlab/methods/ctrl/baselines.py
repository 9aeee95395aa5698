"""The baselines CTRL is compared with, on the same prior, data and seeds.

* `cfg_finetune`: classifier-free guidance the usual way, by fine-tuning the pretrained denoiser
  (with a zero-initialised label table, so it starts as the prior) on the labelled images with
  label dropout (the null label, the table's last row, replaces a label with probability
  `label_dropout`). `cfg_denoiser` then combines the conditional and null outputs,
  (1 + w) f(x, t, y) - w f(x, t, null). The weights sum to 1 and, at a fixed x_t, eps, x0 and v
  are affine functions of one another, so the combination is the same in every parameterization.
* `reconstruction_guidance`: the gradient of log p(y | x0_hat(x_t)) through the denoiser's own
  x0 estimate, with the reward classifier trained on clean images (no noisy classifier needed).
  By default weighted by sqrt(alpha_bar_t) (`weighting="sqrt_alpha_bar"`): x0_hat =
  (x_t - sqrt(1 - alpha_bar_t) eps_hat) / sqrt(alpha_bar_t) multiplies the denoiser's error by
  1 / sqrt(alpha_bar_t) (about 160 at t = 999 of DDPM's linear schedule), and unweighted the
  samples of a learned prior leave the data; with the weight, x0_hat moves by about
  scale (1 - alpha_bar_t) grad_{x0} log p, a step in x0's own units (as DPS normalises its step).
* `classifier_guidance`: the gradient of log p(y | x_t, t) of a classifier trained on noised
  images (`classifiers.fit_noisy`).

Both guidances are `sampling` guidance hooks: an eps correction -scale sqrt(1 - alpha_bar_t)
grad_x log p, which at scale 1 turns the score of p_t(x) into that of p_t(x) p(y | x).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.diffusion import priors
from jaxlab.diffusion import sampling
from jaxlab.diffusion import schedules
from jaxlab.zoo import unet

PyTree = Any
# (params, x [B, ...], t [B], label [B]) -> denoiser output like x
LabelledApply = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class CfgSettings:
  steps: int = 500
  batch_size: int = 64
  lr: float = 1e-4
  label_dropout: float = 0.1
  grad_clip: float = 1.0

  def __post_init__(self):
    if not 0 <= self.label_dropout < 1:
      raise ValueError(f"cfg label_dropout must be in [0, 1), got {self.label_dropout}")
    if self.steps < 1 or self.batch_size < 1:
      raise ValueError(f"cfg steps and batch_size must be >= 1, got {self.steps}, "
                       f"{self.batch_size}")


def labelled_params(pretrained: PyTree, num_labels: int) -> PyTree:
  """The pretrained params with a zero label table (num_labels rows + the null row)."""
  return unet.add_label_embedding(pretrained, num_labels)


def cfg_finetune(apply: LabelledApply, params: PyTree, schedule: schedules.Schedule,
                 images: np.ndarray, labels: np.ndarray, num_labels: int, settings: CfgSettings,
                 key: jax.Array, *, parameterization: str = "eps", num_seeds: int = 1
                 ) -> PyTree:
  """Fine-tunes `params` (labelled, `labelled_params`) on (images, labels) with label dropout,
  for every seed at once; returns seed-stacked params ([S, ...] leaves)."""
  images = jnp.asarray(images, jnp.float32)
  labels = jnp.asarray(labels, jnp.int32)
  null = num_labels
  opt = optax.chain(optax.clip_by_global_norm(settings.grad_clip), optax.adam(settings.lr))
  batch = settings.batch_size

  def one_seed(seed_key):
    def step(state, step_key):
      rows_key, t_key, noise_key, drop_key = jax.random.split(step_key, 4)
      rows = jax.random.randint(rows_key, (batch,), 0, images.shape[0])
      x0, y = images[rows], labels[rows]
      y = jnp.where(jax.random.uniform(drop_key, (batch,)) < settings.label_dropout, null, y)
      t = jax.random.randint(t_key, (batch,), 0, schedule.num_steps)
      noise = jax.random.normal(noise_key, x0.shape, x0.dtype)
      x_t = schedules.q_sample(schedule, x0, t, noise)
      target = schedules.target_for(schedule, t, x0, noise, parameterization)

      def loss(p):
        return jnp.mean(jnp.square(apply(p, x_t, t, y) - target))
      value, grads = jax.value_and_grad(loss)(state["params"])
      updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
      return {"params": optax.apply_updates(state["params"], updates),
              "opt_state": opt_state}, value

    state = {"params": params, "opt_state": opt.init(params)}
    state, _ = jax.lax.scan(step, state, jax.random.split(seed_key, settings.steps))
    return state["params"]

  return jax.jit(jax.vmap(one_seed))(jax.random.split(key, num_seeds))


def cfg_denoiser(apply: LabelledApply, params: PyTree, labels: jax.Array, num_labels: int,
                 weight: float) -> sampling.DenoiseFn:
  """(x, t) -> (1 + w) f(x, t, y) - w f(x, t, null)."""
  def denoise(x, t):
    conditional = apply(params, x, t, labels)
    if weight == 0:
      return conditional
    unconditional = apply(params, x, t, jnp.full_like(labels, num_labels))
    return (1.0 + weight) * conditional - weight * unconditional
  return denoise


def _eps_correction(schedule: schedules.Schedule, t: jax.Array, grad: jax.Array,
                    scale: float) -> jax.Array:
  sigma = jnp.sqrt(1.0 - schedule.alphas_cumprod[t]).reshape((-1,) + (1,) * (grad.ndim - 1))
  return -scale * sigma.astype(grad.dtype) * grad


RECONSTRUCTION_WEIGHTINGS = ("sqrt_alpha_bar", "none")


def reconstruction_guidance(denoise: sampling.DenoiseFn, schedule: schedules.Schedule,
                            log_reward: Callable[[jax.Array, jax.Array], jax.Array],
                            labels: jax.Array, scale: float, *, parameterization: str = "eps",
                            weighting: str = "sqrt_alpha_bar") -> sampling.GuidanceFn:
  """Guidance by grad_x log p(y | x0_hat(x_t)), x0_hat the denoiser's estimate, times
  sqrt(alpha_bar_t) (`weighting="sqrt_alpha_bar"`) or not (`"none"`: the plain rule)."""
  if weighting not in RECONSTRUCTION_WEIGHTINGS:
    raise ValueError(f"unknown reconstruction-guidance weighting {weighting!r}; choose one of "
                     f"{RECONSTRUCTION_WEIGHTINGS}")
  def log_p(x, t):
    x0_hat, _ = schedules.to_x0_and_eps(schedule, x, t, denoise(x, t), parameterization)
    return jnp.sum(log_reward(x0_hat, labels))

  def guidance(x_t, t, x0_hat):
    del x0_hat
    grad = jax.grad(log_p)(x_t, t)
    if weighting == "sqrt_alpha_bar":
      weight = jnp.sqrt(schedule.alphas_cumprod[t]).reshape((-1,) + (1,) * (grad.ndim - 1))
      grad = weight.astype(grad.dtype) * grad
    return _eps_correction(schedule, t, grad, scale)
  return guidance


def classifier_guidance(noisy_log_prob: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
                        schedule: schedules.Schedule, labels: jax.Array, scale: float
                        ) -> sampling.GuidanceFn:
  """Guidance by grad_x log p(y | x_t, t) of a classifier trained on noised images."""
  def guidance(x_t, t, x0_hat):
    del x0_hat
    grad = jax.grad(lambda x: jnp.sum(noisy_log_prob(x, t, labels)))(x_t)
    return _eps_correction(schedule, t, grad, scale)
  return guidance


def prior_network(prior: priors.Prior, num_labels: int) -> tuple[LabelledApply, PyTree]:
  """The prior's denoiser with a label input and its labelled params (zero table)."""
  _, apply = priors.network(prior.spec, num_labels=num_labels + 1)
  return apply, labelled_params(prior.params, num_labels)
