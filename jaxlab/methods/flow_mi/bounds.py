"""Critic-based lower bounds on MI (the baselines): InfoNCE, NWJ, Donsker-Varadhan, MINE.

All four read the same statistics of a critic's score matrix S[i, j] = T(x_i, y_j): the joint
scores S[i, i] and the log-sum-exp of each row over all columns and over the off-diagonal ones
(pairs drawn from the product of marginals). `score_statistics` computes them row-block by
row-block, so a whole test set (bmi evaluates on all of it) fits in memory, and a training batch's
backward pass recomputes each block instead of storing every pair's hidden activations. Measured
on a 2-core CPU (InfoNCE training step, batch 256, 12 vmapped 3x3 fits, ms per step): one CPU
device (as the experiment runs): 72 unblocked, 123 / 72 / 79 with 16 / 32 / 64-row blocks; two
devices with the replicas sharded: 71 unblocked, 51 / 53 / 65. 32 rows is near the best of both.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

PairwiseScores = Callable[[jax.Array, jax.Array], jax.Array]   # (x [A, dx], y [B, dy]) -> [A, B]


class ScoreStatistics(NamedTuple):
  joint: jax.Array            # [N] S[i, i]
  row_logsumexp: jax.Array    # [N] log sum_j exp S[i, j]
  offdiag_logsumexp: jax.Array   # [N] log sum_{j != i} exp S[i, j]


# Rows per block (see the module docstring for the measurement).
ROW_BLOCK = 32


def score_statistics(pairwise: PairwiseScores, x: jax.Array, y: jax.Array,
                     row_block: int = ROW_BLOCK) -> ScoreStatistics:
  n = x.shape[0]

  def row(args):
    x_i, i = args
    scores = pairwise(x_i[None], y)[0]                   # [N]
    is_joint = jnp.arange(n) == i
    offdiag = jax.nn.logsumexp(jnp.where(is_joint, -jnp.inf, scores))
    return scores[i], jax.nn.logsumexp(scores), offdiag

  # lax.map vmaps `row` over blocks of rows: memory O(row_block * N), not O(N^2); the
  # checkpoint makes the backward pass recompute a block's activations (see the docstring).
  joint, lse, off = jax.lax.map(jax.checkpoint(row), (x, jnp.arange(n)),
                                batch_size=min(row_block, n))
  return ScoreStatistics(joint, lse, off)


def _log_mean_offdiag_exp(stats: ScoreStatistics) -> jax.Array:
  n = stats.joint.shape[0]
  return jax.nn.logsumexp(stats.offdiag_logsumexp) - math.log(n * (n - 1))


def infonce(stats: ScoreStatistics) -> jax.Array:
  """mean_i [S_ii - log sum_j exp S_ij] + log N (at most log N)."""
  n = stats.joint.shape[0]
  return jnp.mean(stats.joint - stats.row_logsumexp) + math.log(n)


def nwj(stats: ScoreStatistics) -> jax.Array:
  """E_p[T] - e^{-1} E_{p_x p_y}[e^T]."""
  return jnp.mean(stats.joint) - jnp.exp(_log_mean_offdiag_exp(stats) - 1.0)


def donsker_varadhan(stats: ScoreStatistics) -> jax.Array:
  """E_p[T] - log E_{p_x p_y}[e^T] (also MINE's reported value)."""
  return jnp.mean(stats.joint) - _log_mean_offdiag_exp(stats)


def mine_surrogate(stats: ScoreStatistics, moving_average: jax.Array,
                   decay: float) -> tuple[jax.Array, jax.Array]:
  """MINE's bias-corrected objective: (surrogate to maximise, updated moving average).

  The gradient of log E[e^T] is E[grad e^T] / E[e^T]; MINE replaces the minibatch denominator,
  which biases the gradient, by a moving average of E[e^T] across steps. The surrogate
  E_p[T] - E_q[e^T] / stop_gradient(ma) has exactly that gradient.
  """
  batch_mean_exp = jnp.exp(_log_mean_offdiag_exp(stats))
  updated = decay * moving_average + (1.0 - decay) * jax.lax.stop_gradient(batch_mean_exp)
  surrogate = jnp.mean(stats.joint) - batch_mean_exp / updated
  return surrogate, updated
