"""Pruning an attention weight so that the softmax attention matrix, not the linear map, is kept.

"Beyond Linear Approximations" (Liang et al., ICLR 2025; no official code, so the formulation is
a reconstruction). For calibration sequences X_s [N, d] and a per-head merged query-key matrix
W = W_Q,h W_K,h^T / sqrt(d_h) [d, d], the attention matrix is the row softmax

  f(X, W) = softmax(X W X^T)            (causal: keys after the query masked before normalising)

and a continuous mask M [d, d] is found by plain gradient descent on

  L(M) = 1/2 sum_s ||f(X_s, M o W) - f(X_s, W)||_F^2 + lam/2 ||M||_F^2,

from M = 1 with the fixed step eta = 1 / L_hat, L_hat the largest eigenvalue of the Hessian of L
at M = 1 (power iteration on Hessian-vector products). By default lam is given in units of the
fidelity term's curvature at M = 1 (`lam_scale`, below), since that curvature spans orders of
magnitude between heads; the losses returned are L with the resulting absolute lam. The mask is then binarised per output
column (`keep_mask`) by |M| or |M o W|. The factors setting (what a model ships) puts masks on
the per-head w_q, w_k [d, d_h] instead: W = (M_Q o w_q)(M_K o w_k)^T / sqrt(d_h).

Baselines prune the linear map X -> X W with the same grouping (per output column, keep
round((1 - s) d_in) inputs): magnitude, Wanda and SparseGPT.

Layout: weights are [d_in, d_out] (x @ w), so an output column here is one row of a torch
weight, the unit that Wanda and SparseGPT prune per row.

The jitted functions take jax arrays and compose with `jax.vmap` (over heads, say); `prune`,
`prune_factors` and the error metrics take and return numpy, and check their inputs before any
compile.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.zoo import attention as zoo_attention

PyTree = Any

METHODS = ("gd_mask", "magnitude", "wanda", "sparsegpt")
SCORES = ("mask", "mask_times_weight")
POWER_ITERATIONS = 30

# Defaults from a check on `synthetic.instance` (N = 64, d = 32, X ~ N(0, 1), logit std c; one
# sequence), relative attention error at sparsity 0.5 (mean of seeds 0-2 unless noted):
# * lam is in units of the fidelity curvature L_fid (`lam_scale`, below). At c = 5, 300 steps:
#   lam 0.001 -> 0.47, 0.003 -> 0.27, 0.01 -> 0.28, 0.03 -> 0.42, 0.1 -> 0.68, >= 1 -> 0.98 (every
#   mask shrinks, so W o M flattens the logits); magnitude 0.56, Wanda 0.55, SparseGPT 0.51.
#   0.003 reaches 0.20 but only after 1000 steps; 0.01 has converged by ~300 (0.295 at 100,
#   0.278 at 300, 0.279 at 1000), and it is also the best or near it at c = 2 and c = 0.5.
# * An absolute lam = 0.01 (what lam means in the loss as written) gives 0.45 at c = 5 but 0.43
#   at c = 0.5, where the relative one gives 0.12: L_fid is ~8 at c = 5 and ~0.006 at c = 0.5.
# * Seeds 0-4, these defaults, c = 5: GD mask 0.28 (s = 0.5) and 0.38 (s = 0.7); magnitude 0.55 /
#   0.80, Wanda 0.53 / 0.79, SparseGPT 0.51 / 0.78. The loss fell monotonically on every seed.
# * score "mask" and "mask_times_weight" differ by < 0.01 there; keep_values matters: keeping W
#   instead of W o M gives 0.53 / 0.55, so much of the gain is the mask rescaling the kept weights.
DEFAULT_LAM = 0.01
# On the character LM (128 wide, 8 calibration sequences) 0.01 shrinks the kept entries too far
# (perplexity 6.2 at 50% against 4.4 at 0.003, one draw); neither the synthetic check nor the LM
# fixes one value for every head, so by default each head takes the lam of this grid whose
# binarised mask has the least attention error on the calibration sequences (`select_binarised`).
DEFAULT_LAMS = (0.01, 0.003, 0.001)
DEFAULT_STEPS = 300
DEFAULT_SCORE = "mask"


# ------------------------------------------------------------------------------------------------
# The attention matrix and the objective.


def attention_matrix(x: jax.Array, w: jax.Array, causal: bool = False) -> jax.Array:
  """Row softmax of x w x^T: x [N, d], w [d, d] -> [N, N]; causal rows ignore later keys.

  jax.nn.softmax subtracts the row maximum (log-sum-exp stable); masked logits are -inf, which
  take zero weight and pass zero gradient.
  """
  return zoo_attention.masked_softmax(x @ w @ x.T, causal)


def _sequences(x: jax.Array) -> jax.Array:
  """[N, d] or [S, N, d] -> [S, N, d] float32."""
  x = jnp.asarray(x, jnp.float32)
  return x[None] if x.ndim == 2 else x


def _attention_batch(x: jax.Array, w: jax.Array, causal: bool) -> jax.Array:
  """f(X_s, w) for every sequence: x [S, N, d] -> [S, N, N]."""
  return jax.vmap(attention_matrix, in_axes=(0, None, None))(x, w, causal)


def merged_weight(w_q: jax.Array, w_k: jax.Array) -> jax.Array:
  """One head's W = w_q w_k^T / sqrt(d_h): w_q, w_k [d, d_h] -> [d, d]."""
  return w_q @ w_k.T / jnp.asarray(math.sqrt(w_q.shape[-1]), w_q.dtype)


def _squared_norm(tree: PyTree) -> jax.Array:
  return sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree))


def _fidelity(weight_fn: Callable[[PyTree], jax.Array], x: jax.Array, target: jax.Array,
              causal: bool) -> Callable[[PyTree], jax.Array]:
  """masks -> 1/2 sum_s ||f(X_s, weight_fn(masks)) - target_s||_F^2."""

  def fidelity(masks):
    residual = _attention_batch(x, weight_fn(masks), causal) - target
    return 0.5 * jnp.sum(jnp.square(residual))

  return fidelity


def _regularised(fidelity: Callable[[PyTree], jax.Array], lam: jax.Array
                 ) -> Callable[[PyTree], jax.Array]:
  """L(masks) = fidelity(masks) + lam/2 ||masks||^2 (lam absolute)."""
  return lambda masks: fidelity(masks) + 0.5 * lam * _squared_norm(masks)


def _merged_fidelity(x, w, causal):
  """The merged setting's fidelity term and its start point M = 1."""
  return _fidelity(lambda m: m * w, x, _attention_batch(x, w, causal), causal), jnp.ones_like(w)


def _factors_fidelity(x, w_q, w_k, causal):
  """The factors setting's fidelity term and its start point (M_Q, M_K) = (1, 1)."""
  weight_fn = lambda masks: merged_weight(masks[0] * w_q, masks[1] * w_k)
  target = _attention_batch(x, merged_weight(w_q, w_k), causal)
  return _fidelity(weight_fn, x, target, causal), (jnp.ones_like(w_q), jnp.ones_like(w_k))


def mask_loss(mask: jax.Array, x: jax.Array, w: jax.Array, lam: float,
              causal: bool = False) -> jax.Array:
  """The merged setting's L(M) with an absolute `lam` (x [N, d] or [S, N, d]; mask, w [d, d]).

  Computes in the inputs' precision (float64 under `jax.enable_x64`, for finite differences),
  at least float32.
  """
  dtype = jnp.result_type(mask, x, w, jnp.float32)
  x = jnp.asarray(x, dtype)
  x = x[None] if x.ndim == 2 else x
  fidelity, _ = _merged_fidelity(x, jnp.asarray(w, dtype), causal)
  return _regularised(fidelity, jnp.asarray(lam, dtype))(jnp.asarray(mask, dtype))


# ------------------------------------------------------------------------------------------------
# Curvature, step size and gradient descent.
#
# lam is given in units of the fidelity term's curvature by default (lam_scale="curvature"): the
# weight in L is lam * L_fid, with L_fid the largest eigenvalue of the fidelity term's Hessian at
# M = 1. L_fid spans three orders of magnitude between near-linear and saturated softmax rows
# (about 0.006 at logit std 0.5, 0.8 at 2 and 8 at 5 for N = 64, d = 32; it also grows with
# the number of calibration sequences, since the fidelity is a sum), so no absolute lam suits
# every synthetic head, while lam = 0.01 L_fid does (see DEFAULT_LAM; the LM's wider heads want
# less, hence DEFAULT_LAMS). With eta = 1 / (L_fid + lam L_fid) the regulariser shrinks a flat
# direction by the factor 1 - lam / (1 + lam) per step whatever the scale, so DEFAULT_STEPS
# carries over too. lam_scale="absolute" takes lam as written.

LAM_SCALES = ("curvature", "absolute")


def _largest_hessian_eigenvalue(objective: Callable[[PyTree], jax.Array], point: PyTree,
                                iterations: int) -> jax.Array:
  """Power iteration on v -> H v (forward-over-reverse: `jax.jvp` of `jax.grad`) at `point`.

  Returns the Rayleigh quotient v^T H v of the last unit iterate. At M = 1 the attention
  residual is zero, so the fidelity Hessian is the Gauss-Newton matrix J^T J, positive
  semi-definite, and the iteration climbs to its largest eigenvalue (from below: the Rayleigh
  quotient never overshoots). The start vector is a fixed Gaussian draw, so the estimate is
  deterministic.
  """
  gradient = jax.grad(objective)

  def hvp(v):
    return jax.jvp(gradient, (point,), (v,))[1]

  def normalised(v):
    norm = jnp.sqrt(_squared_norm(v))
    return jax.tree.map(lambda leaf: leaf / jnp.maximum(norm, 1e-30), v)

  leaves, treedef = jax.tree.flatten(point)
  keys = jax.random.split(jax.random.key(0), len(leaves))
  start = jax.tree.unflatten(treedef, [jax.random.normal(k, leaf.shape, leaf.dtype)
                                       for k, leaf in zip(keys, leaves)])
  v = jax.lax.fori_loop(0, iterations, lambda _, v: normalised(hvp(v)), normalised(start))
  return sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(v), jax.tree.leaves(hvp(v))))


def _weight_and_step(fidelity, start, lam, lam_scale, iterations):
  """(absolute lam, eta = 1 / L_hat). The Hessian of lam/2 ||M||^2 is lam I, so L's largest
  eigenvalue at M = 1 is exactly L_fid + lam: the power iteration runs on the fidelity term
  alone, where the eigenvalue ratios (hence its convergence) are not flattened by the shift."""
  if lam_scale not in LAM_SCALES:
    raise ValueError(f"unknown lam_scale {lam_scale!r}; choose one of {LAM_SCALES}")
  curvature = _largest_hessian_eigenvalue(fidelity, start, iterations)
  return _weight_and_step_at(curvature, lam, lam_scale)


def _weight_and_step_at(curvature, lam, lam_scale):
  absolute = lam * curvature if lam_scale == "curvature" else lam
  return absolute, 1.0 / jnp.maximum(curvature + absolute, 1e-30)


def _gradient_descent(objective: Callable[[PyTree], jax.Array], start: PyTree, eta: jax.Array,
                      steps: int) -> tuple[PyTree, jax.Array]:
  """`steps` plain GD steps in one scan; the losses at M_0 .. M_steps ([steps + 1])."""
  value_and_grad = jax.value_and_grad(objective)

  def step(masks, _):
    loss, grad = value_and_grad(masks)
    return jax.tree.map(lambda m, g: m - eta * g, masks, grad), loss

  masks, losses = jax.lax.scan(step, start, None, length=steps)
  return masks, jnp.append(losses, objective(masks))


def _descend(fidelity, start, lam, eta, steps, lam_scale, iterations):
  """GD at one lam, or (lam [G]) at every lam of a grid (`_descend_grid`)."""
  if jnp.ndim(lam):
    return _descend_grid(fidelity, start, lam, eta, steps, lam_scale, iterations)
  absolute, step_size = _weight_and_step(fidelity, start, lam, lam_scale, iterations)
  return _gradient_descent(_regularised(fidelity, absolute), start,
                           step_size if eta is None else eta, steps)


@functools.partial(jax.jit, static_argnames=("causal", "lam_scale", "iterations"))
def _merged_weight_and_step(x, w, lam, *, causal, lam_scale, iterations):
  fidelity, ones = _merged_fidelity(x, w, causal)
  return _weight_and_step(fidelity, ones, lam, lam_scale, iterations)


def regularisation_weight(x: jax.Array, w: jax.Array, lam: float, causal: bool = False,
                          lam_scale: str = "curvature",
                          iterations: int = POWER_ITERATIONS) -> jax.Array:
  """The absolute weight of lam/2 ||M||^2 that `gd_mask` uses (merged setting)."""
  return _merged_weight_and_step(_sequences(x), jnp.asarray(w, jnp.float32),
                                 jnp.asarray(lam, jnp.float32), causal=causal,
                                 lam_scale=lam_scale, iterations=iterations)[0]


def hessian_step_size(x: jax.Array, w: jax.Array, lam: float, causal: bool = False,
                      iterations: int = POWER_ITERATIONS,
                      lam_scale: str = "curvature") -> jax.Array:
  """eta = 1 / L_hat, L_hat the largest eigenvalue of L's Hessian at M = 1 (merged setting):
  x [N, d] or [S, N, d], w [d, d]."""
  return _merged_weight_and_step(_sequences(x), jnp.asarray(w, jnp.float32),
                                 jnp.asarray(lam, jnp.float32), causal=causal,
                                 lam_scale=lam_scale, iterations=iterations)[1]


@functools.partial(jax.jit, static_argnames=("causal", "lam_scale", "iterations"))
def _factors_weight_and_step(x, w_q, w_k, lam, *, causal, lam_scale, iterations):
  fidelity, ones = _factors_fidelity(x, w_q, w_k, causal)
  return _weight_and_step(fidelity, ones, lam, lam_scale, iterations)


def hessian_step_size_factors(x: jax.Array, w_q: jax.Array, w_k: jax.Array, lam: float,
                              causal: bool = False, iterations: int = POWER_ITERATIONS,
                              lam_scale: str = "curvature") -> jax.Array:
  """eta = 1 / L_hat for the factors setting (the joint Hessian over (M_Q, M_K))."""
  return _factors_weight_and_step(_sequences(x), jnp.asarray(w_q, jnp.float32),
                                  jnp.asarray(w_k, jnp.float32), jnp.asarray(lam, jnp.float32),
                                  causal=causal, lam_scale=lam_scale, iterations=iterations)[1]


def _optional_float(value):
  return None if value is None else jnp.asarray(value, jnp.float32)


@functools.partial(jax.jit, static_argnames=("steps", "causal", "lam_scale", "iterations"))
def _gd_mask(x, w, lam, eta, *, steps, causal, lam_scale, iterations):
  fidelity, ones = _merged_fidelity(x, w, causal)
  return _descend(fidelity, ones, lam, eta, steps, lam_scale, iterations)


def gd_mask(x: jax.Array, w: jax.Array, *, lam: float, steps: int, eta: float | None = None,
            causal: bool = False, lam_scale: str = "curvature",
            iterations: int = POWER_ITERATIONS) -> tuple[jax.Array, jax.Array]:
  """GD on the merged mask: x [N, d] or [S, N, d], w [d, d] -> (mask [d, d], losses [steps + 1]).

  lam is in units of L_fid unless lam_scale="absolute" (see above); eta=None takes
  1 / L_hat from `iterations` power-iteration steps. losses[t] = L(M_t) with the absolute lam.
  Traceable, so `jax.vmap(functools.partial(gd_mask, lam=..., steps=...), in_axes=(None, 0))`
  runs every head of a [H, d, d] stack at once (each head gets its own L_fid and eta).
  """
  return _gd_mask(_sequences(x), jnp.asarray(w, jnp.float32), jnp.asarray(lam, jnp.float32),
                  _optional_float(eta), steps=steps, causal=causal, lam_scale=lam_scale,
                  iterations=iterations)


@functools.partial(jax.jit, static_argnames=("steps", "causal", "lam_scale", "iterations"))
def _gd_mask_factors(x, w_q, w_k, lam, eta, *, steps, causal, lam_scale, iterations):
  fidelity, ones = _factors_fidelity(x, w_q, w_k, causal)
  return _descend(fidelity, ones, lam, eta, steps, lam_scale, iterations)


def gd_mask_factors(x: jax.Array, w_q: jax.Array, w_k: jax.Array, *, lam: float, steps: int,
                    eta: float | None = None, causal: bool = False,
                    lam_scale: str = "curvature", iterations: int = POWER_ITERATIONS
                    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
  """GD on (M_Q, M_K) at once: w_q, w_k [d, d_h] -> ((m_q, m_k), losses [steps + 1]).

  L = 1/2 sum_s ||f(X_s, (M_Q o w_q)(M_K o w_k)^T / sqrt(d_h)) - f(X_s, W)||^2
  + lam/2 (||M_Q||^2 + ||M_K||^2); lam, eta as in `gd_mask` (L_fid from the joint Hessian).
  """
  return _gd_mask_factors(_sequences(x), jnp.asarray(w_q, jnp.float32),
                          jnp.asarray(w_k, jnp.float32), jnp.asarray(lam, jnp.float32),
                          _optional_float(eta), steps=steps, causal=causal,
                          lam_scale=lam_scale, iterations=iterations)


def _descend_grid(fidelity, start, lams, eta, steps, lam_scale, iterations):
  """`_descend` once per lam of `lams` [G], vmapped; L_fid does not depend on lam, so one power
  iteration serves the whole grid."""
  if lam_scale not in LAM_SCALES:
    raise ValueError(f"unknown lam_scale {lam_scale!r}; choose one of {LAM_SCALES}")
  curvature = _largest_hessian_eigenvalue(fidelity, start, iterations)

  def descend(lam):
    absolute, step_size = _weight_and_step_at(curvature, lam, lam_scale)
    return _gradient_descent(_regularised(fidelity, absolute), start,
                             step_size if eta is None else eta, steps)

  return jax.vmap(descend)(lams)


def _lam_vector(lams) -> jax.Array:
  return jnp.asarray(lams, jnp.float32).reshape(-1)


def gd_mask_grid(x: jax.Array, w: jax.Array, *, lams, steps: int, eta: float | None = None,
                 causal: bool = False, lam_scale: str = "curvature",
                 iterations: int = POWER_ITERATIONS) -> tuple[jax.Array, jax.Array]:
  """`gd_mask` for every lam of `lams` [G] -> (masks [G, d, d], losses [G, steps + 1])."""
  return _gd_mask(_sequences(x), jnp.asarray(w, jnp.float32), _lam_vector(lams),
                  _optional_float(eta), steps=steps, causal=causal, lam_scale=lam_scale,
                  iterations=iterations)


def gd_mask_factors_grid(x: jax.Array, w_q: jax.Array, w_k: jax.Array, *, lams, steps: int,
                         eta: float | None = None, causal: bool = False,
                         lam_scale: str = "curvature", iterations: int = POWER_ITERATIONS
                         ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
  """`gd_mask_factors` for every lam of `lams` [G] -> ((m_q, m_k) each [G, d, d_h], losses
  [G, steps + 1])."""
  return _gd_mask_factors(_sequences(x), jnp.asarray(w_q, jnp.float32),
                          jnp.asarray(w_k, jnp.float32), _lam_vector(lams), _optional_float(eta),
                          steps=steps, causal=causal, lam_scale=lam_scale,
                          iterations=iterations)


# ------------------------------------------------------------------------------------------------
# Binarisation and the linear-map baselines.


def keep_count(rows: int, sparsity: float) -> int:
  """Entries kept per output column: round((1 - s) rows) (Python's round: half to even)."""
  return int(round((1.0 - sparsity) * rows))


@functools.partial(jax.jit, static_argnames="keep")
def _top_per_column(scores: jax.Array, keep: int) -> jax.Array:
  # A stable sort of -score puts larger scores first and, among equal ones, the lower input
  # index first; the inverse permutation is each entry's rank within its column.
  order = jnp.argsort(-scores, axis=0, stable=True)
  rank = jnp.argsort(order, axis=0, stable=True)
  return rank < keep


def keep_mask(scores: jax.Array, sparsity: float) -> jax.Array:
  """bool [d_in, d_out]: per output column, the round((1 - s) d_in) largest scores (ties: the
  lower input index)."""
  _check_sparsity(sparsity)
  scores = jnp.asarray(scores, jnp.float32)
  return _top_per_column(scores, keep_count(scores.shape[0], sparsity))


def _tokens(x: jax.Array) -> jax.Array:
  """Every calibration token as a row: [N, d] or [S, N, d] -> [S N, d]."""
  x = jnp.asarray(x, jnp.float32)
  return x.reshape(-1, x.shape[-1])


def magnitude(w: jax.Array, sparsity: float) -> tuple[jax.Array, jax.Array]:
  """Keep the largest |W_ij| per output column -> (mask, W o mask)."""
  mask = keep_mask(jnp.abs(w), sparsity)
  return mask, jnp.where(mask, w, 0.0)


def wanda(x: jax.Array, w: jax.Array, sparsity: float) -> tuple[jax.Array, jax.Array]:
  """Wanda: score |W_ij| ||X[:, i]||_2 (input feature i's norm over all tokens) per column."""
  feature_norm = jnp.linalg.norm(_tokens(x), axis=0)
  mask = keep_mask(jnp.abs(w) * feature_norm[:, None], sparsity)
  return mask, jnp.where(mask, w, 0.0)


@functools.partial(jax.jit, static_argnames=("sparsity", "blocksize"))
def _sparsegpt(x, w, damp, *, sparsity, blocksize):
  d_in = w.shape[0]
  hessian = x.T @ x
  # An input that is always zero has no curvature; SparseGPT gives it a unit diagonal.
  hessian = hessian + jnp.diag(jnp.where(jnp.diag(hessian) == 0, 1.0, 0.0))
  hessian = hessian + damp * jnp.mean(jnp.diag(hessian)) * jnp.eye(d_in)
  inverse = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(hessian), True), jnp.eye(d_in))
  upper = jnp.linalg.cholesky(inverse).T  # H^-1 = U^T U
  pivots = jnp.diag(upper)
  inputs = jnp.arange(d_in)

  def prune_input(i, w, keep):
    row = w[i]
    pruned_row = jnp.where(keep[i], row, 0.0)
    # OBS: dropping the pruned part of input i's row is compensated on the inputs not yet
    # processed (j > i): delta = (w_i - q_i) / U_ii, w_j -= U_ij delta. Updating every later
    # input at once equals SparseGPT's in-block updates plus its lazy update of later blocks.
    delta = (row - pruned_row) / pivots[i]
    later = jnp.where(inputs > i, upper[i], 0.0)
    w = w - later[:, None] * delta[None, :]
    return w.at[i].set(pruned_row)

  keep = jnp.zeros(w.shape, bool)
  for start in range(0, d_in, blocksize):
    stop = min(start + blocksize, d_in)
    # Adaptive mask selection, once per block, on the weights as updated so far.
    block_scores = jnp.square(w[start:stop]) / jnp.square(pivots[start:stop])[:, None]
    keep = keep.at[start:stop].set(
        _top_per_column(block_scores, keep_count(stop - start, sparsity)))
    w = jax.lax.fori_loop(start, stop, functools.partial(prune_input, keep=keep), w)
  return keep, w


def sparsegpt(x: jax.Array, w: jax.Array, sparsity: float, blocksize: int = 128,
              damp: float = 0.01) -> tuple[jax.Array, jax.Array]:
  """SparseGPT (OBS on X -> X W) written from the paper's algorithm -> (mask, updated W).

  H = X^T X + damp mean(diag H) I and U the upper Cholesky factor of H^-1. Input rows of W are
  processed in blocks of `blocksize` (clipped to d_in). Adaptation: SparseGPT's torch weight
  is [d_out, d_in] and its block mask prunes the lowest w^2 / U_ii^2 over the whole
  [d_out, blocksize] block; here each output column (one torch row) chooses within the block on
  its own, keeping `keep_count(B, s)` = round((1 - s) B) of the block's B inputs (and pruning the
  rest, i.e. round(s B) but for halves, where Python rounds to even), so a column ends with
  exactly `keep_count(d_in, s)` entries, as in the other methods, whenever the blocks split d_in
  evenly. Then input by input i: delta = (w_i - q_i) / U_ii with q_i = w_i o keep_i, and
  w_j -= U_ij delta for j > i.
  """
  _check_sparsity(sparsity)
  w = jnp.asarray(w, jnp.float32)
  return _sparsegpt(_tokens(x), w, jnp.asarray(damp, jnp.float32), sparsity=float(sparsity),
                    blocksize=min(int(blocksize), w.shape[0]))


def mask_scores(mask: jax.Array, w: jax.Array, score: str) -> jax.Array:
  """|M| ("mask") or |M o W| ("mask_times_weight")."""
  if score not in SCORES:
    raise ValueError(f"score must be one of {SCORES}, got {score!r}")
  return jnp.abs(mask) if score == "mask" else jnp.abs(mask * w)


def binarise(mask: jax.Array, w: jax.Array, sparsity: float, score: str = DEFAULT_SCORE,
             keep_values: bool = True) -> tuple[jax.Array, jax.Array]:
  """A continuous GD mask -> (keep [d_in, d_out], pruned W): W o M on kept entries
  (keep_values) or W, zero elsewhere."""
  keep = keep_mask(mask_scores(mask, w, score), sparsity)
  return keep, jnp.where(keep, w * mask if keep_values else w, 0.0)


@functools.partial(jax.jit, static_argnames=("sparsity", "score", "keep_values", "causal"))
def _select_binarised(x, w, masks, *, sparsity, score, keep_values, causal):
  pruned = jax.vmap(lambda m: binarise(m, w, sparsity, score, keep_values)[1])(masks)
  errors = jax.vmap(lambda w_new: _attention_error(x, w, w_new, causal))(pruned)
  best = jnp.argmin(errors)
  return pruned[best], best, errors


def select_binarised(x, w, masks, sparsity: float, score: str = DEFAULT_SCORE,
                     keep_values: bool = True, causal: bool = False
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Binarises each candidate mask of `masks` [G, d, d] (one per lam of a grid) and keeps the one
  whose pruned W has the least attention error on the calibration sequences x (ties: the first).

  Returns (pruned W [d, d], its index, the errors [G]). Only calibration data decides, as
  the baselines see it.
  """
  _check_sparsity(sparsity)
  return _select_binarised(_sequences(x), jnp.asarray(w, jnp.float32), jnp.asarray(masks),
                           sparsity=float(sparsity), score=score, keep_values=bool(keep_values),
                           causal=causal)


@functools.partial(jax.jit, static_argnames=("sparsity", "score", "keep_values", "causal"))
def _select_binarised_factors(x, w_q, w_k, masks_q, masks_k, *, sparsity, score, keep_values,
                              causal):
  prune_each = lambda w: jax.vmap(lambda m: binarise(m, w, sparsity, score, keep_values)[1])
  pruned_q, pruned_k = prune_each(w_q)(masks_q), prune_each(w_k)(masks_k)
  merged = merged_weight(w_q, w_k)
  errors = jax.vmap(lambda q, k: _attention_error(x, merged, merged_weight(q, k), causal))(
      pruned_q, pruned_k)
  best = jnp.argmin(errors)
  return pruned_q[best], pruned_k[best], best, errors


def select_binarised_factors(x, w_q, w_k, masks_q, masks_k, sparsity: float,
                             score: str = DEFAULT_SCORE, keep_values: bool = True,
                             causal: bool = False):
  """`select_binarised` for one head's factors: masks_q, masks_k [G, d, d_h] -> (w_q_new,
  w_k_new, index, errors [G]), the error that of the merged matrix the pruned factors give."""
  _check_sparsity(sparsity)
  return _select_binarised_factors(
      _sequences(x), jnp.asarray(w_q, jnp.float32), jnp.asarray(w_k, jnp.float32),
      jnp.asarray(masks_q), jnp.asarray(masks_k), sparsity=float(sparsity), score=score,
      keep_values=bool(keep_values), causal=causal)


# ------------------------------------------------------------------------------------------------
# Error metrics (numpy in, float out).


@functools.partial(jax.jit, static_argnames="causal")
def _attention_error(x, w, w_new, causal):
  reference = _attention_batch(x, w, causal)
  return jnp.linalg.norm(_attention_batch(x, w_new, causal) - reference) / jnp.linalg.norm(
      reference)


def attention_error(x, w, w_new, causal: bool = False) -> float:
  """||f(x, w_new) - f(x, w)||_F / ||f(x, w)||_F, summed over sequences when x is [S, N, d]."""
  return float(_attention_error(_sequences(x), jnp.asarray(w, jnp.float32),
                                jnp.asarray(w_new, jnp.float32), causal))


def linear_error(x, w, w_new) -> float:
  """||X w_new - X w||_F / ||X w||_F over every calibration token."""
  x = _tokens(x)
  w = jnp.asarray(w, jnp.float32)
  reference = x @ w
  return float(jnp.linalg.norm(x @ jnp.asarray(w_new, jnp.float32) - reference)
               / jnp.linalg.norm(reference))


@functools.partial(jax.jit, static_argnames="causal")
def _output_error(x, w, w_new, w_v, causal):
  values = x @ w_v
  reference = _attention_batch(x, w, causal) @ values
  return jnp.linalg.norm(_attention_batch(x, w_new, causal) @ values - reference) / (
      jnp.linalg.norm(reference))


def output_error(x, w, w_new, w_v, causal: bool = False) -> float:
  """Relative Frobenius error of the head's output f(x, .) x W_V."""
  return float(_output_error(_sequences(x), jnp.asarray(w, jnp.float32),
                             jnp.asarray(w_new, jnp.float32), jnp.asarray(w_v, jnp.float32),
                             causal))


# ------------------------------------------------------------------------------------------------
# Public entry points: validation first, numpy in and out.

_OPTIONS = {
    "gd_mask": ("lam", "lam_scale", "steps", "eta", "score", "keep_values", "iterations"),
    "magnitude": (),
    "wanda": (),
    "sparsegpt": ("blocksize", "damp"),
}


def _check_sparsity(sparsity) -> None:
  if (isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real)
      or not 0.0 <= float(sparsity) < 1.0):
    raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")


def _check_array(name: str, array: Any, ndims: tuple[int, ...]) -> np.ndarray:
  array = np.asarray(array)
  if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
    raise ValueError(f"{name} must be a real array, got dtype {array.dtype}")
  if array.ndim not in ndims:
    raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, "
                     f"got shape {array.shape}")
  if 0 in array.shape:
    raise ValueError(f"{name} is empty (shape {array.shape})")
  if not np.all(np.isfinite(array)):
    raise ValueError(f"{name} contains NaN or inf")
  return array.astype(np.float32)


def _check_x(x: Any, width: int) -> np.ndarray:
  x = _check_array("x", x, (2, 3))
  if x.shape[-1] != width:
    raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal the weight's input "
                     f"dimension ({width})")
  if x.shape[-2] < 2:
    raise ValueError(f"x needs at least 2 tokens per sequence, got {x.shape[-2]}")
  return x


def _check_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
  if method not in METHODS:
    raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
  unknown = sorted(set(options) - set(_OPTIONS[method]))
  if unknown:
    raise ValueError(f"option(s) {unknown} do not apply to method {method!r}; it takes "
                     f"{_OPTIONS[method] or 'none'}")
  if method == "gd_mask":
    options = dict(dict(lam=DEFAULT_LAMS, lam_scale="curvature", steps=DEFAULT_STEPS, eta=None,
                        score=DEFAULT_SCORE, keep_values=True, iterations=POWER_ITERATIONS),
                   **options)
    if options["score"] not in SCORES:
      raise ValueError(f"unknown score {options['score']!r}; choose one of {SCORES}")
    if options["lam_scale"] not in LAM_SCALES:
      raise ValueError(f"unknown lam_scale {options['lam_scale']!r}; choose one of {LAM_SCALES}")
    if isinstance(options["lam"], (tuple, list, np.ndarray)):
      lams = list(np.asarray(options["lam"], dtype=object).reshape(-1))
      if not lams:
        raise ValueError("lam is an empty grid; give a number or at least one value")
      for value in lams:
        _check_number("lam", value, minimum=0.0)
    else:
      _check_number("lam", options["lam"], minimum=0.0)
    _check_integer("steps", options["steps"], minimum=1)
    _check_integer("iterations", options["iterations"], minimum=1)
    if options["eta"] is not None:
      _check_number("eta", options["eta"], minimum=0.0, strict=True)
    if not isinstance(options["keep_values"], (bool, np.bool_)):
      raise ValueError(f"keep_values must be a bool, got {options['keep_values']!r}")
  if method == "sparsegpt":
    options = dict(dict(blocksize=128, damp=0.01), **options)
    _check_integer("blocksize", options["blocksize"], minimum=1)
    _check_number("damp", options["damp"], minimum=0.0, strict=True)
  return options


def _check_number(name, value, minimum, strict=False):
  if (isinstance(value, bool) or not isinstance(value, numbers.Real)
      or not math.isfinite(value) or value < minimum or (strict and value == minimum)):
    raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {minimum}, "
                     f"got {value!r}")


def _check_integer(name, value, minimum):
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _prune_linear(x: np.ndarray, w: np.ndarray, method: str, sparsity: float,
                  options: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
  """A baseline on the linear map x -> x w."""
  if method == "magnitude":
    return magnitude(w, sparsity)
  if method == "wanda":
    return wanda(x, w, sparsity)
  return sparsegpt(x, w, sparsity, blocksize=options["blocksize"], damp=options["damp"])


def prune(x, w, method: str, sparsity: float, causal: bool = False, **options
          ) -> tuple[np.ndarray, np.ndarray]:
  """Prunes one weight w [d_in, d_out] -> (keep mask bool, pruned w), numpy.

  x: calibration tokens [N, d_in] or sequences [S, N, d_in] (the baselines use every token).
  method: "gd_mask" (merged setting, needs a square w), "magnitude", "wanda", "sparsegpt".
  Options: gd_mask takes lam, lam_scale, steps, eta, score, keep_values, iterations (defaults
  the grid DEFAULT_LAMS in curvature units, DEFAULT_STEPS, eta = 1 / L_hat, DEFAULT_SCORE, True,
  POWER_ITERATIONS); lam is a number or a grid, whose member with the least binarised attention
  error on x is kept (`select_binarised`); sparsegpt takes blocksize, damp (128, 0.01); an
  option the method does not use is an error.
  """
  options = _check_options(method, options)
  _check_sparsity(sparsity)
  w = _check_array("w", w, (2,))
  x = _check_x(x, w.shape[0])
  if method == "gd_mask":
    if w.shape[0] != w.shape[1]:
      raise ValueError(f"gd_mask needs a square merged w [d, d], got shape {w.shape}")
    descent = dict(steps=options["steps"], eta=options["eta"], causal=causal,
                   lam_scale=options["lam_scale"], iterations=options["iterations"])
    if np.ndim(options["lam"]) == 0:
      mask, _ = gd_mask(x, w, lam=options["lam"], **descent)
    else:
      masks, _ = gd_mask_grid(x, w, lams=options["lam"], **descent)
      _, best, _ = select_binarised(x, w, masks, sparsity, options["score"],
                                    options["keep_values"], causal)
      mask = masks[best]
    keep, w_new = binarise(mask, w, sparsity, options["score"], options["keep_values"])
  else:
    keep, w_new = _prune_linear(x, w, method, sparsity, options)
  return np.asarray(keep), np.asarray(w_new)


def prune_factors(x, w_q, w_k, method: str, sparsity: float, causal: bool = False, **options
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Prunes one head's factors w_q, w_k [d, d_h] -> (w_q_new, w_k_new), numpy.

  gd_mask runs `gd_mask_factors` (a lam grid: `gd_mask_factors_grid`, then
  `select_binarised_factors`) and binarises each factor's mask per output column; the
  baselines prune each factor on its own linear map x -> x w_q, x -> x w_k.
  """
  options = _check_options(method, options)
  _check_sparsity(sparsity)
  w_q = _check_array("w_q", w_q, (2,))
  w_k = _check_array("w_k", w_k, (2,))
  if w_q.shape != w_k.shape:
    raise ValueError(f"w_q and w_k must have the same shape, got {w_q.shape} and {w_k.shape}")
  x = _check_x(x, w_q.shape[0])
  if method == "gd_mask":
    descent = dict(steps=options["steps"], eta=options["eta"], causal=causal,
                   lam_scale=options["lam_scale"], iterations=options["iterations"])
    if np.ndim(options["lam"]) == 0:
      (m_q, m_k), _ = gd_mask_factors(x, w_q, w_k, lam=options["lam"], **descent)
      pruned = [binarise(m, factor, sparsity, options["score"], options["keep_values"])[1]
                for m, factor in ((m_q, w_q), (m_k, w_k))]
    else:
      (masks_q, masks_k), _ = gd_mask_factors_grid(x, w_q, w_k, lams=options["lam"], **descent)
      pruned = select_binarised_factors(x, w_q, w_k, masks_q, masks_k, sparsity,
                                        options["score"], options["keep_values"], causal)[:2]
  else:
    pruned = [_prune_linear(x, factor, method, sparsity, options)[1] for factor in (w_q, w_k)]
  return np.asarray(pruned[0]), np.asarray(pruned[1])
