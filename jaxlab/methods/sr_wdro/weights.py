"""KL worst-case reweighting of a batch's losses: SR-WDRO's statistical-robustness step.

Given per-example losses l [B], SR-WDRO trains on sum_i p_i l_i for the worst-case weights

  p = argmax_{p in simplex} sum_i p_i l_i   subject to   KL(u || p) = mean_i log(1 / (B p_i)) <= r,

u the uniform distribution. The official code solves this exponential-cone program with cvxpy
once per batch (`cvxpy_reference_weights` reproduces it for tests and benchmarks);
`kl_worst_case_weights` solves it in closed form up to a scalar found by bisection, as a pure,
jittable, vmappable JAX function.

Derivation (ours). The KKT conditions of the (concave in p) program give
p_i = lambda / (B (mu - l_i)) for a multiplier mu > max l, i.e. p_i proportional to
1 / (mu - l_i). With t_i = (mu - l_i) / spread (spread = max l - min l; the scale of t cancels),
B p_i = (1 / t_i) / mean_j (1 / t_j), so

  KL(mu) = log(mean_i 1 / t_i) + mean_i log t_i,

which is >= 0 by Jensen, falls monotonically from +inf (mu -> max l, the weight piles onto the
largest losses) to 0 (mu -> inf, uniform weights), and the objective rises as mu falls. So the
optimum is the smallest mu with KL(mu) <= r, found by bisection on s = log((mu - max l) / spread):
t_i = exp(s) + d_i with d_i = (max l - l_i) / spread in [0, 1].
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# The bisection bracket for s = log((mu - max l) / spread). At s = 20, exp(s) ~ 4.9e8 has a
# float32 ulp of 32, so every t_i = exp(s) + d_i (d_i <= 1) rounds to exp(s): the weights are
# exactly uniform, KL = 0, and the upper end is feasible for every r >= 0 (in float64 its KL is
# below var(d) / (2 exp(40)) < 3e-19). At s = -40 the top loss's t is 4e-18 against d_i >= ~1e-7
# for the rest, so nearly all weight sits on the top loss (or its ties): KL ~ (1 - 1/B) * 37,
# beyond any radius of use (the paper's is 0.1); were r larger, that feasible lower end would be
# returned. exp(-40) = 4e-18 and B / exp(-40) stay far from float32 underflow and overflow.
LOG_GAP_BRACKET = (-40.0, 20.0)
# Below this |e| (e = B p_i - 1) the Taylor series of e - log1p(e) is used: the direct form loses
# ~eps / e^2 relative accuracy to cancellation, the series' truncation error is ~e^7 / 4.5 < 3e-8
# relative.
_SERIES_CUTOFF = 0.1


def kl_from_uniform(p: jax.Array) -> jax.Array:
  """KL(u || p) = mean_i log(1 / (B p_i)) for weights p [..., B] on the simplex; shape [...]."""
  num_examples = p.shape[-1]
  return -jnp.mean(jnp.log(num_examples * p), axis=-1)


def _kl_terms(excess: jax.Array, log_ratio: jax.Array) -> jax.Array:
  """q - 1 - log q >= 0 elementwise, q = B p_i, from e = q - 1 [B] and log q [B].

  Near q = 1 the two parts cancel to ~e^2 / 2, so a Taylor series in the (accurately known) e is
  used there; far from 1, log q (known without forming q - 1, which rounds to -1 once q < eps)
  keeps the terms of weights near 0 exact.
  """
  near_one = jnp.abs(excess) < _SERIES_CUTOFF
  small = jnp.where(near_one, excess, 0.0)
  # e^2/2 - e^3/3 + ... - e^7/7 + e^8/8 in Horner form.
  series = small * small * (1 / 2 + small * (-1 / 3 + small * (1 / 4 + small * (
      -1 / 5 + small * (1 / 6 + small * (-1 / 7 + small * (1 / 8)))))))
  return jnp.where(near_one, series, excess - log_ratio)


def _weights_and_kl(log_gap: jax.Array, gaps: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Weights p [B] proportional to 1 / t, t = exp(log_gap) + gaps, and their KL(u || p) [].

  KL = mean_i (q_i - 1 - log q_i) with q_i = B p_i (mean_i (q_i - 1) = 0), summed from
  e_i = q_i - 1 = (sum_j p_j gaps_j - gaps_i) / t_i (exact algebra, since t_i - t_j =
  gaps_i - gaps_j) and log q_i = -log t_i - log mean_j (1 / t_j): no term cancels against
  another, so both a small r and the near-zero weights of a large r are met to float32 accuracy.
  """
  t = jnp.exp(log_gap) + gaps
  inverse = 1.0 / t
  mean_inverse = jnp.mean(inverse)
  p = inverse / jnp.sum(inverse)
  excess = (jnp.sum(p * gaps) - gaps) / t
  log_ratio = -jnp.log(t) - jnp.log(mean_inverse)
  return p, jnp.mean(_kl_terms(excess, log_ratio))


def kl_worst_case_weights(losses: jax.Array, r: jax.Array | float, *,
                          num_iterations: int = 64) -> jax.Array:
  """Worst-case weights p [B] of losses [B] within the KL(u || p) <= r ball (see module doc).

  Args:
    losses: per-example losses [B], finite (float32 or float64).
    r: the KL radius, a scalar >= 0; may be traced (jit, vmap over r). r <= 0 gives uniform.
    num_iterations: bisection steps on log((mu - max l) / spread) over `LOG_GAP_BRACKET`; 64
      halves the bracket of width 60 to ~3e-18, below float32 resolution of the weights.

  Returns:
    p [B], positive, summing to 1, with KL(u || p) <= r up to float rounding (the feasible end of
    the bracket is returned). Uniform when r <= 0 or the losses are equal to within ~2 ulps of the
    largest magnitude (such a spread is rounding noise, not a ranking). p is a constant for
    autodiff: d/dl sum_i p_i l_i = p, as in the official code, which solves for p outside the
    graph.
  """
  # Stop gradients on the way in too, so that jax.grad does not trace tangents through the loop.
  losses = jax.lax.stop_gradient(jnp.asarray(losses))
  dtype = losses.dtype
  r = jax.lax.stop_gradient(jnp.asarray(r, dtype))
  num_examples = losses.shape[-1]
  uniform = jnp.full(losses.shape, 1.0 / num_examples, dtype)

  largest = jnp.max(losses)
  spread = largest - jnp.min(losses)
  scale = jnp.maximum(jnp.abs(largest), jnp.abs(jnp.min(losses)))
  degenerate = spread <= 2 * jnp.finfo(dtype).eps * scale
  # spread can be 0 here; the degenerate branch is discarded below, it must only not be NaN.
  gaps = (largest - losses) / jnp.where(degenerate, 1.0, spread)

  def bisect(_, bracket):
    infeasible_end, feasible_end = bracket
    middle = 0.5 * (infeasible_end + feasible_end)
    _, kl = _weights_and_kl(middle, gaps)
    feasible = kl <= r
    return (jnp.where(feasible, infeasible_end, middle), jnp.where(feasible, middle, feasible_end))

  low, high = LOG_GAP_BRACKET
  _, feasible_end = jax.lax.fori_loop(0, num_iterations, bisect,
                                      (jnp.asarray(low, dtype), jnp.asarray(high, dtype)))
  p, _ = _weights_and_kl(feasible_end, gaps)
  p = jnp.where(degenerate | (r <= 0), uniform, p)
  return jax.lax.stop_gradient(p)


def _import_cvxpy():
  try:
    import cvxpy  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError("cvxpy is a test-only dependency of jaxlab's SR-WDRO reference weights: "
                      'pip install -e ".[test]"') from error
  return cvxpy


@functools.lru_cache(maxsize=None)
def _reference_program(num_examples: int):
  """The official DPPOptimizer's program for batch size B, with the losses and r as parameters.

  As in the official code it is built once per batch size, so that repeated solves reuse cvxpy's
  canonicalisation (a benchmark of the official weight step then times what training paid).
  """
  cp = _import_cvxpy()
  weights = cp.Variable(num_examples)
  losses = cp.Parameter(num_examples)
  radius = cp.Parameter(nonneg=True)
  # ExpCone(x, y, z): y exp(x / y) <= z. With y = 1/B, z = p_i and x = -kl_i this reads
  # kl_i >= (1/B) log(1 / (B p_i)) (and p_i > 0), so sum_i kl_i <= r is KL(u || p) <= r.
  # This conic form solves more reliably in Clarabel than cp.log(B p) does at large r (the
  # log-atom form failed with B = 128, r = 3 on gamma-distributed losses).
  kl_terms = cp.Variable(num_examples)
  uniform = np.full(num_examples, 1.0 / num_examples)
  problem = cp.Problem(cp.Maximize(losses @ weights), [
      cp.sum(weights) == 1,
      cp.constraints.ExpCone(-kl_terms, uniform, weights),
      cp.sum(kl_terms) <= radius])
  return problem, weights, losses, radius


def cvxpy_reference_weights(losses: np.ndarray, r: float) -> np.ndarray:
  """The official formulation in float64: cvxpy's exponential-cone program solved by Clarabel.

  maximise losses @ p over the simplex subject to KL(u || p) = -sum_i log(B p_i) / B <= r
  (the official code's `DPPOptimizer`, solved there by ECOS or MOSEK). losses [B] -> p [B]
  float64. cvxpy is a test-only dependency, imported on the first call. Not thread-safe: the
  program is cached per batch size and its parameters are overwritten by each call.
  """
  cp = _import_cvxpy()
  losses = np.asarray(losses, np.float64)
  problem, weights, loss_parameter, radius = _reference_program(losses.shape[0])
  loss_parameter.value = losses
  radius.value = float(r)
  problem.solve(solver=cp.CLARABEL)
  # r = 0 pins p to the cone's boundary (uniform), which Clarabel reports as inaccurate.
  if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
    raise RuntimeError(f"cvxpy/Clarabel did not solve the KL weight program: {problem.status}")
  return np.asarray(weights.value, np.float64)
