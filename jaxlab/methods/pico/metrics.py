"""Ranking metrics of the official code (`con_optimization/utils.py`), from their definitions.

Every function takes a predicted `order`: `order[i]` is the true rank (0 = best, the index into
`data.true_order()`) of the model ranked i-th, so the identity order is a perfect ranking. The
official logs print exactly this list. All metrics compare it with the identity:

- Spearman S and Kendall tau (`scipy.stats`): 1 for a perfect ranking.
- Permutation entropy H (order 3): the Shannon entropy, in nats, of the ordinal patterns of
  3-element subsequences; 0 when every subsequence is increasing. `permutation_entropy` takes all
  C(n, 3) position triples once (the expectation the official estimator aims at);
  `permutation_entropy_sampled` draws C(n, 3) random triples as the official code does (its
  "Random Permutation Entropy", the H of the paper); `permutation_entropy_consecutive` uses the
  n - 2 windows of neighbours (its "Permutation Entropy" log line).
- CIN: the number of inversions (pairs ranked the wrong way round); 0 is perfect.
- LIS: the length of the longest increasing subsequence; n is perfect.

The natural logarithm is the official one: the logged consecutive entropies equal ours to every
printed digit in nats (1.6716 for the fraction-1 PiCO run; 2.41 in bits), and the paper's H values
(0.94-1.27) are below ln 6 = 1.79, the maximum for order 3.
"""
from __future__ import annotations

import bisect
import itertools
import math
from typing import Sequence

import numpy as np
import scipy.stats

Order = Sequence[int] | np.ndarray


def as_order(order: Order) -> np.ndarray:
  """`order` as an int array, checked to be a permutation of 0..n-1."""
  array = np.asarray(order)
  if array.ndim != 1 or array.size < 2:
    raise ValueError(f"an order is a 1-D permutation of at least 2 ranks; got shape {array.shape}")
  if not np.issubdtype(array.dtype, np.integer):
    if not np.all(array == np.round(array)):
      raise ValueError(f"an order holds integer ranks; got {array.tolist()}")
    array = array.astype(np.int64)
  if not np.array_equal(np.sort(array), np.arange(array.size)):
    raise ValueError(f"order {array.tolist()} is not a permutation of 0..{array.size - 1}")
  return array.astype(np.int64)


def spearman(order: Order) -> float:
  """Spearman's rank correlation between the predicted and the true ranks."""
  order = as_order(order)
  return float(scipy.stats.spearmanr(np.arange(order.size), order).statistic)


def kendall(order: Order) -> float:
  """Kendall's tau between the predicted and the true ranks."""
  order = as_order(order)
  return float(scipy.stats.kendalltau(np.arange(order.size), order).statistic)


def _pattern_entropy(subsequences: np.ndarray) -> float:
  """Entropy (nats) of the ordinal patterns of the rows of [S, m] `subsequences`."""
  # argsort of each row is its ordinal pattern; equal patterns give equal rows.
  patterns = np.argsort(subsequences, axis=1, kind="stable")
  _, counts = np.unique(patterns, axis=0, return_counts=True)
  probabilities = counts / counts.sum()
  return float(-np.sum(probabilities * np.log(probabilities))) + 0.0  # + 0.0: no -0.0


def _check_pattern_length(order: np.ndarray, n: int) -> None:
  if not 2 <= n <= order.size:
    raise ValueError(f"pattern length n={n} must lie in [2, {order.size}] for {order.size} ranks")


def permutation_entropy(order: Order, n: int = 3) -> float:
  """Exact permutation entropy: the patterns of all C(len, n) position subsets (i < j < k, n = 3).

  `n` is the pattern length (embedding dimension). The official estimator samples C(len, n)
  random subsets; this is the distribution it samples from, so no seed is involved.
  """
  order = as_order(order)
  _check_pattern_length(order, n)
  positions = np.array(list(itertools.combinations(range(order.size), n)))
  return _pattern_entropy(order[positions])


def permutation_entropy_sampled(order: Order, seed: int, n: int = 3,
                                num_samples: int | None = None) -> float:
  """The official estimator: C(len, n) random position subsets (each kept in position order).

  Each subset is n distinct positions drawn uniformly (numpy `default_rng(seed)`); subsets may
  repeat across draws. `num_samples` defaults to C(len, n), as in the official code.
  """
  order = as_order(order)
  _check_pattern_length(order, n)
  rng = np.random.default_rng(seed)
  num_samples = num_samples or math.comb(order.size, n)
  # The n smallest of `size` uniform keys index a uniformly random n-subset.
  positions = np.sort(np.argsort(rng.random((num_samples, order.size)), axis=1)[:, :n], axis=1)
  return _pattern_entropy(order[positions])


def permutation_entropy_consecutive(order: Order, n: int = 3) -> float:
  """Permutation entropy of the len - n + 1 windows of n neighbours (the classic definition)."""
  order = as_order(order)
  _check_pattern_length(order, n)
  return _pattern_entropy(np.lib.stride_tricks.sliding_window_view(order, n))


def inversions(order: Order) -> int:
  """CIN: the number of pairs i < j with order[i] > order[j]."""
  order = as_order(order)
  return int(np.sum(np.triu(order[:, None] > order[None, :], k=1)))


def longest_increasing_subsequence(order: Order) -> int:
  """LIS: the length of the longest strictly increasing subsequence (patience sorting)."""
  tails: list[int] = []  # tails[k]: the smallest last value of an increasing run of length k + 1
  for value in as_order(order).tolist():
    position = bisect.bisect_left(tails, value)
    if position == len(tails):
      tails.append(value)
    else:
      tails[position] = value
  return len(tails)


def all_metrics(order: Order) -> dict[str, float]:
  """{"spearman", "kendall", "pen" (exact, all triples), "cin", "lis"} of one predicted order."""
  return {"spearman": spearman(order), "kendall": kendall(order),
          "pen": permutation_entropy(order), "cin": inversions(order),
          "lis": longest_increasing_subsequence(order)}
