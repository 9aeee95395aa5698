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

GRADIENT_ARCHS = ("baseconv_recipe", "baseconv_plain", "linear_attention", "softmax")
POLYNOMIAL_ARCHS = {"baseconv_recipe": "BaseConv", "linear_attention": "linear attention"}
MULTIPLY_ARCHS = {"multiply_baseconv": "baseconv", "multiply_softmax": "softmax"}
CONTINUATIONS = ("continue_recipe", "continue_plain")
PAPER_SINGLE_ITERATE_MSE = 1e-13   # "MSEs as low as ~1e-13 for single iterates" (2.5M steps)
ORDERS_OF_MAGNITUDE = 100.0


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
    if source:
      if source not in names or source in path:
        raise config_lib.ConfigError(
            f"config key 'variants.{name}.train.init_from' = {source!r} is not another variant")
      add(source, path + (name,))
    ordered.append(name)

  for name in chosen:
    add(name)
  return ordered


def warm_start_source(config: ml_collections.ConfigDict, name: str) -> str:
  """The variant whose final parameters `name` starts from, or ""."""
  return config_lib.get(config.variants[name], "train.init_from", "")


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


def evaluate_variant(config: ml_collections.ConfigDict, params: Any) -> dict[str, Any]:
  """grad_mse + the iterated curve for gradient-task models; test MSE for the rest."""
  task = training.make_task(config)
  model = training.make_model(config, task)
  batch = test_batch(config)
  if task.name == "gradient":
    gradient = evaluation.model_gradient(model.apply, params)
    grad_mse = jax.jit(lambda b: evaluation.gradient_mse(gradient, b))(batch)
    curve = jax.jit(lambda b: evaluation.iterate(
        gradient, b, steps=config.eval.learned_iterations,
        step_size=config.eval.iterate_step_size))(batch)
    final = float(curve[-1])
    # A poor gradient model can make the iteration diverge; JSON has no NaN/Inf, so record None.
    return {"grad_mse": float(grad_mse), "iterated_mse": final if np.isfinite(final) else None,
            "iterated_curve": np.asarray(curve)}
  loss_fn = training.make_loss(model, task)
  return {"test_mse": float(jax.jit(loss_fn)(params, batch))}


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


def summarize(per_variant: dict[str, dict[str, Any]], reference: dict[str, Any]
              ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
  """(metrics, claims, headline) in the shape the issue asks for."""
  metrics: dict[str, Any] = {
      "handset_iterated_mse": reference["handset_iterated_mse"],
      "handset_grad_mse": reference["handset_grad_mse"],
      "gd_iterated_mse": reference["gd_iterated_mse"],
      "grad_mse": {}, "iterated_mse": {}, "multiply_mse": {}, "iterated_diverged": [],
  }
  for name, values in per_variant.items():
    if "grad_mse" in values:
      metrics["grad_mse"][name] = values["grad_mse"]
      metrics["iterated_mse"][name] = values["iterated_mse"]
      if values["iterated_mse"] is None:
        metrics["iterated_diverged"].append(name)
    elif name in MULTIPLY_ARCHS:
      metrics["multiply_mse"][MULTIPLY_ARCHS[name]] = values["test_mse"]

  claims = [results.claim(
      "handset_matches_gd",
      "A BaseConv with hand-set weights computes exact GD steps: iterated, it reaches "
      "<= 1e-13 MSE like explicit GD.",
      ours=reference["handset_iterated_mse"],
      baselines={"explicit_gd": reference["gd_iterated_mse"]}, paper=1e-13,
      holds=reference["handset_iterated_mse"] <= 1e-13,
      comparison="handset_iterated_mse <= 1e-13")]
  grad, mult = metrics["grad_mse"], metrics["multiply_mse"]
  for arch, label in POLYNOMIAL_ARCHS.items():
    if {arch, "softmax"} <= grad.keys():
      claims.append(_ratio_claim(
          f"{arch}_beats_softmax_gradient",
          f"A polynomial architecture ({label}) learns the gradient step orders of magnitude "
          "more precisely than softmax attention at the same width, depth and step budget.",
          ours=(arch, grad[arch]), baseline=("softmax", grad["softmax"]),
          paper="~1e-13 (polynomial) vs ~1e-5 plateau (Transformers)"))
  if {"baseconv", "softmax"} <= mult.keys():
    claims.append(_ratio_claim(
        "polynomial_beats_softmax_multiply",
        "Softmax attention cannot represent multiplication exactly and stalls on the multiply "
        "primitive, where BaseConv is orders of magnitude more precise.",
        ours=("baseconv", mult["baseconv"]), baseline=("softmax", mult["softmax"]),
        paper="softmax stalls; BaseConv reaches high precision (figure, no table value)"))
  if {"baseconv_recipe", "baseconv_plain"} <= grad.keys():
    claims.append(_ratio_claim(
        "recipe_beats_plain",
        "The high-precision recipe (Adam eps 1e-16, EMA filter, adaptive LR) trains BaseConv to "
        "a lower gradient MSE than plain training (Adam eps 1e-8, no filter, constant LR).",
        ours=("baseconv_recipe", grad["baseconv_recipe"]),
        baseline=("baseconv_plain", grad["baseconv_plain"]),
        paper="recipe needed to reach ~1e-13 (ablation figure, no table value)", factor=10.0))
  if set(CONTINUATIONS) <= grad.keys():
    claims.append(_ratio_claim(
        "recipe_beats_plain_from_warm_start",
        "Continuing a trained BaseConv, the recipe lowers the gradient MSE further than plain "
        "training with the same steps (the recipe targets the high-precision regime).",
        ours=("continue_recipe", grad["continue_recipe"]),
        baseline=("continue_plain", grad["continue_plain"]),
        paper="recipe needed to reach ~1e-13 (ablation figure, no table value)", factor=10.0))
  headline = results.headline(
      "one-step gradient MSE, BaseConv + recipe",
      ours=grad.get("baseconv_recipe"), paper=PAPER_SINGLE_ITERATE_MSE)
  return metrics, claims, headline


def _ratio_claim(name: str, statement: str, *, ours: tuple[str, float],
                 baseline: tuple[str, float], paper: str,
                 factor: float = ORDERS_OF_MAGNITUDE) -> dict[str, Any]:
  """Holds when the baseline's error is at least `factor` times ours."""
  ratio = baseline[1] / ours[1]
  return results.claim(name, statement, ours=ours[1], baselines={baseline[0]: baseline[1]},
                       paper=paper, holds=ratio >= factor,
                       comparison=f"{baseline[0]} / {ours[0]} = {ratio:.3g} >= {factor:g}")


def plot_iterates(per_variant: dict[str, dict[str, Any]], reference: dict[str, Any]):
  """MSE(x_k, x*) against iteration k for GD, the hand-set BaseConv and each learned model.

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
      curve = np.asarray(values["iterated_curve"], dtype=float)
      label = f"learned: {name}" + (" (diverges)" if values["iterated_mse"] is None else "")
      ax.semilogy(curve, color=next(colors), label=label)
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


def plot_training(curves: dict[str, tuple[np.ndarray, np.ndarray]]):
  """Training loss against step for every variant."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for name, (steps, values) in curves.items():
    ax.semilogy(steps, values, label=name)
  ax.set_xlabel("step")
  ax.set_ylabel("training MSE")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig
