"""The solver side of LNS: a `MIP` in SCIP and HiGHS, anytime runs with incumbent traces, the
LP relaxation the policy reads, a persistent sub-MIP solver and the local-branching labeller.

* `to_scip(mip)` / `to_highs(mip)`: the instance as a pyscipopt `Model` (with its variables) or
  a `highspy.Highs` holding it; one thread, fixed random seed, no output.
* `solve_scip` / `solve_highs`: the solver alone for a wall-clock budget (or a node limit, for
  tests): `Run(objective, x, trace)`, the trace the `(seconds, objective)` of every new incumbent
  (SCIP's `BESTSOLFOUND` event, HiGHS's improving-solution callback).
* `first_solution(mip, rule)`: SCIP stopped at its first primal solution, or after its root
  node (where LNS starts).
* `lp_relaxation(mip)`: HiGHS's LP optimum, reduced costs and row duals.
* `SubMipSolver(mip)`: one persistent SCIP model per instance; `solve(lower, upper, start, ...)`
  frees the transformed problem, sets the neighbourhood's bounds, hands the incumbent over as a
  start solution and solves under a time or node limit; the next call sets bounds afresh, so the
  original problem is restored between calls.
* `local_branching(mip, incumbent, kappa, ...)`: the best point with sum_j |x_j - x_j^t| <= kappa
  over the integer variables (binaries directly, general integers through auxiliaries
  d_j >= |x_j - x_j^t|), the labeller of the imitation targets.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

try:
  import highspy
  import pyscipopt
except ImportError as _error:  # the `mip` extra
  raise ImportError("btbs_lns needs the `mip` extra: pip install -e '.[mip]' (pyscipopt, "
                    "highspy)") from _error

from jaxlab.methods.btbs_lns import instances

INFINITY = 1e20   # SCIP's infinity; HiGHS uses its own `kHighsInf`


@dataclasses.dataclass
class Run:
  """An anytime run: the best objective (None: no incumbent), its point and the incumbent trace
  [(seconds since the start, objective), ...]."""
  objective: float | None
  x: np.ndarray | None
  trace: list[tuple[float, float]]
  status: str = ""
  steps: int = 0
  dual_gap: float | None = None   # SCIP alone: its primal-dual gap at the end


def _check_limits(time_limit: float | None, node_limit: int | None) -> None:
  if time_limit is None and node_limit is None:
    raise ValueError("give a time_limit (seconds) or a node_limit")
  if time_limit is not None and not time_limit > 0:
    raise ValueError(f"time_limit must be > 0 seconds, got {time_limit}")
  if node_limit is not None and node_limit < 1:
    raise ValueError(f"node_limit must be >= 1, got {node_limit}")


def _vtype(mip: instances.MIP, j: int) -> str:
  if not mip.integrality[j]:
    return "C"
  return "B" if mip.col_lower[j] >= 0 and mip.col_upper[j] <= 1 else "I"


def _finite(value: float) -> float | None:
  return float(value) if math.isfinite(value) else None


class _IncumbentTrace(pyscipopt.Eventhdlr):
  """Records (wall seconds since `start`, objective) at every new best solution."""

  def __init__(self, start: float):
    super().__init__()
    self.start, self.trace = start, []

  def eventinit(self):
    self.model.catchEvent(pyscipopt.SCIP_EVENTTYPE.BESTSOLFOUND, self)

  def eventexit(self):
    self.model.dropEvent(pyscipopt.SCIP_EVENTTYPE.BESTSOLFOUND, self)

  def eventexec(self, event):
    best = self.model.getBestSol()
    self.trace.append((time.perf_counter() - self.start, self.model.getSolObjVal(best)))


def to_scip(mip: instances.MIP, *, seed: int = 0) -> tuple[pyscipopt.Model, list]:
  """(model, variables): the instance in SCIP, single-threaded, silent, seeded."""
  model = pyscipopt.Model(mip.name)
  model.hideOutput()
  model.setParam("parallel/maxnthreads", 1)
  model.setParam("randomization/randomseedshift", int(seed) % 2**31)
  variables = [model.addVar(name=f"x{j}", vtype=_vtype(mip, j), obj=float(mip.c[j]),
                            lb=_finite(mip.col_lower[j]), ub=_finite(mip.col_upper[j]))
               for j in range(mip.num_cols)]
  for i in range(mip.num_rows):
    start, stop = mip.indptr[i], mip.indptr[i + 1]
    expression = pyscipopt.quicksum(float(a) * variables[j] for j, a in
                                    zip(mip.indices[start:stop], mip.data[start:stop]))
    model.addCons(pyscipopt.ExprCons(expression, lhs=_finite(mip.row_lower[i]),
                                     rhs=_finite(mip.row_upper[i])), name=f"r{i}")
  return model, variables


def to_highs(mip: instances.MIP, *, relax: bool = False, seed: int = 0) -> highspy.Highs:
  """A `highspy.Highs` holding the instance (the LP relaxation when `relax`), one thread."""
  solver = highspy.Highs()
  solver.setOptionValue("output_flag", False)
  solver.setOptionValue("threads", 1)
  solver.setOptionValue("random_seed", int(seed) % 2**31)
  infinite = lambda a: np.clip(np.asarray(a, float), -highspy.kHighsInf, highspy.kHighsInf)
  lp = highspy.HighsLp()
  lp.num_col_, lp.num_row_ = mip.num_cols, mip.num_rows
  lp.col_cost_ = np.asarray(mip.c, float)
  lp.col_lower_, lp.col_upper_ = infinite(mip.col_lower), infinite(mip.col_upper)
  lp.row_lower_, lp.row_upper_ = infinite(mip.row_lower), infinite(mip.row_upper)
  lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
  lp.a_matrix_.start_ = np.asarray(mip.indptr, np.int32)
  lp.a_matrix_.index_ = np.asarray(mip.indices, np.int32)
  lp.a_matrix_.value_ = np.asarray(mip.data, float)
  if not relax:
    lp.integrality_ = [highspy.HighsVarType.kInteger if k else highspy.HighsVarType.kContinuous
                       for k in mip.integrality]
  solver.passModel(lp)
  return solver


def _scip_limits(model: pyscipopt.Model, time_limit: float | None,
                 node_limit: int | None) -> None:
  model.setParam("limits/time", float(time_limit) if time_limit is not None else INFINITY)
  model.setParam("limits/nodes", int(node_limit) if node_limit is not None else -1)


def solve_scip(mip: instances.MIP, *, time_limit: float | None = None,
               node_limit: int | None = None, seed: int = 0) -> Run:
  """SCIP alone. The trace's clock starts before the model is built."""
  _check_limits(time_limit, node_limit)
  start = time.perf_counter()
  model, variables = to_scip(mip, seed=seed)
  handler = _IncumbentTrace(start)
  model.includeEventhdlr(handler, "incumbent_trace", "records every new incumbent")
  if time_limit is not None:
    time_limit = max(time_limit - (time.perf_counter() - start), 1e-3)
  _scip_limits(model, time_limit, node_limit)
  model.optimize()
  if model.getNSols() == 0:
    return Run(None, None, handler.trace, str(model.getStatus()))
  best = model.getBestSol()
  x = np.asarray([model.getSolVal(best, v) for v in variables])
  return Run(model.getSolObjVal(best), x, handler.trace, str(model.getStatus()),
             steps=int(model.getNNodes()), dual_gap=float(model.getGap()))


def solve_highs(mip: instances.MIP, *, time_limit: float | None = None,
                node_limit: int | None = None, seed: int = 0) -> Run:
  """HiGHS alone, its improving solutions traced by the MIP callback."""
  _check_limits(time_limit, node_limit)
  start = time.perf_counter()
  solver = to_highs(mip, seed=seed)
  trace = []

  def improving(event_type, message, data_out, data_in, user_data):
    trace.append((time.perf_counter() - start, float(data_out.objective_function_value)))

  solver.setCallback(improving, None)
  solver.startCallback(highspy.cb.HighsCallbackType.kCallbackMipImprovingSolution)
  if time_limit is not None:
    solver.setOptionValue("time_limit", max(time_limit - (time.perf_counter() - start), 1e-3))
  if node_limit is not None:
    solver.setOptionValue("mip_max_nodes", int(node_limit))
  solver.run()
  solution = solver.getSolution()
  if not solution.value_valid:
    return Run(None, None, trace, solver.modelStatusToString(solver.getModelStatus()))
  x = np.asarray(solution.col_value, float)
  return Run(float(solver.getInfo().objective_function_value), x, trace,
             solver.modelStatusToString(solver.getModelStatus()))


@dataclasses.dataclass(frozen=True)
class LpRelaxation:
  """HiGHS's LP optimum: x [n], reduced costs [n], row duals [m], objective."""
  x: np.ndarray
  reduced_cost: np.ndarray
  row_dual: np.ndarray
  objective: float


def lp_relaxation(mip: instances.MIP) -> LpRelaxation:
  solver = to_highs(mip, relax=True)
  solver.run()
  solution = solver.getSolution()
  if not solution.value_valid:
    raise ValueError(f"{mip.name}: the LP relaxation has no solution "
                     f"({solver.modelStatusToString(solver.getModelStatus())})")
  return LpRelaxation(x=np.asarray(solution.col_value, float),
                      reduced_cost=np.asarray(solution.col_dual, float),
                      row_dual=np.asarray(solution.row_dual, float),
                      objective=float(solver.getInfo().objective_function_value))


START_RULES = ("first", "root")


def first_solution(mip: instances.MIP, *, seed: int = 0, time_limit: float = 60.0,
                   rule: str = "first") -> Run:
  """Where every LNS run starts: SCIP stopped at its first primal solution (`rule="first"`), or
  at the end of its root node (`"root"`: presolving, the root LP and its heuristics), within
  `time_limit` seconds."""
  if rule not in START_RULES:
    raise ValueError(f"unknown start rule {rule!r}; choose one of {', '.join(START_RULES)}")
  start = time.perf_counter()
  model, variables = to_scip(mip, seed=seed)
  if rule == "first":
    model.setParam("limits/solutions", 1)
  _scip_limits(model, time_limit, 1 if rule == "root" else None)
  model.optimize()
  if model.getNSols() == 0:
    raise RuntimeError(f"{mip.name}: SCIP found no solution within {time_limit} s")
  best = model.getBestSol()
  x = np.asarray([model.getSolVal(best, v) for v in variables])
  objective = model.getSolObjVal(best)
  return Run(objective, x, [(time.perf_counter() - start, objective)], str(model.getStatus()))


def improves(objective: float | None, best: float) -> bool:
  """A found objective beats the incumbent's by more than a relative 1e-9 (minimisation)."""
  return objective is not None and objective < best - 1e-9 * max(1.0, abs(best))


class SubMipSolver:
  """One SCIP model per instance, re-solved under changing bounds (the LNS sub-MIPs)."""

  def __init__(self, mip: instances.MIP, *, seed: int = 0):
    self.mip = mip
    self.model, self.variables = to_scip(mip, seed=seed)
    self.model.setParam("limits/solutions", -1)

  def solve(self, lower: np.ndarray, upper: np.ndarray, start: np.ndarray | None, *,
            time_limit: float | None = None, node_limit: int | None = None
            ) -> tuple[float | None, np.ndarray | None]:
    """(objective, x) of the best point within [lower, upper] (None if none was found)."""
    _check_limits(time_limit, node_limit)
    model = self.model
    model.freeTransform()
    for variable, low, high in zip(self.variables, lower, upper):
      model.chgVarLb(variable, _finite(low))
      model.chgVarUb(variable, _finite(high))
    return _solve_from(model, self.variables, start, time_limit, node_limit)


def _solve_from(model: pyscipopt.Model, variables: list, start: np.ndarray | None,
                time_limit: float | None, node_limit: int | None
                ) -> tuple[float | None, np.ndarray | None]:
  """Hands `start` to SCIP as a solution, solves under the limits, returns (objective, x)."""
  if start is not None:
    solution = model.createSol()
    for variable, value in zip(variables, start):
      model.setSolVal(solution, variable, float(value))
    model.addSol(solution, free=True)
  _scip_limits(model, time_limit, node_limit)
  model.optimize()
  if model.getNSols() == 0:
    return None, None
  best = model.getBestSol()
  return model.getSolObjVal(best), np.asarray([model.getSolVal(best, v) for v in variables])


def local_branching(mip: instances.MIP, incumbent: np.ndarray, kappa: float, *,
                    time_limit: float | None = None, node_limit: int | None = None,
                    seed: int = 0) -> tuple[float | None, np.ndarray | None]:
  """The best point found with sum over integer j of |x_j - x_j^t| <= kappa, started from the
  incumbent (so it is never worse)."""
  _check_limits(time_limit, node_limit)
  if kappa < 0:
    raise ValueError(f"kappa must be >= 0, got {kappa}")
  model, variables = to_scip(mip, seed=seed)
  incumbent = np.rint(np.asarray(incumbent, float) * mip.integrality) + \
      np.asarray(incumbent, float) * ~mip.integrality
  terms = []
  for j in np.flatnonzero(mip.integrality):
    value, variable = float(incumbent[j]), variables[j]
    if mip.col_lower[j] >= 0 and mip.col_upper[j] <= 1:
      terms.append(variable if value < 0.5 else 1 - variable)
    else:
      distance = model.addVar(name=f"d{j}", lb=0.0, ub=None)
      model.addCons(distance >= variable - value)
      model.addCons(distance >= value - variable)
      terms.append(distance)
  model.addCons(pyscipopt.quicksum(terms) <= float(kappa), name="local_branching")
  return _solve_from(model, variables, incumbent, time_limit, node_limit)
