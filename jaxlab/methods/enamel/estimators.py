"""Unbiased eff@k and pass@k estimators of the ENAMEL benchmark (Qiu et al., ICLR 2025).

ENAMEL scores a code model by the *efficiency* of the programs it writes. For one problem, n
samples are generated and each gets an efficiency e_i >= 0 (0 for a wrong or timed-out program;
values above 1 mean faster than the expert reference). eff@k is the expected best efficiency among
k samples drawn without replacement from the n. Averaging the maximum over every k-subset (the
Rao-Blackwellised, unbiased estimator) reduces, with e_(1) <= ... <= e_(n) sorted ascending, to

  eff@k = sum_{r=k}^{n} lambda_r e_(r),   lambda_r = C(r-1, k-1) / C(n, k),

because e_(r) is the maximum of exactly C(r-1, k-1) of the C(n, k) subsets. The binomials overflow
float64 for n ~ 1000 and lose digits well before, so the weights are built from their ratios:

  lambda_n = k / n,   lambda_r = lambda_{r+1} (1 - (k-1)/r)   for r = n-1, ..., k,   0 for r < k,

i.e. a reversed cumulative product. pass@k is HumanEval's unbiased estimator with c correct of n:

  pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i),   1 when n - c < k.

The benchmark score is the mean over problems of these per-problem values.

Precision: every public function computes in float64 under `jax.enable_x64(True)`, so it is
float64-accurate when called from ordinary float32 code, and returns float64 arrays. Arithmetic
on those arrays *outside* an x64 context is done by JAX in float32 again; to keep the digits
(e.g. for the mean over problems), convert with `np.asarray(result)` first or stay inside
`jax.enable_x64(True)`. Likewise pass efficiencies as NumPy float64 (or Python floats), not as a
float32 JAX array, if their own digits matter.

All problems in one call must have the same number of samples n (a dense [P, n] array); group
problems by n if a run has ragged sample counts.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def _as_count(value, name: str) -> int:
  """`value` as a Python int, or a ValueError naming `name`."""
  if isinstance(value, bool):
    raise ValueError(f"{name} must be an integer, got the bool {value!r}")
  try:
    return operator.index(value)
  except TypeError:
    raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _check_k(num_samples: int, k) -> tuple[int, int]:
  """Validated (n, k) with 1 <= k <= n."""
  num_samples = _as_count(num_samples, "the number of samples n")
  k = _as_count(k, "k")
  if k < 1:
    raise ValueError(f"k must be >= 1, got k={k}")
  if k > num_samples:
    raise ValueError(f"k must be <= the number of samples n={num_samples}, got k={k}")
  return num_samples, k


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _eff_weights(num_samples: int, k: int) -> jax.Array:
  """lambda_r for sorted positions r = 1..n: [n] in the dtype of the enclosing x64 setting."""
  positions = jnp.arange(1, num_samples, dtype=jnp.float64)  # r = 1 .. n-1
  # lambda_r / lambda_{r+1} = C(r-1, k-1) / C(r, k-1) = 1 - (k-1)/r for r >= k; zero below k.
  ratios = jnp.where(positions >= k, 1.0 - (k - 1) / positions, 0.0)
  # Suffix products prod_{s=r}^{n-1} ratio_s for r = 1..n-1, then the empty product for r = n.
  suffix_products = jnp.cumprod(ratios[::-1])[::-1]
  suffix_products = jnp.concatenate([suffix_products, jnp.ones((1,), jnp.float64)])
  return (k / num_samples) * suffix_products


@functools.partial(jax.jit, static_argnums=(1,))
def _eff_at_k(efficiencies: jax.Array, k: int) -> jax.Array:
  """efficiencies [P, n] float64 -> eff@k [P]; the weights are built once and shared by all P."""
  weights = _eff_weights(efficiencies.shape[1], k)  # [n]
  ascending = jnp.sort(efficiencies, axis=1)  # [P, n]
  return jnp.sum(ascending * weights[None, :], axis=1)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _pass_at_k(num_correct: jax.Array, num_samples: int, k: int) -> jax.Array:
  """num_correct [P] ints -> pass@k [P]: 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
  sample_index = jnp.arange(1, num_samples + 1, dtype=jnp.float64)  # i = 1 .. n, [n]
  num_wrong = (num_samples - num_correct).astype(jnp.float64)  # [P]
  in_product = sample_index[None, :] > num_wrong[:, None]  # [P, n]
  factors = jnp.where(in_product, 1.0 - k / sample_index[None, :], 1.0)  # [P, n]
  # With fewer than k wrong samples every k-subset holds a correct one; the product also hits the
  # factor at i = k, which is exactly 0, but say it outright.
  return jnp.where(num_wrong < k, 1.0, 1.0 - jnp.prod(factors, axis=1))


def eff_weights(n: int, k: int) -> jax.Array:
  """Weights lambda_r = C(r-1, k-1) / C(n, k) of the sorted efficiencies, r = 1..n: [n] float64.

  They are zero for r < k and sum to 1. Raises ValueError unless 1 <= k <= n.
  """
  n, k = _check_k(n, k)
  with jax.enable_x64(True):
    return _eff_weights(n, k)


def eff_at_k(efficiencies, k: int) -> jax.Array:
  """Unbiased eff@k of each problem: efficiencies [P, n] (P problems, n samples each) -> [P] float64.

  Each row holds one problem's n sample efficiencies (>= 0, 0 for a failed sample, may exceed 1);
  the order of samples within a row does not matter. Every problem must have the same n. k = 1
  gives the row mean, k = n the row maximum. The benchmark eff@k is the mean of the result.

  Raises ValueError for input that is not 2-D, has negative or non-finite entries (checked when
  the input is concrete, not a tracer), or has k < 1 or k > n.
  """
  shape = np.shape(efficiencies)
  if len(shape) != 2:
    raise ValueError("efficiencies must be 2-D [num_problems, num_samples] (every problem with "
                     f"the same number of samples), got shape {shape}")
  _, k = _check_k(shape[1], k)
  if _is_concrete(efficiencies):
    values = np.asarray(efficiencies, dtype=np.float64)
    if not np.all(np.isfinite(values)):
      raise ValueError("efficiencies must be finite (a failed sample has efficiency 0)")
    if np.any(values < 0):
      raise ValueError(f"efficiencies must be >= 0, got a minimum of {values.min()}")
    efficiencies = values
  with jax.enable_x64(True):
    return _eff_at_k(jnp.asarray(efficiencies, dtype=jnp.float64), k)


def pass_at_k(num_correct, num_samples: int, k: int) -> jax.Array:
  """Unbiased pass@k of each problem: num_correct [P] (correct samples of n each) -> [P] float64.

  pass@k = 1 - C(n-c, k) / C(n, k): the chance that k samples drawn without replacement from the
  n include at least one correct one. Every problem must have the same n = `num_samples`.

  Raises ValueError for input that is not 1-D, counts outside [0, n] or not whole numbers (checked
  when the input is concrete, not a tracer), or k < 1 or k > n.
  """
  shape = np.shape(num_correct)
  if len(shape) != 1:
    raise ValueError(f"num_correct must be 1-D [num_problems], got shape {shape}")
  num_samples, k = _check_k(num_samples, k)
  if _is_concrete(num_correct):
    counts = np.asarray(num_correct)
    if counts.dtype == np.bool_ or not np.all(np.isfinite(counts)) or np.any(
        counts != np.round(counts)):
      raise ValueError(f"num_correct must hold whole-number counts, got {counts}")
    if np.any(counts < 0) or np.any(counts > num_samples):
      raise ValueError(f"num_correct must lie in [0, num_samples={num_samples}], "
                       f"got values in [{counts.min()}, {counts.max()}]")
    num_correct = counts.astype(np.int64)
  with jax.enable_x64(True):
    return _pass_at_k(jnp.asarray(num_correct, dtype=jnp.int64), num_samples, k)


def ks_to_report(num_samples: int, ks: Sequence[int] = (1, 10, 100)) -> list[int]:
  """The k of `ks` that the estimators accept with n = num_samples (k <= n), in the given order."""
  num_samples = _as_count(num_samples, "num_samples")
  if num_samples < 1:
    raise ValueError(f"num_samples must be >= 1, got {num_samples}")
  ks = [_as_count(k, "each k") for k in ks]
  if any(k < 1 for k in ks):
    raise ValueError(f"every k must be >= 1, got {ks}")
  return [k for k in ks if k <= num_samples]
