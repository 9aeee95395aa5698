"""The reproduction's trainings as `Experiment`s for the shared loop (the DDPM pretraining is
the shared prior cache's: `jaxlab.diffusion.priors`, spec from the config's `prior` group).

* `classifier_experiment`: the MLP classifier on clean digits (cross-entropy, Adam, cosine decay).
* `diffusion_experiment(perturbation)`: fine-tuning the pretrained model, as the official
  script does: Adam (beta1 0.95), linear warm-up then a constant learning rate, gradient clipping
  at 1, an EMA of the weights with the warm-up decay min(0.9999, 1 - (1 + step)^-3/4); `plain`
  regresses plain noise, `addt` / `addt_no_rbgm` the CGPO noise of `addt.training_noise`.

Every diffusion state keeps the EMA weights (`ema`) next to the trained ones; the EMA weights are
the model that purifies and the starting point of every fine-tuning.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxlab.core import train_loop
from jaxlab.data import pipeline
from jaxlab.diffusion import priors
from jaxlab.methods.diffusion_purification import addt
from jaxlab.methods.diffusion_purification import models


def _train_data(config: ml_collections.ConfigDict):
  def train_data(process_index, process_count):
    source = pipeline.InMemorySource(models.load_split(config, "train"))
    return pipeline.grain_pipeline(source, batch_size=config.train.batch_size, seed=config.seed,
                                   process_index=process_index, process_count=process_count)
  return train_data


def classifier_experiment(config: ml_collections.ConfigDict, steps: int
                          ) -> train_loop.Experiment:
  model, apply = models.classifier(config)
  optimizer = optax.adamw(optax.cosine_decay_schedule(config.optim.classifier_lr, steps),
                          weight_decay=config.optim.classifier_weight_decay)

  def init(rng):
    params = model.init(rng)
    return {"params": params, "opt_state": optimizer.init(params)}

  def update(state, batch, rng):
    del rng
    def loss(params):
      logits = apply(params, batch["image"])
      return jnp.mean(models.cross_entropy(logits, batch["label"])), logits
    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(state["params"])
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
    return ({"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state},
            {"loss": value, "accuracy": models.accuracy(logits, batch["label"])})

  return train_loop.Experiment(init=init, update=update, train_data=_train_data(config))


def finetune_optimizer(config: ml_collections.ConfigDict, steps: int
                       ) -> optax.GradientTransformation:
  o = config.optim
  warmup = max(1, round(o.warmup_fraction * steps))
  lr = optax.join_schedules([optax.linear_schedule(0.0, o.finetune_lr, warmup),
                             optax.constant_schedule(o.finetune_lr)], [warmup])
  adam = optax.adam(lr, b1=o.finetune_b1, b2=0.999)
  return optax.chain(optax.clip_by_global_norm(o.grad_clip), adam)


def diffusion_experiment(config: ml_collections.ConfigDict, steps: int, *, perturbation: str,
                         init_params: Any = None, classifier_params: Any = None
                         ) -> train_loop.Experiment:
  """One fine-tuning (`perturbation`: one of `addt.PERTURBATIONS`) from `init_params`, the
  pretrained EMA weights."""
  if perturbation not in addt.PERTURBATIONS:
    raise ValueError(f"perturbation must be one of {addt.PERTURBATIONS}, got {perturbation!r}")
  if init_params is None:
    raise ValueError("fine-tuning needs init_params (the pretrained diffusion model)")
  if perturbation in ("addt", "addt_no_rbgm") and classifier_params is None:
    raise ValueError(f"{perturbation} needs the frozen classifier's parameters")
  _, apply = models.denoiser(config)
  _, classify_apply = models.classifier(config)
  schedule = models.make_schedule(config)
  predict_x0 = models.x0_predictor(config, schedule, apply)
  parameterization = config.prior.parameterization
  optimizer = finetune_optimizer(config, steps)
  a = config.addt

  def init(rng):
    del rng
    return priors.ema_state(init_params, optimizer)

  def update(state, batch, rng):
    x0 = batch["image"]
    t_key, noise_key = jax.random.split(rng)
    t = jax.random.randint(t_key, (x0.shape[0],), 0, schedule.num_steps)
    frozen = jax.lax.stop_gradient(state["params"])
    noise, metrics = addt.training_noise(
        lambda x, s: predict_x0(frozen, x, s), lambda x: classify_apply(classifier_params, x),
        schedule, x0, batch["label"], t, noise_key, perturbation=perturbation,
        scale=a.lambda_scale, maximum=a.lambda_max, iterations=a.cgpo_iterations)
    state, value = priors.denoising_step(
        state, x0, t, noise, apply=apply, opt=optimizer, schedule=schedule,
        parameterization=parameterization, ema_max=config.optim.ema_max,
        ema_power=config.optim.ema_power)
    return state, {"loss": value, **metrics}

  return train_loop.Experiment(init=init, update=update, train_data=_train_data(config))
