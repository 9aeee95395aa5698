"""Evaluating a gradient module: one-step error, and the error of iterating it as an optimiser."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxlab.methods.precision_ls import tasks

GradientFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def model_gradient(apply: Callable[..., jax.Array], params: Any) -> GradientFn:
  """(A, b, x) -> the model's estimate of A^T (A x - b) / n (the `gradient` task's read-out)."""
  def gradient(a, b, x):
    return apply(params, tasks.gradient_tokens(a, b, x), last_only=True)[:, -1]
  return gradient


def exact_gradient(a: jax.Array, b: jax.Array, x: jax.Array) -> jax.Array:
  return tasks.ls_gradient(a, b, x)


def gradient_mse(gradient: GradientFn, problems: dict[str, jax.Array]) -> jax.Array:
  """Mean squared error of one gradient evaluation at x_init."""
  a, b, x = problems["A"], problems["b"], problems["x_init"]
  return jnp.mean(jnp.square(gradient(a, b, x) - tasks.ls_gradient(a, b, x)))


def iterate(gradient: GradientFn, problems: dict[str, jax.Array], *, steps: int,
            step_size: float) -> jax.Array:
  """MSE(x_k, x*) for k = 0..steps of x_{k+1} = x_k - step_size * gradient(A, b, x_k).

  Returns a [steps + 1] curve, the mean over problems and coordinates at each iterate.
  """
  a, b, x_star = problems["A"], problems["b"], problems["x_star"]

  def body(x, _):
    x_next = x - step_size * gradient(a, b, x)
    return x_next, jnp.mean(jnp.square(x_next - x_star))

  x0 = problems["x_init"]
  _, curve = jax.lax.scan(body, x0, None, length=steps)
  return jnp.concatenate([jnp.mean(jnp.square(x0 - x_star))[None], curve])
