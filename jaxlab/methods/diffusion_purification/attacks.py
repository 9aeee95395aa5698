"""PGD (L-inf) through a stochastic defence, with expectation over transformation (EOT).

`loss(x, key)` is the attacker's objective for a batch (the summed cross-entropy of the
classifier after a purification drawn with `key`). Each of the `num_steps` steps averages the
gradient over the EOT keys of that step (vmapped), takes a signed step and projects back onto the
eps-ball around the clean input and the valid range [-1, 1]. `pgd_linf` runs the steps as one
`lax.scan`; `pgd_linf_host_loop` runs the same steps from Python, one jitted `pgd_step` call each:
XLA:CPU runs a convolutional purifier's gradient 2-3x slower inside a while loop's body than as
a program of its own (a UNet purifier, one DW-box step: 3.6 s in the scan, 1.6 s alone), and a
PGD step costs far more than its dispatch.

Stochastic white-box: fresh keys for every step and EOT draw. DW-box: the same key everywhere
(EOT = 1), i.e. the attacked defence is the fixed function the evaluation will use.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def pgd_linf(loss: LossFn, x: jax.Array, keys: jax.Array, *, epsilon: float,
             step_size: float) -> jax.Array:
  """x [B, ...] clean inputs; keys [num_steps, eot] PRNG keys -> adversarial inputs [B, ...]."""
  return pgd_linf_iterates(loss, x, keys, epsilon=epsilon, step_size=step_size,
                           record_at=(keys.shape[0],))[0]


def pgd_linf_iterates(loss: LossFn, x: jax.Array, keys: jax.Array, *, epsilon: float,
                      step_size: float, record_at: Sequence[int]) -> jax.Array:
  """The adversarial inputs after each of `record_at` steps (static, in 1..num_steps): [len,
  B, ...]. One run of num_steps = keys.shape[0] steps, so PGD-20's iterate is the 20th of PGD-100
  (the same step size and keys), and a convergence check costs only the longer attack."""
  _check_record_at(record_at, keys.shape[0])

  def step(x_adv, step_keys):
    x_adv = pgd_step(loss, x_adv, x, step_keys, epsilon=epsilon, step_size=step_size)
    return x_adv, x_adv

  _, iterates = jax.lax.scan(step, x, keys)
  return iterates[jnp.asarray(record_at) - 1]


def pgd_step(loss: LossFn, x_adv: jax.Array, x: jax.Array, step_keys: jax.Array, *,
             epsilon: float, step_size: float) -> jax.Array:
  """One step from x_adv: the sign of the gradient averaged over `step_keys` [eot] (vmapped),
  then the projection onto the eps-ball around the clean x and onto [-1, 1]."""
  direction = jnp.mean(jax.vmap(lambda key: jax.grad(loss)(x_adv, key))(step_keys), axis=0)
  x_adv = x_adv + step_size * jnp.sign(direction)
  x_adv = jnp.clip(x_adv, x - epsilon, x + epsilon)
  return jnp.clip(x_adv, -1.0, 1.0)


def pgd_linf_host_loop(step: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
                       x: jax.Array, keys: jax.Array, *, record_at: Sequence[int]) -> jax.Array:
  """`pgd_linf_iterates` with the loop in Python: `step(x_adv, x, step_keys)` is the caller's
  jitted `pgd_step` (its loss and budget bound), called once per row of `keys`."""
  _check_record_at(record_at, keys.shape[0])
  x_adv, recorded = x, {}
  for index in range(keys.shape[0]):
    x_adv = step(x_adv, x, keys[index])
    if index + 1 in record_at:
      recorded[index + 1] = x_adv
  return jnp.stack([recorded[s] for s in record_at])


def _check_record_at(record_at: Sequence[int], num_steps: int) -> None:
  if not record_at or not all(1 <= s <= num_steps for s in record_at):
    raise ValueError(f"record_at must name steps in 1..{num_steps}, got {tuple(record_at)}")


def stochastic_keys(key: jax.Array, num_steps: int, eot: int) -> jax.Array:
  """Fresh keys for every step and EOT draw: [num_steps, eot]."""
  return jax.random.split(key, num_steps * eot).reshape(num_steps, eot)


def fixed_keys(key: jax.Array, num_steps: int) -> jax.Array:
  """The DW-box schedule: one key reused by every step (EOT = 1): [num_steps, 1]."""
  return jnp.broadcast_to(key, (num_steps, 1))
