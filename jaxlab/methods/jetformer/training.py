"""The JetFormer objective in bits per dimension, and the `Experiment` the shared loop trains.

Per example (generation order): levels -> curriculum noise -> dequantised x in [-1, 1] ->
patches -> z, log|det| = Jet(patches) -> z = [z_ar, z_rest];
  bpd = [-log GMM-AR(z_ar | class) - log N(z_rest; 0, I) - log|det|] / (D ln 2) + log2(bin_scale),
D = H W C pixel dimensions. During training the autoregressive tokens of generation examples
carry extra Gaussian noise (per-example std ~ U[0, `model.input_noise_std`]), in the decoder's
input and in the GMM's target alike, as the official trainer does to make sampling robust to its
own errors. Understanding-order examples (a share `optim.understanding_prob`) contribute the
class cross-entropy instead, with the flow held fixed for them (stop-gradient), as in the paper's
image-text model.

`train.num_seeds` independent training runs (their own initialisation, noise, label dropout and
dropout; the same data order) share one update (`core.replicas.map_replicas`: vmapped, or one
after another on a single CPU device): params are replica-stacked [R, ...].
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxlab.core import config as config_lib
from jaxlab.core import replicas as replicas_lib
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
      dropout=m.dropout, class_repeats=m.class_repeats, embed_init_std=m.embed_init_std,
      rngs=rngs))


def bits_per_dim(nll_nats: jax.Array, num_dims: int, num_levels: int) -> jax.Array:
  """Continuous NLL (nats, per example) -> discrete bits per pixel dimension."""
  return nll_nats / (num_dims * math.log(2)) + math.log2(tokens_lib.bin_scale(num_levels))


def curriculum_steps(config: ml_collections.ConfigDict) -> int:
  """The curriculum's length: the noise reaches its final std after this many steps."""
  return max(1, round(config.train.curriculum_fraction * config.train.steps))


def noise_std_at(step: jax.Array, config: ml_collections.ConfigDict) -> jax.Array:
  return tokens_lib.curriculum_std(step / curriculum_steps(config), config.optim.noise_std)


def lr_multiplier(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warm-up then cosine to 0 over all training steps, peak 1 (times `optim.lr`)."""
  steps = config.train.steps
  return optax.warmup_cosine_decay_schedule(
      0.0, 1.0, warmup_steps=max(1, int(config.optim.warmup_fraction * steps)),
      decay_steps=max(steps, 2))


def clean_phase(config: ml_collections.ConfigDict, threshold: float = 0.5) -> dict[str, Any]:
  """When the curriculum noise falls below `threshold` grey levels, and the share of the summed
  learning rate that the steps from then on receive."""
  steps = np.arange(config.train.steps)
  multiplier = np.asarray(jax.vmap(lr_multiplier(config))(jnp.asarray(steps)))
  noise = np.asarray(noise_std_at(jnp.asarray(steps), config))
  clean = noise < threshold
  first = int(np.argmax(clean)) if clean.any() else None
  share = float(multiplier[clean].sum() / max(multiplier.sum(), 1e-12))
  return {"noise_below": threshold, "first_step": first, "lr_share": share,
          "step_share": float(clean.mean())}


def decays_weight(params: Any) -> Any:
  """True for kernels only: biases, norm scales, embeddings and positions are not decayed."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) == "kernel", params)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Clip -> Adam -> x lr -> + wd * params (kernels) -> x schedule, as big_vision's optimiser:
  the weight decay follows the schedule but is not multiplied by the base learning rate."""
  o = config.optim
  return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                     optax.scale_by_adam(b1=0.9, b2=o.b2),
                     optax.scale(o.lr),
                     optax.add_decayed_weights(o.weight_decay, mask=decays_weight),
                     optax.scale_by_schedule(lr_multiplier(config)),
                     optax.scale(-1.0))


def image_nll(model: model_lib.JetFormer, z_ar: jax.Array, z_rest: jax.Array,
              logdet: jax.Array, hidden: jax.Array | None) -> jax.Array:
  """-log p(x) in nats per example, from flow outputs and (if any) decoder states."""
  if model.decoder is None:
    z = jnp.concatenate([z_ar, z_rest], axis=-1)
    return -model_lib.standard_normal_log_prob(z) - logdet
  return -(model.image_log_prob(hidden, z_ar) + model_lib.standard_normal_log_prob(z_rest)
           ) - logdet


def add_input_noise(key: jax.Array, z_ar: jax.Array, max_std: float, where: jax.Array
                    ) -> jax.Array:
  """z_ar + s * N(0, 1) with a per-example s ~ U[0, max_std], only for examples in `where`."""
  std_key, noise_key = jax.random.split(key)
  std = jax.random.uniform(std_key, (z_ar.shape[0], 1, 1), z_ar.dtype, 0.0, max_std)
  std = jnp.where(where[:, None, None], std, 0.0)
  return z_ar + std * jax.random.normal(noise_key, z_ar.shape, z_ar.dtype)


def loss_fn(model: model_lib.JetFormer, batch: dict[str, jax.Array], rng: jax.Array, *,
            config: ml_collections.ConfigDict, noise_std: jax.Array, train: bool
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean training loss and metrics for a batch {"image": int [B, H, W, C], "label": [B]}."""
  num_levels = config.data.num_levels
  levels, labels = batch["image"], batch["label"]
  batch_size = labels.shape[0]
  (noise_key, dequant_key, direction_key, drop_key, dropout_key,
   input_noise_key) = jax.random.split(rng, 6)
  if train and config.model.use_decoder:
    image_first = jax.random.uniform(direction_key, (batch_size,)) < config.optim.understanding_prob
  else:
    image_first = jnp.zeros((batch_size,), bool)
  # The curriculum blurs only images that are generation targets.
  noisy = tokens_lib.add_curriculum_noise(noise_key, levels, noise_std)
  levels = jnp.where(image_first[:, None, None, None], levels, noisy)
  x = tokens_lib.dequantize(dequant_key, levels, num_levels)
  patches = tokens_lib.patchify(x, config.model.patch)
  z, logdet = model.encode(patches)
  num_dims = int(np.prod(levels.shape[1:]))
  z_ar, z_rest = z[..., :model.ar_dim], z[..., model.ar_dim:]
  if model.decoder is None:
    bpd = bits_per_dim(image_nll(model, z_ar, z_rest, logdet, None), num_dims, num_levels)
    return bpd.mean(), {"bpd": bpd.mean()}

  if train and config.model.input_noise_std > 0:
    z_ar = add_input_noise(input_noise_key, z_ar, config.model.input_noise_std, ~image_first)
  dropped = jax.random.uniform(drop_key, (batch_size,)) < config.optim.label_dropout
  labels_in = jnp.where(train & dropped & ~image_first, model.vocab.no_label, labels)
  z_in = jnp.where(image_first[:, None, None], jax.lax.stop_gradient(z_ar), z_ar)
  hidden = model.hidden(labels_in, z_in, image_first, rng=dropout_key if train else None)
  bpd = bits_per_dim(image_nll(model, z_ar, z_rest, logdet, hidden), num_dims, num_levels)
  logits = model.class_logits(hidden)
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)[:, 0]
  generation = (~image_first).astype(bpd.dtype)
  understanding = image_first.astype(bpd.dtype)
  image_loss = jnp.sum(bpd * generation) / jnp.maximum(generation.sum(), 1.0)
  class_loss = jnp.sum(ce * understanding) / jnp.maximum(understanding.sum(), 1.0)
  loss = image_loss + config.optim.class_weight * class_loss
  return loss, {"bpd": image_loss, "class_ce": class_loss}


def train_arrays(config: ml_collections.ConfigDict, split: str) -> dict[str, np.ndarray]:
  images, labels = digits.load_arrays(
      split, digits.digits_config(num_test=config.data.num_test, seed=config.data.seed),
      config.data.data_dir)
  return {"image": images.astype(np.int32), "label": labels.astype(np.int32)}


def make_experiment(config: ml_collections.ConfigDict) -> train_loop.Experiment:
  model = make_model(config)
  optimizer = make_optimizer(config)
  num_seeds = config.train.num_seeds
  config_lib.require(num_seeds >= 1, "train.num_seeds", f"must be positive, got {num_seeds}")
  fraction = config.train.curriculum_fraction
  config_lib.require(0 < fraction <= 1, "train.curriculum_fraction",
                     f"must be in (0, 1], got {fraction}")
  config_lib.require(config.model.input_noise_std >= 0, "model.input_noise_std",
                     f"must be >= 0, got {config.model.input_noise_std}")
  replicas = jnp.arange(num_seeds)

  def init(rng):
    params = jax.vmap(lambda r: model.init(jax.random.fold_in(rng, r)))(replicas)
    return {"params": params, "opt_state": jax.vmap(optimizer.init)(params),
            "step": jnp.zeros([], jnp.int32)}

  def update(state, batch, rng):
    noise_std = noise_std_at(state["step"], config)

    def replica_update(params, opt_state, key):
      def objective(params):
        return loss_fn(model.module(params), batch, key, config=config, noise_std=noise_std,
                       train=True)
      (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss, metrics

    keys = jax.vmap(lambda r: jax.random.fold_in(rng, r))(replicas)
    params, opt_state, loss, metrics = replicas_lib.map_replicas(replica_update)(
        state["params"], state["opt_state"], keys)
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1}
    out = {"loss": loss.mean(), "noise_std": noise_std,
           **{name: value.mean() for name, value in metrics.items()}}
    out.update({f"loss_seed{r}": loss[r] for r in range(num_seeds)})
    return new_state, out

  def evaluate(state, batch):
    def replica_bpd(params):
      _, metrics = loss_fn(model.module(params), batch, jax.random.key(0), config=config,
                           noise_std=jnp.zeros([]), train=False)
      return metrics["bpd"]
    bpd = replicas_lib.map_replicas(replica_bpd)(state["params"])
    return {"bpd": bpd.mean(), **{f"bpd_seed{r}": bpd[r] for r in range(num_seeds)}}

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
