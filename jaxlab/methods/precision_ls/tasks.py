"""The in-context tasks: how a least-squares problem (or a random sequence) becomes model inputs and
targets, and which outputs the loss reads.

Least squares (d unknowns, n equations, `b = A x*`):
  gradient  tokens [x, 0], [a_1, b_1], ..., [a_n, b_n]; target g = A^T (A x - b) / n at the last
            position (the 1/n scaling is the official code's).
  kstep     tokens [a_1, b_1], ..., [a_n, b_n], [x_init, 0]; target x_k after k GD steps of size
            `step` on the 1/n-scaled gradient.
  e2e       tokens [a_1, b_1], ..., [a_n, b_n]; target x* at the last position.
Primitives (u: [L, D] standard normal; targets at every position):
  identity u;  square u^2;  multiply u[:, :D/2] * u[:, D/2:];  read (row j := row i for a fixed
  pair i <= j);  linear u c for a fixed c = 3 N(0, I).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.data import least_squares

Batch = dict[str, jax.Array]
LS_TASKS = ("gradient", "kstep", "e2e")
PRIMITIVES = ("identity", "square", "multiply", "read", "linear")
TASKS = LS_TASKS + PRIMITIVES


def ls_gradient(a: jax.Array, b: jax.Array, x: jax.Array) -> jax.Array:
  """A^T (A x - b) / n, batched: a [B, n, d], b [B, n], x [B, d] -> [B, d]."""
  residual = jnp.einsum("bnd,bd->bn", a, x) - b
  return jnp.einsum("bnd,bn->bd", a, residual) / a.shape[1]


def gd_steps(a: jax.Array, b: jax.Array, x: jax.Array, steps: int, step_size: float) -> jax.Array:
  """`steps` iterations of x <- x - step_size * ls_gradient(a, b, x)."""
  return jax.lax.fori_loop(0, steps, lambda _, x: x - step_size * ls_gradient(a, b, x), x)


def gradient_tokens(a: jax.Array, b: jax.Array, x: jax.Array) -> jax.Array:
  """[B, n + 1, d + 1]: [x, 0] then [a_i, b_i]."""
  first = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=-1)[:, None]
  return jnp.concatenate([first, jnp.concatenate([a, b[..., None]], axis=-1)], axis=1)


@dataclasses.dataclass(frozen=True)
class Task:
  """A task: its data source, shapes, and the map from a raw batch to (inputs, targets)."""
  name: str
  source: str                      # "problems" or "sequences"
  seq_len: int
  d_in: int
  d_out: int
  make: Callable[[Batch], tuple[jax.Array, jax.Array]]
  last_position_only: bool

  def prediction(self, outputs: jax.Array) -> jax.Array:
    """Model outputs [B, L, d_out] -> what the loss compares with the targets."""
    return outputs[:, -1] if self.last_position_only else outputs

  def sample(self, key: jax.Array, count: int, dtype) -> Batch:
    """Fresh raw samples from the task's distribution (same as the dataset's)."""
    if self.source == "problems":
      d, n = self.d_in - 1, self.seq_len - (0 if self.name == "e2e" else 1)
      return least_squares.sample_problems(key, count, n, d, dtype=dtype)
    return least_squares.sample_sequences(key, count, self.seq_len, self.d_in, dtype=dtype)


def make_task(name: str, *, d: int = 5, n: int = 20, length: int = 40, width: int = 20,
              k_steps: int = 4, step_size: float = 0.5, seed: int = 0) -> Task:
  """The task `name` (one of TASKS) at the given sizes."""
  if name == "gradient":
    return Task(name, "problems", n + 1, d + 1, d,
                lambda p: (gradient_tokens(p["A"], p["b"], p["x_init"]),
                           ls_gradient(p["A"], p["b"], p["x_init"])), True)
  if name == "kstep":
    def kstep(p):
      tokens = jnp.roll(gradient_tokens(p["A"], p["b"], p["x_init"]), -1, axis=1)
      return tokens, gd_steps(p["A"], p["b"], p["x_init"], k_steps, step_size)
    return Task(name, "problems", n + 1, d + 1, d, kstep, True)
  if name == "e2e":
    return Task(name, "problems", n, d + 1, d,
                lambda p: (jnp.concatenate([p["A"], p["b"][..., None]], -1), p["x_star"]), True)
  if name in PRIMITIVES:
    if name == "multiply" and width % 2:
      raise ValueError(f"the multiply primitive needs an even width, got {width}")
    rng = np.random.default_rng(seed)
    read_from, read_to = sorted(rng.choice(length, size=2, replace=True).tolist())
    coefficients = 3.0 * rng.standard_normal(width)
    targets = {
        "identity": lambda u: u,
        "square": lambda u: u * u,
        "multiply": lambda u: u[..., : width // 2] * u[..., width // 2:],
        "read": lambda u: u.at[:, read_to].set(u[:, read_from]),
        "linear": lambda u: (u @ jnp.asarray(coefficients, u.dtype))[..., None],
    }[name]
    d_out = {"multiply": width // 2, "linear": 1}.get(name, width)
    return Task(name, "sequences", length, width, d_out, lambda s: (s["u"], targets(s["u"])),
                False)
  raise ValueError(f"unknown task {name!r}; choose one of {TASKS}")
