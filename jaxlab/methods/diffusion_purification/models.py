"""The data, the classifier and the diffusion model of the digits reproduction.

Images are scikit-learn's 8x8 digits (via the TFDS builder `jaxlab.data.digits`) scaled from grey
levels 0..16 to [-1, 1], NHWC [N, S, S, 1], as DDPM and the paper's attacks use them, and
upsampled bilinearly to S = `data.size` pixels a side when S > 8. Upsampling adds no information
but gives the attacker and the purifier's noise as many coordinates as a real image has; an
L-inf attack then needs a budget small relative to the purification noise, as on CIFAR-10.

* The classifier is an MLP on the S*S flattened pixels (zoo `MLP`, GELU).
* The denoiser predicts what `model.parameterization` says: eps (the paper) or x0 (the samplers
  and ADDT convert; see the README for why the quick preset's MLP predicts x0). `model.denoiser` picks the zoo network: `residual_mlp` (the
  S*S pixels as a vector; the quick preset's choice, see the README's speed notes) or `unet` (the zoo
  UNet over the S x S image). Both are wrapped to the image interface
  `denoise(params, x [B, S, S, 1], t [B]) -> eps_hat [B, S, S, 1]` the samplers expect.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.data import digits
from jaxlab.diffusion import schedules
from jaxlab.zoo import functional
from jaxlab.zoo import mlp
from jaxlab.zoo import residual_mlp
from jaxlab.zoo import unet

NUM_CLASSES = 10
CHANNELS = digits.IMAGE_SHAPE[-1]
DENOISERS = ("residual_mlp", "unet")
PARAMETERIZATIONS = ("eps", "x0")

# (params, x [B, S, S, 1], t [B]) -> eps_hat [B, S, S, 1]
DenoiserApply = Callable[[object, jax.Array, jax.Array], jax.Array]
# (params, x [B, S, S, 1]) -> logits [B, 10]
ClassifierApply = Callable[[object, jax.Array], jax.Array]


def num_pixels(config: ml_collections.ConfigDict) -> int:
  return config.data.size ** 2 * CHANNELS


def load_split(config: ml_collections.ConfigDict, split: str) -> dict[str, np.ndarray]:
  """{"image": float32 [N, S, S, 1] in [-1, 1], "label": int32 [N]} of the train or test split."""
  images, labels = digits.load_arrays(
      split, digits.digits_config(num_test=config.data.num_test, seed=config.data.seed),
      config.data.data_dir)
  scaled = images.astype(np.float32) / (digits.NUM_LEVELS - 1) * 2 - 1
  size = config.data.size
  if size != scaled.shape[1]:
    scaled = np.asarray(jax.image.resize(scaled, (len(scaled), size, size, CHANNELS),
                                         "bilinear"))
  return {"image": scaled, "label": labels.astype(np.int32)}


def make_schedule(config: ml_collections.ConfigDict) -> schedules.Schedule:
  d = config.diffusion
  if d.schedule == "linear":
    return schedules.linear_schedule(d.num_steps)
  return schedules.cosine_schedule(d.num_steps)


def classifier(config: ml_collections.ConfigDict) -> tuple[functional.Functional, ClassifierApply]:
  hidden = tuple(config.model.classifier_hidden)
  pixels = num_pixels(config)
  model = functional.Functional(lambda rngs: mlp.MLP([pixels, *hidden, NUM_CLASSES],
                                                     activation="gelu", rngs=rngs))

  def apply(params, x):
    return model.apply(params, x.reshape(x.shape[0], pixels))
  return model, apply


def denoiser(config: ml_collections.ConfigDict) -> tuple[functional.Functional, DenoiserApply]:
  m = config.model
  pixels = num_pixels(config)
  if m.denoiser == "residual_mlp":
    model = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
        in_features=pixels, out_features=pixels, width=m.width, num_blocks=m.num_blocks,
        rngs=rngs))

    def apply(params, x, t):
      return model.apply(params, x.reshape(x.shape[0], pixels), t).reshape(x.shape)
    return model, apply
  model = functional.Functional(lambda rngs: unet.UNet(
      in_channels=CHANNELS, out_channels=CHANNELS, base_channels=m.base_channels,
      channel_multipliers=tuple(m.channel_multipliers), blocks_per_level=1,
      attention_at_lowest=False, groups=m.groups, rngs=rngs))
  return model, model.apply


def x0_predictor(config: ml_collections.ConfigDict, schedule: schedules.Schedule,
                 apply: DenoiserApply):
  """(params, x_t, t) -> x0_hat, whatever the network predicts."""
  def predict_x0(params, x_t, t):
    x0_hat, _ = schedules.to_x0_and_eps(schedule, x_t, t, apply(params, x_t, t),
                                        config.model.parameterization)
    return x0_hat
  return predict_x0


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return jnp.mean(jnp.argmax(logits, -1) == labels)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example cross-entropy [B]."""
  return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
