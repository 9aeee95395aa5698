"""The high-precision training recipe, as pure functions.

Per step (the official order): the gradient is clipped to `clip_norm`; a step whose clipped norm
is not finite (or exceeds `skip_norm`, which a clipped norm never does at the defaults) is
skipped; otherwise the gradient passes through the EMA filter (e <- a e + (1 - a) g,
g <- g + lam e; e starts at the first gradient), and Adam (eps = 1e-16) gives the direction,
scaled by the current learning rate.

The learning rate lives in the training state and follows one of three schedules:
  constant
  step      lr_0 * gamma^(step // period), floored at `min_lr`
  adaptive  every `stats_every` steps, the mean cosine similarity between the gradients of
            `stats_batches` consecutive fresh batches of `stats_batch_size` problems (whatever
            the training batch: the 0.9 threshold is the official one for batches of 1024)
            feeds an EMA (weight `stats_ema`, start 1);
            every `period` steps the LR is multiplied or divided by gamma by comparing that EMA with
            `threshold`. `direction` picks which way (see the method README):
              "official_code"     (default) the released code's rule: high similarity, or any
                                  step before `warmup` -> lr * gamma; low similarity -> lr / gamma;
              "decay_when_noisy"  the opposite: low similarity (noise-dominated gradients) ->
                                  lr * gamma, high similarity -> lr / gamma.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
from jax import flatten_util
import jax.numpy as jnp
import ml_collections
import optax

from jaxlab.core import config as config_lib

SCHEDULES = ("constant", "step", "adaptive")
DIRECTIONS = ("decay_when_noisy", "official_code")


class EmaFilterState(NamedTuple):
  ema: optax.Updates
  count: jax.Array


def ema_gradient_filter(decay: float, strength: float) -> optax.GradientTransformation:
  """g <- g + strength * e, with e <- decay e + (1 - decay) g and e_0 = g_0 (grokfast-style)."""

  def init(params):
    return EmaFilterState(jax.tree.map(jnp.zeros_like, params), jnp.zeros([], jnp.int32))

  def update(updates, state, params=None):
    del params
    first = state.count == 0
    ema = jax.tree.map(lambda e, g: jnp.where(first, g, decay * e + (1 - decay) * g),
                       state.ema, updates)
    filtered = jax.tree.map(lambda g, e: g + strength * e, updates, ema)
    return filtered, EmaFilterState(ema, state.count + 1)

  return optax.GradientTransformation(init, update)


def direction_transform(optim: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Clip -> (EMA filter) -> Adam direction. The learning rate is applied by `apply_updates`."""
  parts = [optax.clip_by_global_norm(optim.clip_norm)]
  if optim.ema_strength > 0:
    parts.append(ema_gradient_filter(optim.ema_decay, optim.ema_strength))
  parts.append(optax.scale_by_adam(b1=optim.b1, b2=optim.b2, eps=optim.eps))
  return optax.chain(*parts)


def validate(optim: ml_collections.ConfigDict) -> None:
  config_lib.require_choice(optim, "schedule", SCHEDULES)
  config_lib.require_choice(optim, "direction", DIRECTIONS)
  config_lib.require(optim.lr > 0, "optim.lr", f"must be positive, got {optim.lr}")
  config_lib.require(optim.eps > 0, "optim.eps", f"must be positive, got {optim.eps}")
  config_lib.require(0 < optim.gamma < 1, "optim.gamma", f"must be in (0, 1), got {optim.gamma}")
  config_lib.require(optim.stats_batches >= 2, "optim.stats_batches",
                     "needs at least 2 minibatches to compare")
  config_lib.require(optim.stats_batch_size >= 1, "optim.stats_batch_size",
                     f"must be positive, got {optim.stats_batch_size}")


def init_schedule_state(optim: ml_collections.ConfigDict, dtype) -> dict[str, jax.Array]:
  return {"lr": jnp.asarray(optim.lr, dtype), "similarity_ema": jnp.ones([], dtype),
          "similarity": jnp.ones([], dtype), "decrease": jnp.array(True)}


def gradient_similarity(grad_fn: Callable[[jax.Array], Any], keys: jax.Array) -> jax.Array:
  """Mean cosine similarity between the gradients of consecutive minibatches (one per key)."""
  flat = jax.lax.map(lambda key: flatten_util.ravel_pytree(grad_fn(key))[0], keys)
  # A float32 run would flush 1e-300 to zero; `tiny` is the smallest normal number of any dtype.
  unit = flat / jnp.maximum(jnp.linalg.norm(flat, axis=-1, keepdims=True),
                            jnp.finfo(flat.dtype).tiny)
  return jnp.mean(jnp.sum(unit[1:] * unit[:-1], axis=-1))


def measures_similarity(optim: ml_collections.ConfigDict, step: jax.Array) -> jax.Array:
  """Whether the adaptive schedule measures the gradient similarity after step `step`."""
  return jnp.logical_and(optim.schedule == "adaptive", (step % optim.stats_every) == 0)


def next_schedule_state(optim: ml_collections.ConfigDict, schedule: dict[str, jax.Array],
                        step: jax.Array, similarity: jax.Array) -> dict[str, jax.Array]:
  """The schedule state after optimisation step `step` (0-based) has been taken.

  `similarity` is the gradient similarity measured after this step; it is read only when
  `measures_similarity(optim, step)` (the caller skips the measurement otherwise).
  """
  done = step + 1
  lr = schedule["lr"]
  if optim.schedule == "constant":
    return schedule
  if optim.schedule == "step":
    new_lr = jnp.maximum(optim.lr * optim.gamma ** (done // optim.period), optim.min_lr)
    return {**schedule, "lr": new_lr.astype(lr.dtype)}

  measure = measures_similarity(optim, step)
  similarity = jnp.where(measure, similarity, schedule["similarity"])
  ema = jnp.where(measure,
                  optim.stats_ema * schedule["similarity_ema"]
                  + (1 - optim.stats_ema) * similarity,
                  schedule["similarity_ema"])
  noisy = ema < optim.threshold
  if optim.direction == "official_code":
    decrease = jnp.logical_or(~noisy, step < optim.warmup)
  else:
    decrease = noisy
  decrease = jnp.where(measure, decrease, schedule["decrease"])
  adjust = (done % optim.period) == 0
  changed = jnp.where(decrease, jnp.maximum(lr * optim.gamma, optim.min_lr), lr / optim.gamma)
  return {"lr": jnp.where(adjust, changed, lr), "similarity_ema": ema,
          "similarity": similarity, "decrease": decrease}


def apply_updates(params: Any, direction: Any, lr: jax.Array) -> Any:
  """params - lr * direction."""
  return jax.tree.map(lambda p, u: p - lr.astype(p.dtype) * u, params, direction)


def keep_if(skip: jax.Array, old: Any, new: Any) -> Any:
  """`old` where the step is skipped, else `new` (parameters and optimiser state alike)."""
  return jax.tree.map(lambda o, n: jnp.where(skip, o, n), old, new)


def should_skip(grad_norm: jax.Array, clip_norm: float, skip_norm: float) -> jax.Array:
  """Skip on the norm after clipping, as the official code does: in practice only non-finite
  gradients are skipped (a clipped norm is at most `clip_norm`)."""
  clipped = jnp.minimum(grad_norm, clip_norm)
  return jnp.logical_or(~jnp.isfinite(grad_norm), clipped > skip_norm)
