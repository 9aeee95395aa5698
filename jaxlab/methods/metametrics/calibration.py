"""MetaMetrics: calibrate a combination of base metrics to human judgments.

- `gp`: y_MM = sum_k w_k y_k with w in [0, 1]^K, chosen by Bayesian optimisation (a GP surrogate,
  `bayes_opt`, its default UCB acquisition) to maximise Kendall tau-b with the human scores on
  the training items. Kendall tau is piecewise constant in w, which is why a black-box optimiser
  is used and nothing here is differentiated.
- `xgb`: an `XGBRegressor` over the K scores, `n_estimators` and `learning_rate` chosen by
  `skopt.BayesSearchCV` (R^2 in k-fold CV, the estimator's default score, as the official code).
- baselines: `linear` (least squares on the scores) and `uniform` (the plain average).

`calibrate(scores, human, method)` returns a `Calibrated` with `.predict(scores)`; `kendall` and
`grouped_kendall` are the evaluation.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy import stats

from jaxlab.methods.metametrics import metrics as metrics_lib

METHODS = ("gp", "xgb", "linear", "uniform")
SPARSE_WEIGHT = 0.05   # a gp weight below this counts as "metric not used"

# The official XGBoost config's fixed settings. The official code reads `fixed_model_params`,
# which its configs leave empty, so there these are silently unused; here they are applied.
XGB_FIXED = dict(max_depth=5, min_child_weight=3, gamma=0.1, subsample=0.95,
                 colsample_bytree=0.95, reg_alpha=0.1, reg_lambda=0.1)
XGB_N_ESTIMATORS = tuple(range(100, 1501, 100))
XGB_LEARNING_RATE = (0.01, 0.1)
DEFAULTS = {
    "gp": dict(init_points=5, n_iter=100),
    "xgb": dict(n_iter=25, cv=10, n_jobs=2),
    "linear": {},
    "uniform": {},
}


def _vector(values: Any, name: str) -> np.ndarray:
  array = np.asarray(values, np.float64)
  if array.ndim != 1:
    raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
  if not np.all(np.isfinite(array)):
    bad = int(np.flatnonzero(~np.isfinite(array))[0])
    raise ValueError(f"{name} has a non-finite value ({array[bad]}) at index {bad}")
  return array


def _pair(pred: Any, human: Any) -> tuple[np.ndarray, np.ndarray]:
  pred, human = _vector(pred, "pred"), _vector(human, "human")
  if pred.size != human.size:
    raise ValueError(f"pred and human must have the same length; got {pred.size} and "
                     f"{human.size}")
  if pred.size < 2:
    raise ValueError(f"Kendall tau needs >= 2 items, got {pred.size}")
  return pred, human


def _tau_b(pred: np.ndarray, human: np.ndarray) -> float:
  if np.ptp(pred) == 0:
    return 0.0  # a constant prediction orders nothing
  return float(stats.kendalltau(pred, human, variant="b").statistic)


def kendall(pred: Any, human: Any) -> float:
  """Kendall tau-b of `pred` against `human` (ties in either handled as tau-b does). A constant
  `human` has no order to agree with and raises; a constant `pred` scores 0."""
  pred, human = _pair(pred, human)
  if np.ptp(human) == 0:
    raise ValueError("human is constant: Kendall tau against it is undefined")
  return _tau_b(pred, human)


def grouped_kendall(pred: Any, human: Any, groups: Any) -> float:
  """The mean per-group Kendall tau-b (a group: the systems' outputs of one source segment),
  over the groups whose human scores are not all equal."""
  pred, human = _pair(pred, human)
  groups = np.asarray(groups)
  if groups.shape != pred.shape:
    raise ValueError(f"groups must have one entry per item; got {groups.shape[0]} for "
                     f"{pred.size} items")
  taus = []
  for group in np.unique(groups):
    member = groups == group
    if member.sum() >= 2 and np.ptp(human[member]) > 0:
      taus.append(_tau_b(pred[member], human[member]))
  return float(np.mean(taus)) if taus else float("nan")


def as_matrix(scores: Mapping[str, Any], names: Sequence[str] | None = None
              ) -> tuple[tuple[str, ...], np.ndarray]:
  """(names, [N, K] matrix) of a {metric: [N] scores} mapping, in `names` order if given."""
  if not isinstance(scores, Mapping) or not scores:
    raise ValueError("scores must be a non-empty mapping {metric name: [N] scores}")
  names = tuple(scores) if names is None else tuple(names)
  missing = [n for n in names if n not in scores]
  if missing:
    raise ValueError(f"scores has no metric {missing[0]!r} (it has {', '.join(scores)}); the "
                     "calibration was fitted on it")
  columns = [_vector(scores[n], f"scores[{n!r}]") for n in names]
  lengths = {c.size for c in columns}
  if len(lengths) != 1:
    raise ValueError("scores must give every metric the same number of items; got lengths "
                     + ", ".join(f"{n}={c.size}" for n, c in zip(names, columns)))
  return names, np.stack(columns, axis=1)


@dataclasses.dataclass
class Calibrated:
  """A fitted combination. `weights` (one per metric) for the linear ones, `model` for xgb."""
  method: str
  metric_names: tuple[str, ...]
  weights: np.ndarray | None = None
  intercept: float = 0.0
  model: Any = None
  info: dict = dataclasses.field(default_factory=dict)

  def predict(self, scores: Mapping[str, Any]) -> np.ndarray:
    _, matrix = as_matrix(scores, self.metric_names)
    if self.model is not None:
      return np.asarray(self.model.predict(matrix), np.float64)
    return matrix @ self.weights + self.intercept

  @property
  def num_unused(self) -> int | None:
    """How many metrics got a weight below `SPARSE_WEIGHT` (gp only: the sparsity story)."""
    if self.method != "gp":
      return None
    return int(np.sum(self.weights < SPARSE_WEIGHT))


def _options(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
  if method not in METHODS:
    raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
  known = DEFAULTS[method]
  unknown = [k for k in options if k not in known]
  if unknown:
    allowed = ", ".join(known) or "none"
    raise ValueError(f"unknown option {unknown[0]!r} for method {method!r} (allowed: {allowed})")
  merged = {**known, **options}
  for key in ("init_points", "n_iter", "cv"):
    if key in merged and (not isinstance(merged[key], (int, np.integer)) or merged[key] < 1):
      raise ValueError(f"option {key!r} must be a positive integer, got {merged[key]!r}")
  if method == "gp" and merged["init_points"] + merged["n_iter"] < 1:
    raise ValueError("gp needs at least one evaluation (init_points + n_iter >= 1)")
  return merged


def redraw_if_all_zero(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """An all-zero w scores nothing; the official code redraws it uniformly in [0.01, 1]."""
  return rng.uniform(0.01, 1.0, weights.shape) if not np.any(weights) else weights


def fit_gp(matrix: np.ndarray, human: np.ndarray, seed: int, *, init_points: int, n_iter: int,
           on_evaluation: Callable[[int, float], None] | None = None
           ) -> tuple[np.ndarray, dict]:
  """Bayesian optimisation of w in [0, 1]^K for Kendall tau-b of `matrix @ w` on `human`."""
  bayes_opt = metrics_lib.require_extra("bayes_opt")
  num_metrics = matrix.shape[1]
  keys = [f"w{k:02d}" for k in range(num_metrics)]   # sorted names keep the metric order
  redraw = np.random.default_rng(seed)
  evaluated: list[tuple[float, np.ndarray]] = []

  def objective(**weights):
    w = redraw_if_all_zero(np.asarray([weights[k] for k in keys]), redraw)
    tau = _tau_b(matrix @ w, human)
    evaluated.append((tau, w))
    if on_evaluation:
      on_evaluation(len(evaluated), tau)
    return tau

  optimizer = bayes_opt.BayesianOptimization(f=objective, pbounds={k: (0.0, 1.0) for k in keys},
                                             random_state=seed, verbose=0)
  optimizer.maximize(init_points=init_points, n_iter=n_iter)
  # The best evaluated weights as used (after a redraw), not the proposal that led to them.
  best = int(np.argmax([tau for tau, _ in evaluated]))
  return evaluated[best][1], {"evaluations": len(evaluated),
                              "tau_by_evaluation": [tau for tau, _ in evaluated]}


def fit_xgb(matrix: np.ndarray, human: np.ndarray, seed: int, *, n_iter: int, cv: int,
            n_jobs: int) -> tuple[Any, dict]:
  """`XGBRegressor` with the fixed settings, tuned by `BayesSearchCV` over the official space."""
  xgboost = metrics_lib.require_extra("xgboost")
  skopt = metrics_lib.require_extra("skopt")
  space = metrics_lib.require_extra("skopt.space")
  if cv > matrix.shape[0]:
    raise ValueError(f"option 'cv' = {cv} exceeds the {matrix.shape[0]} training items")
  estimator = xgboost.XGBRegressor(**XGB_FIXED, random_state=seed, n_jobs=n_jobs,
                                   tree_method="hist")
  search = skopt.BayesSearchCV(
      estimator,
      {"n_estimators": space.Categorical(list(XGB_N_ESTIMATORS)),
       "learning_rate": space.Real(*XGB_LEARNING_RATE, prior="log-uniform")},
      n_iter=n_iter, cv=cv, random_state=seed, n_jobs=1)
  search.fit(matrix, human)
  best = {k: (float(v) if k == "learning_rate" else int(v)) for k, v in search.best_params_.items()}
  return search.best_estimator_, {"best_params": best, "cv_r2": float(search.best_score_)}


def calibrate(scores: Mapping[str, Any], human: Any, method: str = "gp", seed: int = 0,
              **options: Any) -> Calibrated:
  """Fits `method` ("gp", "xgb", "linear", "uniform") on {metric: [N] scores} and [N] human
  scores. Options: gp `init_points` (5), `n_iter` (100), `on_evaluation`; xgb `n_iter` (25),
  `cv` (10), `n_jobs` (2)."""
  on_evaluation = options.pop("on_evaluation", None) if method == "gp" else None
  settings = _options(method, options)
  names, matrix = as_matrix(scores)
  human = _vector(human, "human")
  if human.size != matrix.shape[0]:
    raise ValueError(f"human has {human.size} items but scores have {matrix.shape[0]}")
  if np.ptp(human) == 0:
    raise ValueError("human is constant: there is no order to calibrate to")
  start = time.perf_counter()
  model, intercept, info = None, 0.0, {}
  if method == "gp":
    weights, info = fit_gp(matrix, human, seed, on_evaluation=on_evaluation, **settings)
  elif method == "xgb":
    weights = None
    model, info = fit_xgb(matrix, human, seed, **settings)
  elif method == "linear":
    design = np.concatenate([matrix, np.ones((matrix.shape[0], 1))], axis=1)
    solution, *_ = np.linalg.lstsq(design, human, rcond=None)
    weights, intercept = solution[:-1], float(solution[-1])
  else:
    weights = np.full(len(names), 1.0 / len(names))
  info["seconds"] = time.perf_counter() - start
  return Calibrated(method=method, metric_names=names, weights=weights, intercept=intercept,
                    model=model, info=info)
