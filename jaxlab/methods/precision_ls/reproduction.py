"""The quick reproduction's pieces: variant configs, evaluations, the paper's claims, plots.

`experiments/precision_ls.py` runs these in order; a notebook can call them one by one.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import results
from jaxlab.data import least_squares
from jaxlab.methods.precision_ls import evaluation
from jaxlab.methods.precision_ls import handset
from jaxlab.methods.precision_ls import tasks
from jaxlab.methods.precision_ls import training

# The official ablation of the recipe (one component at a time, Adam eps 1e-16 throughout), and
# the reader's "what if I just use Adam" arm.
RECIPE_ARMS = ("recipe", "no_ema", "no_adaptive", "neither")
ADAM_DEFAULT = "adam_default"
ATTENTION_ARMS = {"linear_attention": "linear attention", "softmax": "softmax attention"}
MULTIPLY_ARCHS = {"multiply_baseconv": "baseconv", "multiply_softmax": "softmax"}
CONTINUATIONS = ("continue_recipe", "continue_plain")
# `train.init_from` value for a start from the hand-set BaseConv (perturbed by `train.init_noise`)
# instead of another variant's final parameters.
HANDSET_SOURCE = "handset"
PAPER_SINGLE_ITERATE_MSE = 1e-13   # "MSEs as low as ~1e-13 for single iterates" (2.5M steps)
ORDERS_OF_MAGNITUDE = 2.0          # log10 of the 100x the "orders of magnitude" claims ask for
PLATEAU_FRACTION = 0.1             # "left the plateau": training MSE below a tenth of it


def plateau_mse(config: ml_collections.ConfigDict) -> float:
  """The MSE of g = x - A^T b / n, the analytic plateau of the gradient task: the model has the
  terms linear in the tokens but not (A^T A / n - I) x, whose mean square is (d + 1) / n."""
  return (config.data.d + 1) / config.data.n


def selected_variants(config: ml_collections.ConfigDict) -> list[str]:
  """The variants to run, each after the variant it warm-starts from (`train.init_from`)."""
  names = list(config.variants.keys())
  chosen = names if config.run_variants == "all" else [
      name.strip() for name in config.run_variants.split(",") if name.strip()]
  for name in chosen:
    if name not in names:
      raise config_lib.ConfigError(
          f"config key 'run_variants' names {name!r}; choose from all, {', '.join(names)}")
  ordered: list[str] = []

  def add(name: str, path: tuple[str, ...] = ()) -> None:
    if name in ordered:
      return
    source = warm_start_source(config, name)
    if source and source != HANDSET_SOURCE:
      if source not in names or source in path:
        raise config_lib.ConfigError(
            f"config key 'variants.{name}.train.init_from' = {source!r} is neither another "
            f"variant nor {HANDSET_SOURCE!r}")
      add(source, path + (name,))
    ordered.append(name)

  for name in chosen:
    add(name)
  return ordered


def warm_start_source(config: ml_collections.ConfigDict, name: str) -> str:
  """The variant whose final parameters `name` starts from, HANDSET_SOURCE, or ""."""
  return config_lib.get(config.variants[name], "train.init_from", "")


def initial_params(config: ml_collections.ConfigDict, source: str,
                   final_params: dict[str, Any]) -> Any:
  """Replica-stacked starting parameters of a variant (`config` is its config): None for a fresh
  initialisation, another variant's final parameters, or the hand-set BaseConv with replica r
  perturbed by its own N(0, init_noise^2) noise (seed r)."""
  if not source:
    return None
  if source != HANDSET_SOURCE:
    return final_params[source]
  config_lib.require(config.data.task == "gradient" and config.model.mixer == "baseconv",
                     "train.init_from", "the hand-set start needs a BaseConv on the gradient task")
  config_lib.require(config.train.init_noise >= 0, "train.init_noise",
                     f"must be >= 0, got {config.train.init_noise}")
  task = training.make_task(config)
  model = training.make_model(config, task)
  try:
    exact = handset.handset_gradient_params(jax.device_get(model.init(jax.random.key(0))),
                                            d=config.data.d, n=config.data.n)
  except ValueError as error:
    raise config_lib.ConfigError(f"config key 'train.init_from' = {source!r}: {error}") from error
  key = jax.random.key(config.seed)
  return jax.vmap(lambda r: handset.perturbed(exact, jax.random.fold_in(key, r),
                                              config.train.init_noise))(
      jnp.arange(config.train.num_seeds))


def variant_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  return config_lib.with_overrides(config, config.variants[name].to_dict())


def test_batch(config: ml_collections.ConfigDict) -> dict[str, jax.Array]:
  """The first `eval.num_problems` examples of the task's test split, in the run's dtype."""
  task = training.make_task(config)
  source = least_squares.in_memory_split(training.builder_config(config, task), "test",
                                         config.data.data_dir)
  count = min(config.eval.num_problems, len(source))
  batch = source.__getitems__(list(range(count)))
  return jax.tree.map(lambda x: jnp.asarray(x, training.dtype_of(config)), batch)


def replica(tree: Any, index: int) -> Any:
  return jax.tree.map(lambda x: x[index], tree)


def evaluate_variant(config: ml_collections.ConfigDict, params: Any) -> dict[str, Any]:
  """Per seed (params are replica-stacked): grad_mse and the iterated curve for gradient-task
  models, the test MSE for the rest. Lists have one entry per seed."""
  task = training.make_task(config)
  model = training.make_model(config, task)
  batch = test_batch(config)
  if task.name == "gradient":
    def one_seed(p, b):
      gradient = evaluation.model_gradient(model.apply, p)
      curve = evaluation.iterate(gradient, b, steps=config.eval.learned_iterations,
                                 step_size=config.eval.iterate_step_size)
      return evaluation.gradient_mse(gradient, b), curve
    grad_mse, curves = jax.device_get(jax.jit(jax.vmap(one_seed, (0, None)))(params, batch))
    finals = [float(c[-1]) for c in curves]
    # A poor gradient model can make the iteration diverge; JSON has no NaN/Inf, so record None.
    return {"grad_mse": [float(x) for x in grad_mse],
            "iterated_mse": [x if np.isfinite(x) else None for x in finals],
            "iterated_curve": np.asarray(curves)}
  loss_fn = training.make_loss(model, task)
  errors = jax.device_get(jax.jit(jax.vmap(loss_fn, (0, None)))(params, batch))
  return {"test_mse": [float(x) for x in errors]}


def grad_mse_per_seed(config: ml_collections.ConfigDict, params: Any) -> list[float]:
  """The one-step gradient MSE of each seed of replica-stacked gradient-task `params` (no
  iterates: cheaper than `evaluate_variant`)."""
  model = training.make_model(config, training.make_task(config))
  one_seed = lambda p, b: evaluation.gradient_mse(evaluation.model_gradient(model.apply, p), b)
  errors = jax.device_get(jax.jit(jax.vmap(one_seed, (0, None)))(params, test_batch(config)))
  return [float(x) for x in errors]


def steps_to_leave_plateau(steps: np.ndarray, losses: np.ndarray, plateau: float) -> int | None:
  """The first logged step whose training MSE is below PLATEAU_FRACTION * plateau, or None."""
  below = np.nonzero(np.asarray(losses) < PLATEAU_FRACTION * plateau)[0]
  return int(np.asarray(steps)[below[0]]) if below.size else None


def median(values: list[float | None]) -> float | None:
  """The median over seeds, a None (diverged) counted as +inf; None if most seeds diverged."""
  finite = np.asarray([np.inf if v is None else v for v in values], float)
  value = float(np.median(finite))
  return value if np.isfinite(value) else None


def log10_values(values: list[float | None]) -> np.ndarray:
  return np.log10(np.asarray([np.inf if v is None else v for v in values], float))


def handset_and_gd(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The hand-set BaseConv and explicit GD, iterated on the gradient task's test problems."""
  gradient_config = config_lib.with_overrides(config, {"data": {"task": "gradient"}})
  task = training.make_task(gradient_config)
  width = max(config.model.width, handset.required_width(config.data.d))
  handset_config = config_lib.with_overrides(gradient_config, {"model": dict(
      mixer="baseconv", width=width, depth=max(config.model.depth, 2), use_mlp=False,
      use_layernorm=False, final_layernorm=False, conv_residual=True)})
  model = training.make_model(handset_config, task)
  params = handset.handset_gradient_params(
      jax.device_get(model.init(jax.random.key(0))), d=config.data.d, n=config.data.n)
  batch = test_batch(gradient_config)
  iterate = lambda gradient: jax.jit(lambda b: evaluation.iterate(
      gradient, b, steps=config.eval.handset_iterations,
      step_size=config.eval.iterate_step_size))(batch)
  handset_gradient = evaluation.model_gradient(model.apply, params)
  handset_curve = iterate(handset_gradient)
  gd_curve = iterate(evaluation.exact_gradient)
  return {
      "handset_grad_mse": float(jax.jit(
          lambda b: evaluation.gradient_mse(handset_gradient, b))(batch)),
      "handset_iterated_mse": float(handset_curve[-1]),
      "gd_iterated_mse": float(gd_curve[-1]),
      "handset_curve": np.asarray(handset_curve), "gd_curve": np.asarray(gd_curve),
  }


def summarize(per_variant: dict[str, dict[str, Any]], reference: dict[str, Any],
              plateau_steps: dict[str, list[int | None]] | None = None,
              start_mse: dict[str, list[float]] | None = None,
              ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
  """(metrics, claims, headline). Metrics per arm are medians over seeds with `..._seeds` lists;
  every comparison of two arms is decided over seeds by `results.paired_comparison` on log10
  MSE (seed r of both arms shares its initialisation and data). `start_mse` holds the per-seed
  gradient MSE at which warm-started arms began."""
  metrics: dict[str, Any] = {
      "handset_iterated_mse": reference["handset_iterated_mse"],
      "handset_grad_mse": reference["handset_grad_mse"],
      "gd_iterated_mse": reference["gd_iterated_mse"],
      "grad_mse": {}, "iterated_mse": {}, "multiply_mse": {},
      "grad_mse_seeds": {}, "iterated_mse_seeds": {}, "multiply_mse_seeds": {},
      "iterated_diverged": {},
  }
  if plateau_steps is not None:
    metrics["steps_to_leave_plateau"] = plateau_steps
  if start_mse:
    metrics["start_grad_mse"] = {name: median(values) for name, values in start_mse.items()}
    metrics["start_grad_mse_seeds"] = dict(start_mse)
  for name, values in per_variant.items():
    if "grad_mse" in values:
      metrics["grad_mse"][name] = median(values["grad_mse"])
      metrics["grad_mse_seeds"][name] = values["grad_mse"]
      metrics["iterated_mse"][name] = median(values["iterated_mse"])
      metrics["iterated_mse_seeds"][name] = values["iterated_mse"]
      diverged = sum(v is None for v in values["iterated_mse"])
      if diverged:
        metrics["iterated_diverged"][name] = f"{diverged} of {len(values['iterated_mse'])} seeds"
    elif name in MULTIPLY_ARCHS:
      metrics["multiply_mse"][MULTIPLY_ARCHS[name]] = median(values["test_mse"])
      metrics["multiply_mse_seeds"][MULTIPLY_ARCHS[name]] = values["test_mse"]

  claims = [results.claim(
      "handset_matches_gd",
      "A BaseConv with hand-set weights computes exact GD steps: iterated, it reaches "
      "<= 1e-13 MSE like explicit GD.",
      ours=reference["handset_iterated_mse"],
      baselines={"explicit_gd": reference["gd_iterated_mse"]}, paper=1e-13,
      holds=reference["handset_iterated_mse"] <= 1e-13,
      comparison="handset_iterated_mse <= 1e-13")]
  grad, mult = metrics["grad_mse_seeds"], metrics["multiply_mse_seeds"]
  polynomial = {"recipe": "BaseConv with the recipe", "linear_attention": "linear attention"}
  for arch, label in polynomial.items():
    if {arch, "softmax"} <= grad.keys():
      claims.append(_seed_claim(
          f"{'baseconv' if arch == 'recipe' else arch}_beats_softmax_gradient",
          f"A polynomial architecture ({label}) learns the gradient step orders of magnitude "
          "(>= 100x) more precisely than softmax attention at the same width, depth and steps.",
          ours=(arch, grad[arch]), baseline=("softmax", grad["softmax"]),
          paper="~1e-13 (polynomial) vs ~1e-5 plateau (Transformers)",
          orders=ORDERS_OF_MAGNITUDE))
  if {"baseconv", "softmax"} <= mult.keys():
    claims.append(_seed_claim(
        "polynomial_beats_softmax_multiply",
        "Softmax attention cannot represent multiplication exactly and stalls on the multiply "
        "primitive, where BaseConv is orders of magnitude (>= 100x) more precise.",
        ours=("multiply_baseconv", mult["baseconv"]),
        baseline=("multiply_softmax", mult["softmax"]),
        paper="softmax stalls; BaseConv reaches high precision (figure, no table value)",
        orders=ORDERS_OF_MAGNITUDE))
  ablations = {"no_ema": "without the EMA filter (adaptive LR only)",
               "no_adaptive": "with a step LR schedule instead of the adaptive one (EMA only)",
               "neither": "without either (step schedule, no filter)",
               ADAM_DEFAULT: "than plain Adam (eps 1e-8, no filter, constant LR)"}
  for arm, label in ablations.items():
    if {"recipe", arm} <= grad.keys():
      claims.append(_seed_claim(
          f"recipe_beats_{arm}",
          "The full recipe (EMA filter + adaptive LR, Adam eps 1e-16) trains BaseConv to a "
          f"lower gradient MSE than the same training {label}.",
          ours=("recipe", grad["recipe"]), baseline=(arm, grad[arm]),
          paper="recipe needed to reach ~1e-13 (ablation figure, no table value)", orders=0.0))
  if set(CONTINUATIONS) <= grad.keys():
    claims.append(_seed_claim(
        "recipe_beats_plain_from_warm_start",
        "In the high-precision regime (continuing a BaseConv already below 1e-6 MSE, the same LR "
        "schedule), the recipe's Adam eps 1e-16 and EMA filter lower the gradient MSE further "
        "than Adam with eps 1e-8 and no filter.",
        ours=("continue_recipe", grad["continue_recipe"]),
        baseline=("continue_plain", grad["continue_plain"]),
        paper="recipe needed to reach ~1e-13 (ablation figure, no table value)", orders=0.0))
  headline = results.headline(
      "one-step gradient MSE, BaseConv + recipe (median over seeds)",
      ours=metrics["grad_mse"].get("recipe"), paper=PAPER_SINGLE_ITERATE_MSE)
  return metrics, claims, headline


def _seed_claim(name: str, statement: str, *, ours: tuple[str, list[float | None]],
                baseline: tuple[str, list[float | None]], paper: str,
                orders: float) -> dict[str, Any]:
  """Holds when, over seeds, log10 MSE of `ours` is below the baseline's by more than `orders`
  (2 = 100x) by more than two standard errors of the paired difference."""
  paired = results.paired_comparison(log10_values(ours[1]), log10_values(baseline[1]),
                                     lower_is_better=True, min_effect=orders)
  ours_median, baseline_median = median(ours[1]), median(baseline[1])
  ratio = (baseline_median / ours_median if ours_median and baseline_median is not None
           else float("nan"))
  return results.claim(
      name, statement, ours=ours_median, baselines={baseline[0]: baseline_median}, paper=paper,
      holds=paired["better"], paired=paired,
      comparison=(f"log10 MSE {ours[0]} - {baseline[0]} < -{orders:g} by > 2 SE over seeds "
                  f"(median ratio {baseline[0]} / {ours[0]} = {ratio:.3g}; per seed "
                  f"{ours[0]} {spread(ours[1])}, {baseline[0]} {spread(baseline[1])})"))


def spread(values: list[float | None]) -> str:
  """The range over seeds, e.g. `[2.1e-04, 3.5e-02]` (a diverged seed reads `inf`)."""
  finite = [np.inf if v is None else v for v in values]
  return f"[{min(finite):.2g}, {max(finite):.2g}]"


def plot_iterates(per_variant: dict[str, dict[str, Any]], reference: dict[str, Any]):
  """MSE(x_k, x*) against iteration k for GD, the hand-set BaseConv and each learned model
  (the median over its seeds).

  The y-range follows the converging curves; a diverging model is cut at the top and labelled.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  ax.semilogy(reference["gd_curve"], "k-", lw=2, label="explicit GD")
  ax.semilogy(reference["handset_curve"], "--", color="tab:red", lw=2, label="hand-set BaseConv")
  colors = iter(["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
                 "tab:gray", "tab:olive", "tab:cyan"])
  curves = [reference["gd_curve"], reference["handset_curve"]]
  for name, values in per_variant.items():
    if "iterated_curve" in values:
      seeds = np.asarray(values["iterated_curve"], dtype=float)
      curve = np.median(np.where(np.isfinite(seeds), seeds, np.inf), axis=0)
      diverged = sum(v is None for v in values["iterated_mse"])
      label = f"learned: {name}" + (f" ({diverged} seed(s) diverge)" if diverged else "")
      ax.semilogy(curve, color=next(colors), label=label + " (median)")
      curves.append(curve)
  finite = np.concatenate([c[np.isfinite(c) & (c > 0)] for c in curves])
  ax.set_ylim(finite.min() / 3, 30 * max(float(c[0]) for c in curves))
  ax.set_xlabel("iteration k  (x <- x - 0.5 g(x))")
  ax.set_ylabel("MSE(x_k, x*)")
  ax.set_title("Iterating a gradient module (d=5, n=20, float64)")
  ax.grid(True, which="major", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def plot_training(curves: dict[str, tuple[np.ndarray, list[np.ndarray]]],
                  plateau: float | None = None):
  """Training MSE against step: every seed of every arm (one colour per arm), and the analytic
  plateau of the gradient task, so where each arm leaves it can be read off."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7.2, 4.6))
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for (name, (steps, per_seed)), color in zip(curves.items(), colors * 3):
    for index, values in enumerate(per_seed):
      ax.semilogy(steps, values, color=color, lw=1, alpha=0.8,
                  label=name if index == 0 else None)
  if plateau is not None:
    ax.axhline(plateau, color="k", ls=":", lw=1, label="plateau (d+1)/n")
    ax.axhline(PLATEAU_FRACTION * plateau, color="k", ls="--", lw=0.8,
               label="left the plateau")
  ax.set_xlabel("step")
  ax.set_ylabel("training MSE (one line per seed)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  return fig
