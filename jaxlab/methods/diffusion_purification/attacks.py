"""PGD (L-inf) through a stochastic defence, with expectation over transformation (EOT).

`loss(x, key)` is the attacker's objective for a batch (the summed cross-entropy of the
classifier after a purification drawn with `key`). Each of the `num_steps` steps averages the
gradient over the EOT keys of that step (vmapped), takes a signed step and projects back onto the
eps-ball around the clean input and the valid range [-1, 1]. The steps are one `lax.scan`.

Stochastic white-box: fresh keys for every step and EOT draw. DW-box: the same key everywhere
(EOT = 1), i.e. the attacked defence is the fixed function the evaluation will use.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def pgd_linf(loss: LossFn, x: jax.Array, keys: jax.Array, *, epsilon: float,
             step_size: float) -> jax.Array:
  """x [B, ...] clean inputs; keys [num_steps, eot] PRNG keys -> adversarial inputs [B, ...]."""
  gradient = jax.grad(loss)

  def step(x_adv, step_keys):
    direction = jnp.mean(jax.vmap(lambda key: gradient(x_adv, key))(step_keys), axis=0)
    x_adv = x_adv + step_size * jnp.sign(direction)
    x_adv = jnp.clip(x_adv, x - epsilon, x + epsilon)
    return jnp.clip(x_adv, -1.0, 1.0), None

  x_adv, _ = jax.lax.scan(step, x, keys)
  return x_adv


def stochastic_keys(key: jax.Array, num_steps: int, eot: int) -> jax.Array:
  """Fresh keys for every step and EOT draw: [num_steps, eot]."""
  return jax.random.split(key, num_steps * eot).reshape(num_steps, eot)


def fixed_keys(key: jax.Array, num_steps: int) -> jax.Array:
  """The DW-box schedule: one key reused by every step (EOT = 1): [num_steps, 1]."""
  return jnp.broadcast_to(key, (num_steps, 1))
