"""Primal gap and primal integral of an anytime solver run.

* primal_gap(z, z_best) = |z - z*| / max(|z|, |z*|): 0 when both are 0, 1 when there is no
  incumbent (z is None or not finite) or the two differ in sign.
* primal_integral(trace, z_best, time_limit): the mean of the primal gap over [0, T], the gap
  being a step function of the incumbent trace [(time, objective), ...] (1 before the first).
"""
from __future__ import annotations

import math
from typing import Sequence


def primal_gap(objective: float | None, best: float) -> float:
  if objective is None or not math.isfinite(objective):
    return 1.0
  if objective == best:
    return 0.0
  if objective * best < 0:
    return 1.0
  return abs(objective - best) / max(abs(objective), abs(best))


def primal_integral(trace: Sequence[tuple[float, float]], best: float, time_limit: float
                    ) -> float:
  if time_limit <= 0:
    raise ValueError(f"time_limit must be > 0, got {time_limit}")
  total, gap, last = 0.0, 1.0, 0.0
  for time, objective in sorted(trace):
    time = min(max(time, 0.0), time_limit)
    total += gap * (time - last)
    gap, last = primal_gap(objective, best), time
  return (total + gap * (time_limit - last)) / time_limit
