"""Clean and robust accuracy of a purifier + classifier under the two attack protocols.

The defended classifier is `logits(x, key) = classifier(purify(x, keys = split(key, t* + 2)))`.
For one batch, `evaluate_batch` runs (jitted pieces, the PGD loop in Python):

* clean accuracy: the clean images, purified with `num_draws` fresh keys (accuracy averaged);
* stochastic white-box: PGD (L-inf) with EOT, a fresh purification for every EOT draw of every
  step (`attacks.stochastic_keys`), then the adversarial images are purified with `num_draws`
  fresh keys the attack never saw;
* DW-box: one key drawn for the batch fixes the forward noise and every reverse noise; PGD with
  EOT = 1 attacks that fixed function (`attacks.fixed_keys`) and the evaluation purifies with the
  same key, so it scores exactly the function that was attacked. With `check_convergence` the
  same DW-box attack runs on to `attack.convergence_steps` steps and is scored there too
  (`robust_acc_dwbox_long`): PGD-20 is the 20th iterate of that longer run.

`undefended_batch` is the reference without purification: the classifier alone under PGD.
Every model is evaluated with the same keys per batch, so the comparisons are paired.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.attacks import linf as attacks
from jaxlab.core import parallel
from jaxlab.diffusion import schedules
from jaxlab.methods.diffusion_purification import models
from jaxlab.methods.diffusion_purification import purification

PROTOCOLS = ("clean_acc", "robust_acc_eot", "robust_acc_dwbox")
# The DW-box accuracy after `attack.convergence_steps` PGD steps (evaluator(check_convergence)).
DWBOX_LONG = "robust_acc_dwbox_long"
# The attacks' valid range: models.py maps the pixels to [-1, 1], as DDPM does.
PIXEL_RANGE = (-1.0, 1.0)


def defended_logits(config: ml_collections.ConfigDict):
  """(classifier params, denoiser params, x [B, 8, 8, 1], key) -> logits [B, 10]."""
  _, classify = models.classifier(config)
  _, denoise = models.denoiser(config)
  schedule = models.make_schedule(config)
  t_star = config.diffusion.t_star

  def logits(classifier_params, denoiser_params, x, key):
    keys = jax.random.split(key, purification.num_keys(t_star))
    purified = purification.purify(lambda x_t, t: denoise(denoiser_params, x_t, t), schedule, x,
                                   t_star, keys, remat=config.diffusion.remat,
                                   parameterization=config.prior.parameterization,
                                   variance=config.diffusion.variance,
                                   unroll=config.diffusion.unroll)
    return classify(classifier_params, purified)
  return logits


def _pgd(config, loss, x, keys):
  return attacks.pgd_linf(loss, x, keys, epsilon=config.attack.epsilon,
                          step_size=config.attack.step_size, bounds=PIXEL_RANGE)


def evaluator(config: ml_collections.ConfigDict, *, check_convergence: bool = False):
  """(classifier params, denoiser params, x [B, ...], y [B], key) -> {protocol: correct [B]},
  per-example accuracies (fractions of the draws for the stochastic protocols); with
  `check_convergence` also `DWBOX_LONG`. The attacks loop over jitted PGD steps from Python
  (`attacks.pgd_linf_host_loop`); each piece is compiled once and reused for every model."""
  logits = defended_logits(config)
  a = config.attack
  dwbox_steps = max(a.steps, a.convergence_steps) if check_convergence else a.steps
  recorded = (a.steps, dwbox_steps) if check_convergence else (a.steps,)

  @jax.jit
  def attack_step(classifier_params, denoiser_params, x_adv, x, y, step_keys):
    def loss(x_in, k):
      return jnp.sum(models.cross_entropy(logits(classifier_params, denoiser_params, x_in, k), y))
    return attacks.pgd_step(loss, x_adv, x, step_keys, epsilon=a.epsilon,
                            step_size=a.step_size, bounds=PIXEL_RANGE)

  @jax.jit
  def correct(classifier_params, denoiser_params, x_in, y, key):
    return (jnp.argmax(logits(classifier_params, denoiser_params, x_in, key), -1) == y
            ).astype(jnp.float32)

  @jax.jit
  def fresh_draws(classifier_params, denoiser_params, x_in, y, key):
    draws = jax.random.split(key, config.eval.num_draws)
    return jnp.mean(jax.vmap(lambda d: correct(classifier_params, denoiser_params, x_in, y, d)
                             )(draws), axis=0)

  def evaluate_batch(classifier_params, denoiser_params, x, y, key):
    clean_key, eot_attack_key, eot_eval_key, dwbox_key = jax.random.split(key, 4)
    step = lambda x_adv, x_clean, k: attack_step(classifier_params, denoiser_params, x_adv,
                                                 x_clean, y, k)
    x_eot = attacks.pgd_linf_host_loop(
        step, x, attacks.stochastic_keys(eot_attack_key, a.steps, a.eot), record_at=(a.steps,))
    x_dwbox = attacks.pgd_linf_host_loop(step, x, attacks.fixed_keys(dwbox_key, dwbox_steps),
                                         record_at=recorded)
    out = {"clean_acc": fresh_draws(classifier_params, denoiser_params, x, y, clean_key),
           "robust_acc_eot": fresh_draws(classifier_params, denoiser_params, x_eot[0], y,
                                         eot_eval_key),
           "robust_acc_dwbox": correct(classifier_params, denoiser_params, x_dwbox[0], y,
                                       dwbox_key)}
    if check_convergence:
      out[DWBOX_LONG] = correct(classifier_params, denoiser_params, x_dwbox[1], y, dwbox_key)
    return out

  return evaluate_batch


def undefended_evaluator(config: ml_collections.ConfigDict):
  """jit((classifier params, x, y, key) -> {"clean_acc", "robust_acc_pgd"}: correct [B])."""
  _, classify = models.classifier(config)

  def evaluate_batch(classifier_params, x, y, key):
    def correct(x_in):
      return (jnp.argmax(classify(classifier_params, x_in), -1) == y).astype(jnp.float32)

    def loss(x_in, k):
      del k
      return jnp.sum(models.cross_entropy(classify(classifier_params, x_in), y))
    x_adv = _pgd(config, loss, x, attacks.fixed_keys(key, config.attack.steps))
    return {"clean_acc": correct(x), "robust_acc_pgd": correct(x_adv)}

  return jax.jit(evaluate_batch)


def adversarial_examples(config: ml_collections.ConfigDict):
  """jit((classifier params, denoiser params, x, y, key) -> (x_dwbox, purified [B, ...])): the DW-box
  adversarial images and their purification under the attacked keys (for figures)."""
  logits = defended_logits(config)
  _, denoise = models.denoiser(config)
  schedule = models.make_schedule(config)
  t_star = config.diffusion.t_star

  def run(classifier_params, denoiser_params, x, y, key):
    def loss(x_in, k):
      return jnp.sum(models.cross_entropy(logits(classifier_params, denoiser_params, x_in, k), y))
    x_adv = _pgd(config, loss, x, attacks.fixed_keys(key, config.attack.steps))
    keys = jax.random.split(key, purification.num_keys(t_star))
    purified = purification.purify(lambda x_t, t: denoise(denoiser_params, x_t, t), schedule,
                                   x_adv, t_star, keys,
                                   parameterization=config.prior.parameterization,
                                   variance=config.diffusion.variance,
                                   unroll=config.diffusion.unroll)
    return x_adv, purified
  return jax.jit(run)


def batch_key(seed: int, index: int, replicate: int = 0) -> jax.Array:
  """The evaluation key of batch `index` in purification seed `replicate`, the same for every
  model (so per-image results pair across models)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), replicate), index)


def concatenate_batches(per_batch: list[dict[str, Any]]) -> dict[str, np.ndarray]:
  """[{protocol: per-example [B]}] -> {protocol: per-example [N]} on the host."""
  per_batch = parallel.fetch(per_batch)
  return {name: np.concatenate([np.asarray(b[name]) for b in per_batch])
          for name in per_batch[0]}


def mean_over_batches(per_batch: list[dict[str, Any]]) -> dict[str, float]:
  return {name: float(np.mean(values))
          for name, values in concatenate_batches(per_batch).items()}


def denoising_error(config: ml_collections.ConfigDict):
  """jit((denoiser params, x [B, ...], key) -> mean eps-MSE over t = 0, T/8, ..., 7T/8): how well
  a model still denoises plain Gaussian noise (the fidelity ADDT should keep), whatever the
  network predicts."""
  _, denoise = models.denoiser(config)
  schedule = models.make_schedule(config)
  grid = jnp.arange(8) * schedule.num_steps // 8

  def error(denoiser_params, x, key):
    def at(t, k):
      eps = jax.random.normal(k, x.shape, x.dtype)
      t_batch = jnp.full((x.shape[0],), t, jnp.int32)
      x_t = schedules.q_sample(schedule, x, t_batch, eps)
      _, eps_hat = schedules.to_x0_and_eps(schedule, x_t, t_batch,
                                           denoise(denoiser_params, x_t, t_batch),
                                           config.prior.parameterization)
      return jnp.mean(jnp.square(eps_hat - eps))
    return jnp.mean(jax.vmap(at)(grid, jax.random.split(key, grid.shape[0])))
  return jax.jit(error)
