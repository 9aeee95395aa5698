"""L-inf attacks: PGD with expectation over transformation (EOT), FGSM, the soft-ball attack.

`loss(x, key)` is the attacker's objective for a batch (e.g. the summed cross-entropy of a
classifier behind a stochastic defence drawn with `key`, as in diffusion_purification). Each of
the `num_steps` PGD steps averages the gradient over the EOT keys of that step (vmapped), takes a
signed step and projects back onto the eps-ball around the clean input and the valid range
`bounds = (low, high)` (diffusion_purification's images: (-1.0, 1.0)). `pgd_linf` runs the steps
as one `lax.scan`; `pgd_linf_host_loop` runs the same steps from Python, one jitted `pgd_step`
call each: XLA:CPU runs a convolutional purifier's gradient 2-3x slower inside a while loop's body
than as a program of its own (a UNet purifier, one DW-box step: 3.6 s in the scan, 1.6 s alone),
and a PGD step costs far more than its dispatch.

Stochastic white-box: fresh keys for every step and EOT draw. DW-box: the same key everywhere
(EOT = 1), i.e. the attacked defence is the fixed function the evaluation will use.

`random_start` (a PRNG key) starts PGD at a uniform draw from the eps-ball (Madry et al.), clipped
to `bounds`; None starts at the clean input. `fgsm` is one signed step of size eps.

`soft_ball_linf` is the Wasserstein (UDR) attack of Bui et al. (ICLR 2022), used by SR-WDRO: the
hard projection onto the eps-ball is replaced by a pull of strength `lam` towards it, so the
perturbation may leave the ball by an amount the adversary pays for in the transport cost. With
lam = 1 (and tau = step_size) the pull is the projection, i.e. PGD.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

# loss(x [B, ...], key) -> scalar.
LossFn = Callable[[jax.Array, jax.Array], jax.Array]
# loss(x [B, ...]) -> scalar: a deterministic objective (the soft-ball attack).
KeylessLossFn = Callable[[jax.Array], jax.Array]
# (low, high): the valid range of an input; floats, or arrays that broadcast against x.
Bounds = tuple[float, float]


def pgd_linf(loss: LossFn, x: jax.Array, keys: jax.Array, *, epsilon: float, step_size: float,
             bounds: Bounds, random_start: jax.Array | None = None) -> jax.Array:
  """PGD (L-inf) with EOT.

  Args:
    loss: the objective the attacker ascends, `loss(x, key) -> scalar`.
    x: clean inputs [B, ...], inside `bounds`.
    keys: PRNG keys [num_steps, eot]: row i is averaged over in step i.
    epsilon: the L-inf budget.
    step_size: the size of each signed step.
    bounds: (low, high), the valid range of an input.
    random_start: None (start at x) or a PRNG key (start at `random_start_point`).

  Returns:
    The adversarial inputs [B, ...], within epsilon of x and inside `bounds`.
  """
  return pgd_linf_iterates(loss, x, keys, epsilon=epsilon, step_size=step_size, bounds=bounds,
                           record_at=(keys.shape[0],), random_start=random_start)[0]


def pgd_linf_iterates(loss: LossFn, x: jax.Array, keys: jax.Array, *, epsilon: float,
                      step_size: float, bounds: Bounds, record_at: Sequence[int],
                      random_start: jax.Array | None = None) -> jax.Array:
  """The adversarial inputs after each of `record_at` steps: [len(record_at), B, ...].

  One run of num_steps = keys.shape[0] steps, so PGD-20's iterate is the 20th of PGD-100 (the same
  step size, keys and start), and a convergence check costs only the longer attack. `record_at`
  is static, in 1..num_steps; the other arguments are those of `pgd_linf`.
  """
  _check_record_at(record_at, keys.shape[0])
  x_start = x if random_start is None else random_start_point(random_start, x, epsilon, bounds)

  def step(x_adv, step_keys):
    x_adv = pgd_step(loss, x_adv, x, step_keys, epsilon=epsilon, step_size=step_size,
                     bounds=bounds)
    return x_adv, x_adv

  _, iterates = jax.lax.scan(step, x_start, keys)
  return iterates[jnp.asarray(record_at) - 1]


def pgd_step(loss: LossFn, x_adv: jax.Array, x: jax.Array, step_keys: jax.Array, *,
             epsilon: float, step_size: float, bounds: Bounds) -> jax.Array:
  """One PGD step from x_adv [B, ...]: the sign of the gradient averaged over `step_keys` [eot]
  (vmapped), then the projection onto the eps-ball around the clean x [B, ...] and onto
  `bounds`. Returns the next x_adv [B, ...]."""
  direction = jnp.mean(jax.vmap(lambda key: jax.grad(loss)(x_adv, key))(step_keys), axis=0)
  x_adv = x_adv + step_size * jnp.sign(direction)
  x_adv = jnp.clip(x_adv, x - epsilon, x + epsilon)
  low, high = bounds
  return jnp.clip(x_adv, low, high)


def pgd_linf_host_loop(step: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
                       x: jax.Array, keys: jax.Array, *, record_at: Sequence[int]) -> jax.Array:
  """`pgd_linf_iterates` with the loop in Python: `step(x_adv, x, step_keys)` is the caller's
  jitted `pgd_step` (its loss, budget and bounds bound), called once per row of `keys`."""
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


def random_start_point(key: jax.Array, x: jax.Array, epsilon: float,
                       bounds: Bounds) -> jax.Array:
  """x [B, ...] plus U(-eps, eps) noise drawn with `key`, clipped to `bounds`: [B, ...]."""
  noise = jax.random.uniform(key, x.shape, x.dtype, -epsilon, epsilon)
  low, high = bounds
  return jnp.clip(x + noise, low, high)


def fgsm(loss: LossFn, x: jax.Array, key: jax.Array, *, epsilon: float,
         bounds: Bounds) -> jax.Array:
  """FGSM: x [B, ...] + eps * sign(grad_x loss(x, key)), clipped to `bounds`: [B, ...]."""
  low, high = bounds
  return jnp.clip(x + epsilon * jnp.sign(jax.grad(loss)(x, key)), low, high)


def soft_ball_linf(loss: KeylessLossFn, x: jax.Array, key: jax.Array | None, *, epsilon: float,
                   step_size: float, num_steps: int, lam: float | jax.Array, bounds: Bounds,
                   tau: float | None = None, random_start: bool = True) -> jax.Array:
  """The Wasserstein "soft-ball" (UDR) attack (Bui et al., ICLR 2022; SR-WDRO's inner step).

  delta starts at U(-eps, eps) (drawn with `key`; 0 without `random_start`), clipped so that
  x + delta is inside `bounds`. Each of the `num_steps` steps (one `lax.scan`):

    delta += step_size * sign(grad_delta loss(x + delta))
    delta_j -= lam * (step_size / tau) * (delta_j - sign(delta_j) * eps)   where |delta_j| > eps
    delta = clip(x + delta, bounds) - x

  Coordinates outside the ball are pulled back by the fraction lam * step_size / tau of their
  excess: lam = 1 with tau = step_size projects (PGD); a smaller lam lets the attack leave the
  ball. Jittable, and vmappable over `lam` (may be traced) and the other array arguments.

  Args:
    loss: the objective the attacker ascends, `loss(x_adv) -> scalar` (no key).
    x: clean inputs [B, ...], inside `bounds`.
    key: the PRNG key of the random start; unused (may be None) without `random_start`.
    epsilon: the radius of the soft ball.
    step_size: the size of each signed step.
    num_steps: the number of steps (static).
    lam: the strength of the pull towards the ball (a scalar).
    bounds: (low, high), the valid range of an input.
    tau: the temperature of the pull; None means step_size.
    random_start: start at a uniform draw from the eps-ball (static) or at x.

  Returns:
    The adversarial inputs x + delta [B, ...], inside `bounds`.
  """
  low, high = bounds
  if random_start:
    if key is None:
      raise ValueError("soft_ball_linf needs a key for its random start")
    delta = jax.random.uniform(key, x.shape, x.dtype, -epsilon, epsilon)
  else:
    delta = jnp.zeros_like(x)
  delta = jnp.clip(x + delta, low, high) - x
  grad_delta = jax.grad(lambda d: loss(x + d))
  # tau = None is step_size: a pull of exactly lam, also when step_size is 0 (no 0 / 0).
  pull = lam if tau is None else lam * (step_size / tau)

  def step(delta, _):
    delta = delta + step_size * jnp.sign(grad_delta(delta))
    excess = delta - jnp.sign(delta) * epsilon
    delta = jnp.where(jnp.abs(delta) > epsilon, delta - pull * excess, delta)
    return jnp.clip(x + delta, low, high) - x, None

  delta, _ = jax.lax.scan(step, delta, None, length=num_steps)
  return x + delta
