"""Multi-objective front metrics (maximisation): hypervolume, expected utility, sparsity.

`hypervolume` is exact, by moocore (the `morl` extra); the others are NumPy.
"""
from __future__ import annotations

import numpy as np


def _moocore():
  try:
    import moocore  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError("the exact hypervolume needs moocore: pip install -e '.[morl]'") from error
  return moocore


def non_dominated(points: np.ndarray) -> np.ndarray:
  """[N] bool: the points no other point weakly dominates with one strict improvement
  (duplicates keep their first copy)."""
  points = np.asarray(points, np.float64)
  keep = np.ones(len(points), bool)
  for i, point in enumerate(points):
    others = np.delete(np.arange(len(points)), i)
    dominated = np.all(points[others] >= point, axis=1) & np.any(points[others] > point, axis=1)
    earlier_copy = np.any(np.all(points[:i] == point, axis=1))
    keep[i] = not (np.any(dominated) or earlier_copy)
  return keep


def hypervolume(points: np.ndarray, ref: np.ndarray) -> float:
  """The volume dominated by `points` [N, K] and dominating `ref` [K] (maximisation); points
  that do not dominate `ref` add nothing."""
  points = np.asarray(points, np.float64)
  ref = np.asarray(ref, np.float64)
  inside = points[np.all(points > ref, axis=1)]
  if len(inside) == 0:
    return 0.0
  return float(_moocore().hypervolume(inside, ref=ref, maximise=True))


def expected_utility(points: np.ndarray, weights: np.ndarray) -> float:
  """EUM: the mean over `weights` [W, K] of the front's best linear utility max_p w . G_p."""
  return float(np.mean(np.max(np.asarray(weights) @ np.asarray(points).T, axis=1)))


def sparsity(points: np.ndarray) -> float:
  """The official (morl-baselines) sparsity of a front: per objective, the summed squared gaps
  between sorted neighbours, summed over objectives, divided by (N - 1); 0 below 2 points."""
  points = np.asarray(points, np.float64)
  if len(points) < 2:
    return 0.0
  gaps = np.diff(np.sort(points, axis=0), axis=0)
  return float(np.sum(gaps ** 2) / (len(points) - 1))


def farthest_point_preferences(dim: int, count: int, *, candidates: int = 10_000,
                               seed: int = 0) -> np.ndarray:
  """[count, dim] spread-out points of the simplex: greedy farthest-point picks among seeded
  Dirichlet(1) draws, starting from the draw nearest the centre."""
  rng = np.random.default_rng(seed)
  pool = rng.dirichlet(np.ones(dim), candidates)
  chosen = [int(np.argmin(np.sum((pool - 1.0 / dim) ** 2, axis=1)))]
  distance = np.sum((pool - pool[chosen[0]]) ** 2, axis=1)
  for _ in range(count - 1):
    chosen.append(int(np.argmax(distance)))
    distance = np.minimum(distance, np.sum((pool - pool[chosen[-1]]) ** 2, axis=1))
  return pool[chosen].astype(np.float32)
