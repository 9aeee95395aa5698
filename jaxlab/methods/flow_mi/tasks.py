"""The "Beyond Normal" mutual-information benchmark (Czyż et al., NeurIPS 2023), natively in JAX.

A task is a joint distribution of (X, Y) with its mutual information known in closed form (nats)
and a pure-JAX sampler `sample(key, n) -> (x [n, dim_x], y [n, dim_y])` that jits for a static n.
Samples are float32, or float64 when x64 is enabled (inside `jax.enable_x64(True)`).

Base distributions:
  gaussian   joint normal [x, y] with unit variances: `normal-1x1` (rho 0.75), `dense-dxd` (every
             off-diagonal 0.5), `sparse-dxd` (pairs (x_0, y_0), (x_1, y_1) with correlation 0.8,
             the rest independent) and the large-MI `gaussian-dxd-rho*` (y = rho x + noise).
  student    multivariate Student-t with identity dispersion: [x, y] = z / sqrt(w / df),
             z ~ N(0, I), w ~ chi2(df) shared by both sides (so X and Y are uncorrelated but
             dependent).
  uniform    X ~ U(0, 1), Y = X + U(-eps, eps).
Transforms: mutual information is invariant under injective maps applied to X and to Y
separately, so each transformed task keeps its base task's ground truth while breaking the
Gaussian (CCA) estimator: bimodal, wiggly, half-cube, normal-cdf, spiral, asinh, swiss roll, cube
and exp. Nothing here is copied from the `bmi` package; the maps are written from their formulas.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

Sampler = Callable[[jax.Array, int], tuple[jax.Array, jax.Array]]
Transform = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Task:
  """One benchmark task: a sampler of (x, y) pairs and their analytic mutual information."""
  name: str
  dim_x: int
  dim_y: int
  mutual_information: float   # nats
  sample: Sampler             # (key, n) -> x [n, dim_x], y [n, dim_y]
  family: str                 # the base distribution or the transform, for grouping in plots


# --------------------------------------------------------------------------------------------
# Ground truth (numpy/scipy: computed at import, so no JAX backend starts).


def gaussian_mi(covariance: np.ndarray, dim_x: int) -> float:
  """I(X; Y) of a joint normal [x, y]: 0.5 (logdet S_xx + logdet S_yy - logdet S)."""
  covariance = np.asarray(covariance, np.float64)
  logdet = lambda matrix: np.linalg.slogdet(matrix)[1]
  return 0.5 * float(logdet(covariance[:dim_x, :dim_x]) + logdet(covariance[dim_x:, dim_x:])
                     - logdet(covariance))


def student_t_mi(dim_x: int, dim_y: int, df: float) -> float:
  """I(X; Y) of a Student-t [x, y] with identity dispersion (all of it comes from the shared w).

  I = h(X) + h(Y) - h(X, Y), and a d-dimensional standard t with df nu has entropy
  log Gamma(nu/2) - log Gamma((nu+d)/2) + (d/2) log(nu pi) + ((nu+d)/2) (psi((nu+d)/2) - psi(nu/2));
  the log(nu pi) terms cancel.
  """
  def entropy_part(d: int) -> float:   # the entropy above without its (d/2) log(nu pi) term
    half, half_total = df / 2, (df + d) / 2
    return (special.gammaln(half) - special.gammaln(half_total)
            + half_total * (special.digamma(half_total) - special.digamma(half)))

  return float(entropy_part(dim_x) + entropy_part(dim_y) - entropy_part(dim_x + dim_y))


def additive_uniform_mi(epsilon: float) -> float:
  """I(X; X + N), X ~ U(0, 1), N ~ U(-eps, eps): h(Y) - log(2 eps) for Y's trapezoid density."""
  return epsilon - math.log(2 * epsilon) if epsilon <= 0.5 else 1 / (4 * epsilon)


def dense_covariance(dim_x: int, dim_y: int, off_diagonal: float = 0.5) -> np.ndarray:
  """Unit variances and one correlation between every pair of coordinates of [x, y]."""
  dim = dim_x + dim_y
  return (1 - off_diagonal) * np.eye(dim) + off_diagonal * np.ones((dim, dim))


def sparse_covariance(dim_x: int, dim_y: int, correlation: float = 0.8,
                      pairs: int = 2) -> np.ndarray:
  """Unit variances; only (x_i, y_i) for i < pairs are correlated."""
  covariance = np.eye(dim_x + dim_y)
  for i in range(pairs):
    covariance[i, dim_x + i] = covariance[dim_x + i, i] = correlation
  return covariance


def paired_covariance(dim: int, rho: float) -> np.ndarray:
  """[[I, rho I], [rho I, I]]: y = rho x + sqrt(1 - rho^2) noise; MI = -(dim/2) log(1 - rho^2)."""
  identity = np.eye(dim)
  return np.block([[identity, rho * identity], [rho * identity, identity]])


# --------------------------------------------------------------------------------------------
# Base samplers.


def gaussian_sampler(covariance: np.ndarray, dim_x: int) -> Sampler:
  """[x, y] = L z with L L^T = covariance, z ~ N(0, I)."""
  cholesky_t = np.linalg.cholesky(np.asarray(covariance, np.float64)).T

  def sample(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    z = jax.random.normal(key, (n, cholesky_t.shape[0]))
    joint = z @ jnp.asarray(cholesky_t, z.dtype)
    return joint[:, :dim_x], joint[:, dim_x:]

  return sample


def student_sampler(dim_x: int, dim_y: int, df: int) -> Sampler:
  """[x, y] = z / sqrt(w / df), z ~ N(0, I), w ~ chi2(df) drawn as a sum of df squared normals.

  The sum (df is an integer here) compiles in a third of the time of `jax.random.chisquare`,
  whose rejection-sampling loop alone took ~1.5 s of XLA compile per task on a laptop CPU.
  """
  def sample(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    key_z, key_w = jax.random.split(key)
    z = jax.random.normal(key_z, (n, dim_x + dim_y))
    w = jnp.sum(jax.random.normal(key_w, (n, df), z.dtype) ** 2, axis=1, keepdims=True)
    # A zero w would turn the sample into inf; the floor is far below any w a draw can reach.
    w = jnp.maximum(w, jnp.finfo(z.dtype).tiny)
    joint = z * jnp.sqrt(df / w)
    return joint[:, :dim_x], joint[:, dim_x:]

  return sample


def additive_uniform_sampler(epsilon: float) -> Sampler:
  """X ~ U(0, 1), Y = X + N, N ~ U(-eps, eps)."""
  def sample(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    key_x, key_noise = jax.random.split(key)
    x = jax.random.uniform(key_x, (n, 1))
    noise = jax.random.uniform(key_noise, (n, 1), x.dtype, minval=-epsilon, maxval=epsilon)
    return x, x + noise

  return sample


def transformed(base: Sampler, transform_x: Transform,
                transform_y: Transform | None = None) -> Sampler:
  """Samples of `base` with x and y mapped (y through `transform_x` too unless given)."""
  transform_y = transform_x if transform_y is None else transform_y

  def sample(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    x, y = base(key, n)
    return transform_x(x), transform_y(y)

  return sample


# --------------------------------------------------------------------------------------------
# MI-preserving transforms (elementwise unless said otherwise; all strictly monotone or injective).


def half_cube(x: jax.Array) -> jax.Array:
  """x |x|^(1/2): strictly increasing, with a heavier tail than x."""
  return x * jnp.sqrt(jnp.abs(x))


def normal_cdf(x: jax.Array) -> jax.Array:
  """Phi(x): squashes each coordinate into (0, 1)."""
  return jax.scipy.special.ndtr(x)


def cube(x: jax.Array) -> jax.Array:
  return x ** 3


def wiggly_x(x: jax.Array) -> jax.Array:
  """x + 0.4 sin x + 0.2 sin(1.7 x + 1) + 0.03 sin(3.3 x - 2.5).

  Strictly increasing: the derivative is at least 1 - 0.4 - 0.2 * 1.7 - 0.03 * 3.3 = 0.161.
  """
  return x + 0.4 * jnp.sin(x) + 0.2 * jnp.sin(1.7 * x + 1) + 0.03 * jnp.sin(3.3 * x - 2.5)


def wiggly_y(y: jax.Array) -> jax.Array:
  """y - 0.4 sin(0.4 y) + 0.17 sin(1.3 y + 3.5) + 0.02 sin(4.3 y - 2.5), a different wiggle.

  Strictly increasing: the derivative is at least 1 - 0.16 - 0.17 * 1.3 - 0.02 * 4.3 = 0.533.
  """
  return (y - 0.4 * jnp.sin(0.4 * y) + 0.17 * jnp.sin(1.3 * y + 3.5)
          + 0.02 * jnp.sin(4.3 * y - 2.5))


def spiral(x: jax.Array, plane: tuple[int, int], speed: float) -> jax.Array:
  """exp(speed |x|^2 A) x for the so(n) generator A of `plane`: a rotation of that plane by an
  angle growing with the norm. It keeps |x|, so rotating back by the same angle inverts it."""
  i, j = plane
  angle = speed * jnp.sum(x * x, axis=-1)
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  x_i, x_j = x[..., i], x[..., j]
  return x.at[..., i].set(cos * x_i - sin * x_j).at[..., j].set(sin * x_i + cos * x_j)


def swissroll(x: jax.Array) -> jax.Array:
  """A 1-D standard normal [n, 1] rolled onto a 2-D spiral [n, 2]: u = Phi(x), t = 1.5 pi (1 + 2u),
  (t cos t, t sin t) / 21. Injective: the radius t / 21 grows strictly with x."""
  t = 1.5 * math.pi * (1 + 2 * jax.scipy.special.ndtr(x[..., 0]))
  return jnp.stack([t * jnp.cos(t), t * jnp.sin(t)], axis=-1) / 21


@dataclasses.dataclass(frozen=True)
class Mixture1D:
  """A 1-D Gaussian mixture sum_k w_k N(mean_k, scale_k^2)."""
  weights: tuple[float, ...]
  means: tuple[float, ...]
  scales: tuple[float, ...]

  def tail_mass(self, t: jax.Array, upper: jax.Array | bool) -> jax.Array:
    """P(T <= t), or P(T > t) where `upper`; each tail summed directly, so it keeps its
    relative precision far out (1 - cdf would round to zero)."""
    sign = jnp.where(upper, -1.0, 1.0).astype(t.dtype)
    return sum(w * jax.scipy.special.ndtr(sign * (t - m) / s)
               for w, m, s in zip(self.weights, self.means, self.scales))

  def quantile_of_normal(self, x: jax.Array) -> jax.Array:
    """F^{-1}(Phi(x)): maps N(0, 1) values onto the mixture, strictly increasing in x.

    Bisection on the tail on x's side: Phi(-|x|) is the smaller of Phi(x) and 1 - Phi(x), so
    neither tail collapses onto the bracket's end in float32. The bracket holds every quantile
    down to 1e-300 (40 scales out); nmant + 8 halvings shrink its ~50 width to the dtype's ulp.
    """
    upper = x > 0
    target = jax.scipy.special.ndtr(-jnp.abs(x))
    low = jnp.full_like(x, min(m - 40 * s for m, s in zip(self.means, self.scales)))
    high = jnp.full_like(x, max(m + 40 * s for m, s in zip(self.means, self.scales)))

    def halve(_, bracket):
      low, high = bracket
      middle = 0.5 * (low + high)
      mass = self.tail_mass(middle, upper)
      # The quantile lies right of `middle` if too little mass lies below it (lower tail) or
      # too much above it (upper tail).
      right = jnp.where(upper, mass > target, mass < target)
      return jnp.where(right, middle, low), jnp.where(right, high, middle)

    iterations = jnp.finfo(x.dtype).nmant + 8
    low, high = jax.lax.fori_loop(0, iterations, halve, (low, high))
    return 0.5 * (low + high)


BIMODAL_X = Mixture1D(weights=(0.5, 0.5), means=(-1.5, 1.5), scales=(0.5, 0.5))
BIMODAL_Y = Mixture1D(weights=(0.3, 0.7), means=(-1.0, 1.5), scales=(0.4, 0.6))


# --------------------------------------------------------------------------------------------
# The task list.


def _gaussian_task(name: str, covariance: np.ndarray, dim_x: int) -> Task:
  covariance = np.asarray(covariance, np.float64)
  return Task(name, dim_x, covariance.shape[0] - dim_x, gaussian_mi(covariance, dim_x),
              gaussian_sampler(covariance, dim_x), "gaussian")


def _student_task(dim: int, df: int) -> Task:
  return Task(f"student-{dim}x{dim}-df{df}", dim, dim, student_t_mi(dim, dim, df),
              student_sampler(dim, dim, df), "student")


def _additive_uniform_task(epsilon: float) -> Task:
  return Task(f"additive-uniform-1x1-{epsilon:g}", 1, 1, additive_uniform_mi(epsilon),
              additive_uniform_sampler(epsilon), "uniform")


def _transformed_task(name: str, family: str, base: Task, transform_x: Transform,
                      transform_y: Transform | None = None, dim_x: int | None = None) -> Task:
  """`base` pushed through injective maps: same MI, new marginals."""
  return Task(name, base.dim_x if dim_x is None else dim_x, base.dim_y, base.mutual_information,
              transformed(base.sample, transform_x, transform_y), family)


def _build_tasks() -> tuple[list[Task], list[Task], list[Task]]:
  normal = _gaussian_task("normal-1x1", [[1.0, 0.75], [0.75, 1.0]], 1)
  sparse_3 = _gaussian_task("sparse-3x3", sparse_covariance(3, 3), 3)
  sparse_5 = _gaussian_task("sparse-5x5", sparse_covariance(5, 5), 5)
  student_1 = _student_task(1, 1)
  benchmark = [
      normal,
      _transformed_task("bimodal-1x1", "bimodal", normal, BIMODAL_X.quantile_of_normal,
                        BIMODAL_Y.quantile_of_normal),
      _transformed_task("wiggly-1x1", "wiggly", normal, wiggly_x, wiggly_y),
      _additive_uniform_task(0.1),
      _additive_uniform_task(0.75),
      *[_gaussian_task(f"dense-{d}x{d}", dense_covariance(d, d), d) for d in (2, 3, 5, 25)],
      _gaussian_task("sparse-2x2", sparse_covariance(2, 2), 2),
      sparse_3,
      sparse_5,
      student_1,
      *[_student_task(d, 2) for d in (2, 3, 5)],
      _transformed_task("half-cube-sparse-5x5", "half-cube", sparse_5, half_cube),
      _transformed_task("normal-cdf-sparse-5x5", "normal-cdf", sparse_5, normal_cdf),
      # speed = 1 / dim keeps the rotation angle |x|^2 / dim around one radian on average.
      _transformed_task("spiral-sparse-3x3", "spiral", sparse_3,
                        lambda x: spiral(x, (0, 1), 1 / 3), lambda y: spiral(y, (1, 2), 1 / 3)),
      _transformed_task("asinh-student-1x1-df1", "asinh", student_1, jnp.arcsinh),
      _transformed_task("swissroll-2x1", "swissroll", normal, swissroll, lambda y: y, dim_x=2),
  ]
  large = [_gaussian_task(f"gaussian-{d}x{d}-rho{rho:g}", paired_covariance(d, rho), d)
           for d in (5, 10) for rho in (0.95, 0.99)]
  by_name = {task.name: task for task in large}
  transformed_large = [
      _transformed_task(f"{prefix}-gaussian-{d}x{d}-rho0.95", prefix,
                        by_name[f"gaussian-{d}x{d}-rho0.95"], transform)
      for prefix, transform in (("cube", cube), ("exp", jnp.exp)) for d in (5, 10)]
  return benchmark, large, transformed_large


_BENCHMARK, _LARGE, _TRANSFORMED_LARGE = _build_tasks()
BENCHMARK_TASKS: tuple[str, ...] = tuple(task.name for task in _BENCHMARK)
LARGE_MI_TASKS: tuple[str, ...] = tuple(task.name for task in _LARGE)
TRANSFORMED_LARGE_MI_TASKS: tuple[str, ...] = tuple(task.name for task in _TRANSFORMED_LARGE)
TASKS: dict[str, Task] = {task.name: task for task in _BENCHMARK + _LARGE + _TRANSFORMED_LARGE}


def get_task(name: str) -> Task:
  """The task called `name`; a ValueError lists the known names (and the closest) otherwise."""
  if name in TASKS:
    return TASKS[name]
  close = difflib.get_close_matches(name, TASKS, n=1)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  raise ValueError(f"unknown MI task {name!r}.{hint} Known tasks: {', '.join(TASKS)}")

