"""The JetFormer objective in bits per dimension, and the `Experiment` the shared loop trains.

Per example (generation order): levels -> curriculum noise -> dequantised x in [-1, 1] ->
patches -> z, log|det| = Jet(patches) -> z = [z_ar, z_rest];
  bpd = [-log GMM-AR(z_ar | class) - log N(z_rest; 0, I) - log|det|] / (D ln 2) + log2(bin_scale),
D = H W C pixel dimensions. Understanding-order examples contribute the class cross-entropy
instead, with the flow held fixed for them (stop-gradient), as in the paper's image-text model.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxlab.core import train_loop
from jaxlab.data import digits
from jaxlab.data import pipeline
from jaxlab.methods.jetformer import model as model_lib
from jaxlab.methods.jetformer import tokens as tokens_lib
from jaxlab.zoo import functional


def make_model(config: ml_collections.ConfigDict) -> functional.Functional:
  m, d = config.model, config.data
  height, width, channels = digits.IMAGE_SHAPE
  num_tokens = (height // m.patch) * (width // m.patch)
  token_dim = m.patch * m.patch * channels
  return functional.Functional(lambda rngs: model_lib.JetFormer(
      num_tokens=num_tokens, token_dim=token_dim, ar_dim=m.ar_dim, num_classes=d.num_classes,
      use_flow=m.use_flow, use_decoder=m.use_decoder, jet_depth=m.jet_depth,
      jet_width=m.jet_width, jet_conditioner_depth=m.jet_conditioner_depth,
      jet_heads=m.jet_heads, width=m.width, depth=m.depth, num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads, mlp_dim=m.mlp_dim, num_mixtures=m.num_mixtures,
      dropout=m.dropout, rngs=rngs))


def bits_per_dim(nll_nats: jax.Array, num_dims: int, num_levels: int) -> jax.Array:
  """Continuous NLL (nats, per example) -> discrete bits per pixel dimension."""
  return nll_nats / (num_dims * math.log(2)) + math.log2(tokens_lib.bin_scale(num_levels))


def image_nll(model: model_lib.JetFormer, z: jax.Array, logdet: jax.Array,
              hidden: jax.Array | None) -> jax.Array:
  """-log p(x) in nats per example, from flow outputs and (if any) decoder states."""
  if model.decoder is None:
    return -model_lib.standard_normal_log_prob(z) - logdet
  z_ar, z_rest = z[..., :model.ar_dim], z[..., model.ar_dim:]
  return -(model.image_log_prob(hidden, z_ar) + model_lib.standard_normal_log_prob(z_rest)
           ) - logdet


def loss_fn(model: model_lib.JetFormer, batch: dict[str, jax.Array], rng: jax.Array, *,
            config: ml_collections.ConfigDict, noise_std: jax.Array, train: bool
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean training loss and metrics for a batch {"image": uint8 [B, H, W, C], "label": [B]}."""
  num_levels = config.data.num_levels
  levels, labels = batch["image"], batch["label"]
  batch_size = labels.shape[0]
  noise_key, dequant_key, direction_key, drop_key, dropout_key = jax.random.split(rng, 5)
  if train and config.model.use_decoder:
    image_first = jax.random.uniform(direction_key, (batch_size,)) < config.optim.understanding_prob
  else:
    image_first = jnp.zeros((batch_size,), bool)
  # The curriculum blurs only images that are generation targets.
  noisy = tokens_lib.add_curriculum_noise(noise_key, levels, noise_std, num_levels)
  levels = jnp.where(image_first[:, None, None, None], levels, noisy)
  x = tokens_lib.dequantize(dequant_key, levels, num_levels)
  patches = tokens_lib.patchify(x, config.model.patch)
  z, logdet = model.encode(patches)
  num_dims = int(np.prod(levels.shape[1:]))
  if model.decoder is None:
    bpd = bits_per_dim(image_nll(model, z, logdet, None), num_dims, num_levels)
    return bpd.mean(), {"bpd": bpd.mean()}

  z_ar = z[..., :model.ar_dim]
  dropped = jax.random.uniform(drop_key, (batch_size,)) < config.optim.label_dropout
  labels_in = jnp.where(train & dropped & ~image_first, model.vocab.no_label, labels)
  z_in = jnp.where(image_first[:, None, None], jax.lax.stop_gradient(z_ar), z_ar)
  hidden = model.hidden(labels_in, z_in, image_first, rng=dropout_key if train else None)
  bpd = bits_per_dim(image_nll(model, z, logdet, hidden), num_dims, num_levels)
  logits = model.class_logits(hidden)
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)[:, 0]
  generation = (~image_first).astype(bpd.dtype)
  understanding = image_first.astype(bpd.dtype)
  image_loss = jnp.sum(bpd * generation) / jnp.maximum(generation.sum(), 1.0)
  class_loss = jnp.sum(ce * understanding) / jnp.maximum(understanding.sum(), 1.0)
  loss = image_loss + config.optim.class_weight * class_loss
  return loss, {"bpd": image_loss, "class_ce": class_loss}


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  o, steps = config.optim, config.train.steps
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, o.lr, warmup_steps=max(1, int(o.warmup_fraction * steps)), decay_steps=max(steps, 2))
  return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                     optax.adamw(schedule, b1=0.9, b2=o.b2, weight_decay=o.weight_decay))


def train_arrays(config: ml_collections.ConfigDict, split: str) -> dict[str, np.ndarray]:
  images, labels = digits.load_arrays(
      split, digits.digits_config(num_test=config.data.num_test, seed=config.data.seed),
      config.data.data_dir)
  return {"image": images.astype(np.int32), "label": labels.astype(np.int32)}


def make_experiment(config: ml_collections.ConfigDict) -> train_loop.Experiment:
  model = make_model(config)
  optimizer = make_optimizer(config)
  total = config.train.steps

  def init(rng):
    params = model.init(rng)
    return {"params": params, "opt_state": optimizer.init(params),
            "step": jnp.zeros([], jnp.int32)}

  def update(state, batch, rng):
    noise_std = tokens_lib.curriculum_std(state["step"] / total, config.optim.noise_std)

    def objective(params):
      return loss_fn(model.module(params), batch, rng, config=config, noise_std=noise_std,
                     train=True)

    (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state["params"])
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    new_state = {"params": optax.apply_updates(state["params"], updates),
                 "opt_state": opt_state, "step": state["step"] + 1}
    return new_state, {"loss": loss, "noise_std": noise_std, **metrics}

  def evaluate(state, batch):
    _, metrics = loss_fn(model.module(state["params"]), batch, jax.random.key(0), config=config,
                         noise_std=jnp.zeros([]), train=False)
    return {"bpd": metrics["bpd"]}

  def train_data(process_index, process_count):
    source = pipeline.InMemorySource(train_arrays(config, "train"))
    return pipeline.grain_pipeline(source, batch_size=config.train.batch_size, seed=config.seed,
                                   process_index=process_index, process_count=process_count)

  def eval_data(process_index, process_count):
    source = pipeline.InMemorySource(train_arrays(config, "test"))
    return pipeline.grain_pipeline(source, batch_size=config.eval.batch_size, seed=0,
                                   process_index=process_index, process_count=process_count,
                                   shuffle=False, num_epochs=1)

  return train_loop.Experiment(init=init, update=update, train_data=train_data,
                               evaluate=evaluate, eval_data=eval_data)
