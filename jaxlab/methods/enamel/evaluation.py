"""Scoring programs for correctness and efficiency, as the ENAMEL benchmark defines it.

Per problem:
1. **Reference times, on this machine.** The expert reference solution runs every case (in the
   same sandbox as the candidates, so both pay the same per-call overhead); a case's time is the
   Hodges-Lehmann estimate over its repeats (6 on levels with hardness > 0, 1 on level 0). t*_j =
   the largest case time of level j; T = alpha * max_j t*_j (alpha = 2) is the time limit.
2. **A candidate sample** runs every case in its own sandboxed worker, each call limited to
   T + 10 ms (the worker is killed at the first time-out). Then:
   * a wrong answer, an exception, a crash or an output that is not a plain value: fail, every
     level scores 0;
   * a time-out, out-of-memory or overflow: on level 0 fail; on level j >= 1 the sample passes but
     level j and the later ones score 0;
   * otherwise level j scores e_j = max(0, T - t_j) / (T - t*_j), t_j = the largest case time of
     the level (right-censored at T; e_j can exceed 1);
   * sample efficiency e = sum_j h_j e_j / sum_j h_j, hardness h = (0, 3, 3, 4).
3. pass@k and eff@k over the samples (`estimators`), averaged over problems.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from jaxlab.methods.enamel import problems as problems_lib
from jaxlab.methods.enamel import sandbox
from jaxlab.methods.enamel import testgen

HARDNESS = (0, 3, 3, 4)
NUM_REPEATS = 6
TIMEOUT_FACTOR = 2.0
TOLERANCE_S = 0.01
# Statuses that end the evaluation at this level without failing the sample (past level 0).
LIMIT_STATUSES = ("timeout", "memory")
LIMIT_EXCEPTIONS = ("MemoryError", "OverflowError")


@dataclasses.dataclass(frozen=True)
class Settings:
  hardness: tuple[int, ...] = HARDNESS
  num_repeats: int = NUM_REPEATS
  timeout_factor: float = TIMEOUT_FACTOR
  tolerance_s: float = TOLERANCE_S
  memory_bytes: int = 4 * 2**30

  def repeats(self, level: int) -> int:
    return self.num_repeats if self.hardness[level] else 1

  def limits(self) -> sandbox.Limits:
    return sandbox.Limits(memory_bytes=self.memory_bytes, tolerance_s=self.tolerance_s)


def hodges_lehmann(times: Sequence[float]) -> float:
  """The median of the Walsh averages (t_a + t_b) / 2 over a <= b."""
  t = np.asarray(times, np.float64)
  a, b = np.triu_indices(len(t))
  return float(np.median((t[a] + t[b]) / 2))


@dataclasses.dataclass
class References:
  level_times: list[float]     # t*_j (-inf on levels with hardness 0)
  time_limit: float            # T = alpha * max_j t*_j


def program_of(problem: problems_lib.Problem, code: str) -> str:
  return problem.prompt + "\n" + code


def _cases(tests: testgen.ProblemTests, settings: Settings, time_limit: float
           ) -> list[tuple[tuple, int, float]]:
  return [(args, settings.repeats(level), time_limit)
          for level, cases in enumerate(tests.inputs) for args in cases]


def measure_references(problem: problems_lib.Problem, tests: testgen.ProblemTests,
                       settings: Settings) -> References:
  # The reference is trusted; its generous limit only guards against a stuck machine.
  results = sandbox.run_cases(problem.reference_program, problem.entry_point,
                              _cases(tests, settings, 60.0), settings.limits())
  bad = [r for r in results if r.status != "ok"]
  if bad:
    raise RuntimeError(f"the reference solution of problem {problem.index} failed on this "
                       f"machine: {bad[0].status} {bad[0].detail}")
  level_times, position = [], 0
  for level, cases in enumerate(tests.inputs):
    times = [hodges_lehmann(r.seconds) for r in results[position:position + len(cases)]]
    position += len(cases)
    level_times.append(max(times) if settings.hardness[level] else float("-inf"))
  return References(level_times, settings.timeout_factor * max(level_times))


@dataclasses.dataclass
class SampleScore:
  passed: bool
  level_efficiencies: list[float]
  efficiency: float
  outcome: str                 # "passed", "wrong answer", "error: <type>", "timeout at level j" ...


def score_sample(problem: problems_lib.Problem, code: str, tests: testgen.ProblemTests,
                 references: References, settings: Settings,
                 check: Callable[[Any, Any, Any], bool]) -> SampleScore:
  num_levels = len(tests.inputs)
  zeros = [0.0] * num_levels

  def fail(outcome: str) -> SampleScore:
    return SampleScore(False, zeros, 0.0, outcome)

  results = sandbox.run_cases(program_of(problem, code), problem.entry_point,
                              _cases(tests, settings, references.time_limit + settings.tolerance_s),
                              settings.limits())
  efficiencies: list[float] = []
  position = 0
  for level, cases in enumerate(tests.inputs):
    level_results = results[position:position + len(cases)]
    position += len(cases)
    times, stopped = [], None
    for args, answer, result in zip(cases, tests.answers[level], level_results):
      limited = (result.status in LIMIT_STATUSES or
                 (result.status == "error" and result.detail in LIMIT_EXCEPTIONS))
      if limited:
        stopped = result.status if result.status != "error" else result.detail
        break
      if result.status != "ok":
        return fail(f"{result.status}: {result.detail}".strip(": "))
      try:
        accepted = bool(check(args, answer, result.output))
      except Exception as error:  # pylint: disable=broad-except
        return fail(f"checker raised {type(error).__name__} on the output")
      if not accepted:
        return fail(f"wrong answer at level {level}")
      times.append(hodges_lehmann(result.seconds))
    if stopped is not None:
      if level == 0:
        return fail(f"{stopped} at level 0")
      efficiencies += [0.0] * (num_levels - level)
      return _finish(efficiencies, settings, f"{stopped} at level {level}")
    reference = references.level_times[level]
    efficiencies.append(max(0.0, references.time_limit - max(times)) /
                        (references.time_limit - reference) if settings.hardness[level] else 0.0)
  return _finish(efficiencies, settings, "passed")


def _finish(efficiencies: list[float], settings: Settings, outcome: str) -> SampleScore:
  weights = np.asarray(settings.hardness, np.float64)
  efficiency = float(np.dot(weights, efficiencies) / weights.sum())
  return SampleScore(True, efficiencies, efficiency, outcome)
