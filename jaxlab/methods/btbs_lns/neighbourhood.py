"""Turning scores into a neighbourhood: which virtual variables are released, and the bounds of
the sub-MIP that follow (NumPy; runs once per LNS step).

The destroy budget counts virtual variables (a binary is one, an integer with d bits is d).

* `release_from_scores(scores [n, D], num_bits, budget, rng, whole)`: a sample from the policy.
  Gumbel noise is added to the logits (sampling without replacement from their softmax, as a
  factorised stochastic policy does); each variable keeps its best bit k, which frees its
  d - k trailing bits; variables enter by that score until the freed bits reach the budget. With
  `whole=True` only bit 0 counts (the ablation without binarized tightening: an integer is fixed
  or freed whole, costing d).
* `uniform_release(num_bits, budget, rng)`: random LNS, whole variables uniformly at random.
* `add_branching(first_bit, branch_scores, num_extra)`: the branch-and-search step: the top
  `num_extra` fixed variables by branch score are released whole too.
* `bounds(mip, x, first_bit, num_bits)`: the sub-MIP's bounds: the interval binarized tightening
  allows for every integer variable (first_bit = d: fixed at x^t, 0: [l, u]); continuous
  variables stay free.
"""
from __future__ import annotations

import numpy as np

from jaxlab.methods.btbs_lns import instances
from jaxlab.methods.btbs_lns import tightening


def budget_of(num_bits: np.ndarray, rate: float) -> int:
  """The destroy size: `rate` of all virtual variables (at least 1)."""
  if not 0 < rate <= 1:
    raise ValueError(f"destroy rate must be in (0, 1], got {rate}")
  return max(1, int(round(rate * int(num_bits.sum()))))


def _fill(order: np.ndarray, cost: np.ndarray, budget: int) -> np.ndarray:
  """The prefix of `order` whose costs first reach the budget (boolean mask over variables)."""
  spent = np.cumsum(cost[order])
  count = int(np.searchsorted(spent, budget, side="left")) + 1
  chosen = np.zeros(cost.shape[0], bool)
  chosen[order[:count]] = True
  return chosen


def release_from_scores(scores: np.ndarray, num_bits: np.ndarray, budget: int,
                        rng: np.random.Generator | None, *, whole: bool = False) -> np.ndarray:
  """first_bit [n]: the index of each variable's first released bit (d: nothing released)."""
  n = num_bits.shape[0]
  scores = np.asarray(scores, float)[:n]
  depth = scores.shape[1]
  if rng is not None:
    scores = scores + rng.gumbel(size=scores.shape)
  valid = np.arange(depth)[None] < num_bits[:, None]
  if whole:
    valid = valid & (np.arange(depth)[None] == 0)
  masked = np.where(valid, scores, -np.inf)
  best_bit = np.argmax(masked, axis=1)
  best = masked[np.arange(n), best_bit]
  candidates = np.flatnonzero(np.isfinite(best))
  order = candidates[np.argsort(-best[candidates], kind="stable")]
  cost = np.where(np.isfinite(best), num_bits - best_bit, 0)
  chosen = _fill(order, cost, budget)
  return np.where(chosen, best_bit, num_bits)


def uniform_release(num_bits: np.ndarray, budget: int, rng: np.random.Generator
                    ) -> np.ndarray:
  candidates = np.flatnonzero(num_bits > 0)
  order = rng.permutation(candidates)
  chosen = _fill(order, num_bits, budget)
  return np.where(chosen, 0, num_bits)


def add_branching(first_bit: np.ndarray, num_bits: np.ndarray, branch_scores: np.ndarray,
                  num_extra: int) -> tuple[np.ndarray, np.ndarray]:
  """(first_bit with the extra variables released whole, mask of those variables)."""
  n = num_bits.shape[0]
  fixed = (first_bit >= num_bits) & (num_bits > 0)
  extra = np.zeros(n, bool)
  if num_extra > 0 and fixed.any():
    candidates = np.flatnonzero(fixed)
    top = candidates[np.argsort(-np.asarray(branch_scores)[:n][candidates],
                                kind="stable")[:num_extra]]
    extra[top] = True
  return np.where(extra, 0, first_bit), extra


def released_bits(first_bit: np.ndarray, num_bits: np.ndarray, depth: int) -> np.ndarray:
  """[n, depth] True for the freed virtual variables (bits k >= first bit, within d)."""
  position = np.arange(depth)[None]
  return (position >= first_bit[:, None]) & (position < num_bits[:, None])


def bounds(mip: instances.MIP, x: np.ndarray, first_bit: np.ndarray, num_bits: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
  """The sub-MIP's (lower, upper): binarized tightening on every integer variable with bits."""
  integer = num_bits > 0
  lower, upper = mip.col_lower.copy(), mip.col_upper.copy()
  if integer.any():
    depth = int(num_bits.max())
    released = released_bits(first_bit[integer], num_bits[integer], depth)
    low, high = tightening.tightened_bounds(np.rint(x[integer]), mip.col_lower[integer],
                                            mip.col_upper[integer], released)
    lower[integer], upper[integer] = low, high
  return lower, upper


def first_changed_bit(old_bits: np.ndarray, new_bits: np.ndarray, num_bits: np.ndarray
                      ) -> np.ndarray:
  """[n] the most significant bit where two points differ (d where they agree): the latest
  first-released bit from which binarized tightening can reach the new value."""
  depth = old_bits.shape[1]
  differs = (old_bits != new_bits) & (np.arange(depth)[None] < num_bits[:, None])
  return np.where(differs.any(axis=1), np.argmax(differs, axis=1), num_bits)
