"""The data, the classifier and the diffusion model of the digits reproduction.

Images are scikit-learn's 8x8 digits (via the TFDS builder `jaxlab.data.digits`) scaled from grey
levels 0..16 to [-1, 1], NHWC [N, S, S, 1], as DDPM and the paper's attacks use them, and
upsampled bilinearly to S = `data.size` pixels a side when S > 8. Upsampling adds no information
but gives the attacker and the purifier's noise as many coordinates as a real image has; an
L-inf attack then needs a budget small relative to the purification noise, as on CIFAR-10.

* The classifier is an MLP on the S*S flattened pixels (zoo `MLP`, GELU).
* The denoiser is the pretrained prior's network (`prior` config group, `jaxlab.diffusion.priors`):
  it predicts what `prior.parameterization` says, eps (the paper) or x0 (the samplers and ADDT
  convert; the x0_mlp ablation), and `prior.denoiser` picks the zoo network: `unet` (the zoo UNet
  over the S x S image; the quick preset's) or `residual_mlp` (the S*S pixels as a vector). Both
  have the image interface `denoise(params, x [B, S, S, 1], t [B]) -> output [B, S, S, 1]` the
  samplers expect.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.data import digits
from jaxlab.diffusion import priors
from jaxlab.diffusion import schedules
from jaxlab.zoo import functional
from jaxlab.zoo import mlp

NUM_CLASSES = 10
CHANNELS = digits.IMAGE_SHAPE[-1]
PARAMETERIZATIONS = ("eps", "x0")

# (params, x [B, S, S, 1], t [B]) -> eps_hat [B, S, S, 1]
DenoiserApply = Callable[[object, jax.Array, jax.Array], jax.Array]
# (params, x [B, S, S, 1]) -> logits [B, 10]
ClassifierApply = Callable[[object, jax.Array], jax.Array]


def num_pixels(config: ml_collections.ConfigDict) -> int:
  return config.data.size ** 2 * CHANNELS


def load_split(config: ml_collections.ConfigDict, split: str) -> dict[str, np.ndarray]:
  """{"image": float32 [N, S, S, 1] in [-1, 1], "label": int32 [N]} of the train or test split."""
  images, labels = digits.scaled_arrays(split, size=config.data.size,
                                        num_test=config.data.num_test, seed=config.data.seed,
                                        data_dir=config.data.data_dir)
  return {"image": images, "label": labels}


def make_schedule(config: ml_collections.ConfigDict) -> schedules.Schedule:
  return priors.make_schedule(prior_spec(config))


def classifier(config: ml_collections.ConfigDict) -> tuple[functional.Functional, ClassifierApply]:
  hidden = tuple(config.model.classifier_hidden)
  pixels = num_pixels(config)
  model = functional.Functional(lambda rngs: mlp.MLP([pixels, *hidden, NUM_CLASSES],
                                                     activation="gelu", rngs=rngs))

  def apply(params, x):
    return model.apply(params, x.reshape(x.shape[0], pixels))
  return model, apply


def prior_spec(config: ml_collections.ConfigDict) -> priors.PriorSpec:
  """The pretrained DDPM's spec (the config's `prior` group)."""
  return priors.PriorSpec.from_config(config.prior)


def denoiser(config: ml_collections.ConfigDict) -> tuple[functional.Functional, DenoiserApply]:
  return priors.network(prior_spec(config))


def x0_predictor(config: ml_collections.ConfigDict, schedule: schedules.Schedule,
                 apply: DenoiserApply):
  """(params, x_t, t) -> x0_hat, whatever the network predicts."""
  def predict_x0(params, x_t, t):
    x0_hat, _ = schedules.to_x0_and_eps(schedule, x_t, t, apply(params, x_t, t),
                                        config.prior.parameterization)
    return x0_hat
  return predict_x0


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return jnp.mean(jnp.argmax(logits, -1) == labels)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example cross-entropy [B]."""
  return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
