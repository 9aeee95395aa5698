"""Lotus on procedural scenes: the pretrained prior, the fine-tuning objectives of every variant,
and prediction, as `Experiment`s for the shared training loop and pure prediction functions.

Every fine-tuned network is the zoo `UNet` with 6 input channels, [RGB image, target channels],
3 output channels, and a 2-way task embedding (annotation / RGB reconstruction). Images and targets
live in [-1, 1]: depth is normalised per image to [-1, 1] (affine-invariant, as Marigold and Lotus)
and repeated over 3 channels, normals are unit vectors.

* **Prior.** An eps-prediction diffusion model of the images with 3 input channels (the noisy
  image), trained first and saved. Every variant fine-tunes from it with its input convolution
  widened to 6 channels as the official code widens Stable Diffusion's `conv_in`: the pretrained
  kernel is duplicated over [image, target] channels and halved (`unet.widen_input_channels`), so
  the image channels start from pretrained weights too.
* **Multi-step variants** train at uniform t with the noisy annotation in the target channels and
  predict eps (A) or x0 (B); they sample with DDIM (eta = 0) from Gaussian noise.
* **Single-step variants** see t = T - 1 only, with pure noise (C, Lotus-G) or zeros (D, Lotus-D)
  in the target channels, and regress the annotation directly: one network evaluation.
* **Detail preserver** (E): each batch also asks the same network, switched by the task
  embedding, to reconstruct the RGB input; the two losses add.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxlab.core import train_loop
from jaxlab.data import pipeline
from jaxlab.data import scenes
from jaxlab.diffusion import sampling
from jaxlab.diffusion import schedules
from jaxlab.methods.lotus import variants as variants_lib
from jaxlab.zoo import functional
from jaxlab.zoo import unet

TASKS = ("depth", "normal")
IMAGE_CHANNELS = 3


def make_model(config: ml_collections.ConfigDict, *, prior: bool = False
               ) -> functional.Functional:
  """The fine-tuned network ([image, target] in), or with `prior` the image-only prior."""
  m = config.model
  in_channels = IMAGE_CHANNELS if prior else 2 * IMAGE_CHANNELS
  return functional.Functional(lambda rngs: unet.UNet(
      in_channels=in_channels, out_channels=IMAGE_CHANNELS,
      base_channels=m.base_channels, channel_multipliers=tuple(m.channel_multipliers),
      blocks_per_level=m.blocks_per_level, attention_at_lowest=m.attention,
      groups=m.groups, num_embeddings=2, rngs=rngs))


def make_schedule(config: ml_collections.ConfigDict) -> schedules.Schedule:
  d = config.diffusion
  if d.schedule == "linear":
    return schedules.linear_schedule(d.num_steps)
  return schedules.cosine_schedule(d.num_steps)


def normalise_depth(depth: np.ndarray) -> np.ndarray:
  """[N, H, W] -> [-1, 1] per image (min -> -1, max -> 1)."""
  low = depth.min(axis=(1, 2), keepdims=True)
  high = depth.max(axis=(1, 2), keepdims=True)
  return 2 * (depth - low) / np.maximum(high - low, 1e-6) - 1


def task_arrays(config: ml_collections.ConfigDict, split: str, distribution: str = "train"
                ) -> dict[str, np.ndarray]:
  """{"image", "target", "depth", "normal"} float32 arrays of a scenes split, in [-1, 1]."""
  d = config.data
  num_test = d.num_test if distribution == "train" else d.num_heldout
  arrays = scenes.load_arrays(split, scenes.scenes_config(
      distribution=distribution, size=d.size, num_train=d.num_train if distribution == "train"
      else 8, num_test=num_test, seed=d.seed), d.data_dir)
  depth_target = np.repeat(normalise_depth(arrays["depth"])[..., None], 3, axis=-1)
  return {"image": (2 * arrays["image"] - 1).astype(np.float32),
          "depth_target": depth_target.astype(np.float32),
          "normal_target": arrays["normal"].astype(np.float32),
          "depth": arrays["depth"].astype(np.float32),
          "normal": arrays["normal"].astype(np.float32),
          "object_id": arrays["object_id"].astype(np.int32)}


def _inputs(image: jax.Array, target_channels: jax.Array) -> jax.Array:
  return jnp.concatenate([image, target_channels], axis=-1)


def _labels(batch_size: int, value: int) -> jax.Array:
  return jnp.full((batch_size,), value, jnp.int32)


def widen_prior(prior_params: Any) -> Any:
  """The fine-tuning initialisation: the prior with its input conv widened to [image, target].

  On inputs [x, x] the widened network computes exactly what the prior computes on x.
  """
  return unet.widen_input_channels(prior_params, 2 * IMAGE_CHANNELS)


def prior_loss(model, schedule, batch, rng) -> tuple[jax.Array, dict[str, jax.Array]]:
  """eps-prediction denoising of the images themselves (unconditional, 3 input channels)."""
  image = batch["image"]
  batch_size = image.shape[0]
  t_key, noise_key = jax.random.split(rng)
  t = jax.random.randint(t_key, (batch_size,), 0, schedule.num_steps)
  eps = jax.random.normal(noise_key, image.shape, image.dtype)
  noisy = schedules.q_sample(schedule, image, t, eps)
  output = model(noisy, t, _labels(batch_size, variants_lib.ANNOTATION))
  loss = jnp.mean(jnp.square(output - eps))
  return loss, {"mse": loss}


def finetune_loss(model, schedule, variant: variants_lib.Variant, batch, rng
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`batch`: {"image", "target"}, the target being the task's annotation ([B, H, W, 3])."""
  image, target = batch["image"], batch["target"]
  batch_size = image.shape[0]
  t_key, noise_key = jax.random.split(rng)
  eps = jax.random.normal(noise_key, target.shape, target.dtype)
  if variant.single_step:
    t = jnp.full((batch_size,), schedule.num_steps - 1, jnp.int32)
    channels = eps if variant.noise_input else jnp.zeros_like(target)
  else:
    t = jax.random.randint(t_key, (batch_size,), 0, schedule.num_steps)
    channels = schedules.q_sample(schedule, target, t, eps)
  inputs = _inputs(image, channels)
  if variant.detail_preserver:
    # One network call on the annotation and reconstruction copies of the batch, stacked (as the
    # official code concatenates them), told apart by the task switcher.
    both = model(jnp.concatenate([inputs, inputs]), jnp.concatenate([t, t]),
                 jnp.concatenate([_labels(batch_size, variants_lib.ANNOTATION),
                                  _labels(batch_size, variants_lib.RECONSTRUCTION)]))
    output, reconstruction = both[:batch_size], both[batch_size:]
  else:
    output = model(inputs, t, _labels(batch_size, variants_lib.ANNOTATION))
  regression = schedules.target_for(schedule, t, target, eps, variant.parameterization)
  annotation_loss = jnp.mean(jnp.square(output - regression))
  metrics = {"annotation_mse": annotation_loss}
  loss = annotation_loss
  if variant.detail_preserver:
    reconstruction_loss = jnp.mean(jnp.square(reconstruction - image))
    loss = loss + reconstruction_loss
    metrics["reconstruction_mse"] = reconstruction_loss
  return loss, metrics


def make_optimizer(lr: float, steps: int) -> optax.GradientTransformation:
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps=max(1, steps // 20),
                                                decay_steps=max(steps, 2))
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))


def training_arrays(config: ml_collections.ConfigDict, task: str | None
                    ) -> dict[str, np.ndarray]:
  """The prior's training images (task None), or {"image", "target"} of one task.

  Every task's batches have the same keys and shapes, so the depth and normal fine-tunings of
  one variant are the same program (compiled once with the compilation cache).
  """
  arrays = task_arrays(config, "train")
  if task is None:
    return {"image": arrays["image"]}
  return {"image": arrays["image"], "target": arrays[f"{task}_target"]}


def _data_fns(config: ml_collections.ConfigDict, task: str | None):
  def train_data(process_index, process_count):
    source = pipeline.InMemorySource(training_arrays(config, task))
    return pipeline.grain_pipeline(source, batch_size=config.train.batch_size, seed=config.seed,
                                   process_index=process_index, process_count=process_count)
  return train_data


def make_experiment(config: ml_collections.ConfigDict, *, variant: str | None = None,
                    task: str | None = None, init_params: Any = None,
                    steps: int | None = None) -> train_loop.Experiment:
  """The prior (variant None) or one (variant, task) fine-tuning from `init_params` (the
  widened prior, `widen_prior`)."""
  model = make_model(config, prior=variant is None)
  schedule = make_schedule(config)
  total = steps or config.train.steps
  lr = config.optim.prior_lr if variant is None else config.optim.lr
  optimizer = make_optimizer(lr, total)
  if variant is None:
    objective = functools.partial(prior_loss, schedule=schedule)
  else:
    objective = functools.partial(finetune_loss, schedule=schedule,
                                  variant=variants_lib.VARIANTS[variant])

  def init(rng):
    params = model.init(rng) if init_params is None else init_params
    return {"params": params, "opt_state": optimizer.init(params)}

  def update(state, batch, rng):
    def loss(params):
      return objective(model.module(params), batch=batch, rng=rng)
    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state["params"])
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    return ({"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state},
            {"loss": value, **metrics})

  data_task = None if variant is None else task   # the prior trains on the images alone
  return train_loop.Experiment(init=init, update=update, train_data=_data_fns(config, data_task))


def predictor(config: ml_collections.ConfigDict, variant_name: str):
  """jit((params, image [B, H, W, 3], key) -> prediction [B, H, W, 3] in [-1, 1])."""
  model = make_model(config)
  schedule = make_schedule(config)
  variant = variants_lib.VARIANTS[variant_name]
  steps = config.diffusion.sample_steps

  def predict(params, image, key):
    module = model.module(params)
    batch_size = image.shape[0]
    labels = _labels(batch_size, variants_lib.ANNOTATION)
    noise = jax.random.normal(key, image.shape, image.dtype)
    if variant.single_step:
      channels = noise if variant.noise_input else jnp.zeros_like(image)
      t = jnp.full((batch_size,), schedule.num_steps - 1, jnp.int32)
      return module(_inputs(image, channels), t, labels)

    def denoise(xt, t):
      return module(_inputs(image, xt), t, labels)
    keys = jax.random.split(jax.random.fold_in(key, 1), steps)
    return sampling.ddim_sample(denoise, schedule, noise, keys, num_steps=steps, eta=0.0,
                                parameterization=variant.parameterization, clip_x0=1.0)

  return jax.jit(predict)
