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
from jaxlab.data import pipeline
from jaxlab.methods.precision_ls import evaluation
from jaxlab.methods.precision_ls import handset
from jaxlab.methods.precision_ls import tasks
from jaxlab.methods.precision_ls import training

GRADIENT_ARCHS = ("baseconv_recipe", "baseconv_plain", "linear_attention", "softmax")
POLYNOMIAL_ARCHS = {"baseconv_recipe": "BaseConv", "linear_attention": "linear attention"}
MULTIPLY_ARCHS = {"multiply_baseconv": "baseconv", "multiply_softmax": "softmax"}
PAPER_SINGLE_ITERATE_MSE = 1e-13   # "MSEs as low as ~1e-13 for single iterates" (2.5M steps)
ORDERS_OF_MAGNITUDE = 100.0


def selected_variants(config: ml_collections.ConfigDict) -> list[str]:
  names = list(config.variants.keys())
  if config.run_variants == "all":
    return names
  chosen = [name.strip() for name in config.run_variants.split(",") if name.strip()]
  for name in chosen:
    if name not in names:
      raise config_lib.ConfigError(
          f"config key 'run_variants' names {name!r}; choose from all, {', '.join(names)}")
  return chosen


def variant_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  return config_lib.with_overrides(config, config.variants[name].to_dict())


def test_batch(config: ml_collections.ConfigDict) -> dict[str, jax.Array]:
  """The first `eval.num_problems` examples of the task's test split, in the run's dtype."""
  task = training.make_task(config)
  builder = least_squares.load(training.builder_config(config, task), config.data.data_dir)
  source = pipeline.data_source(builder, "test")
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
    return {"grad_mse": float(grad_mse), "iterated_mse": float(curve[-1]),
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
      "grad_mse": {}, "iterated_mse": {}, "multiply_mse": {},
  }
  for name, values in per_variant.items():
    if "grad_mse" in values:
      metrics["grad_mse"][name] = values["grad_mse"]
      metrics["iterated_mse"][name] = values["iterated_mse"]
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
      ratio = grad["softmax"] / grad[arch]
      claims.append(results.claim(
          f"{arch}_beats_softmax_gradient",
          f"A polynomial architecture ({label}) learns the gradient step orders of magnitude more "
          "precisely than softmax attention at the same width, depth and step budget.",
          ours=grad[arch], baselines={"softmax": grad["softmax"]},
          paper="~1e-13 (polynomial) vs ~1e-5 plateau (Transformers)",
          holds=ratio >= ORDERS_OF_MAGNITUDE,
          comparison=f"softmax / {arch} = {ratio:.3g} >= {ORDERS_OF_MAGNITUDE:g}"))
  if {"baseconv", "softmax"} <= mult.keys():
    ratio = mult["softmax"] / mult["baseconv"]
    claims.append(results.claim(
        "polynomial_beats_softmax_multiply",
        "Softmax attention cannot represent multiplication exactly and stalls on the multiply "
        "primitive, where BaseConv is orders of magnitude more precise.",
        ours=mult["baseconv"], baselines={"softmax": mult["softmax"]},
        paper="softmax stalls; BaseConv reaches high precision (figure, no table value)",
        holds=ratio >= ORDERS_OF_MAGNITUDE,
        comparison=f"softmax / baseconv = {ratio:.3g} >= {ORDERS_OF_MAGNITUDE:g}"))
  if {"baseconv_recipe", "baseconv_plain"} <= grad.keys():
    ratio = grad["baseconv_plain"] / grad["baseconv_recipe"]
    claims.append(results.claim(
        "recipe_beats_plain",
        "The high-precision recipe (Adam eps 1e-16, EMA filter, LR decay) trains BaseConv to a "
        "lower gradient MSE than plain training (Adam eps 1e-8, no filter, constant LR).",
        ours=grad["baseconv_recipe"], baselines={"baseconv_plain": grad["baseconv_plain"]},
        paper="recipe needed to reach ~1e-13 (ablation figure, no table value)",
        holds=ratio >= 10.0, comparison=f"plain / recipe = {ratio:.3g} >= 10"))
  headline = results.headline(
      "one-step gradient MSE, BaseConv + recipe",
      ours=grad.get("baseconv_recipe", float("nan")), paper=PAPER_SINGLE_ITERATE_MSE)
  return metrics, claims, headline


def plot_iterates(per_variant: dict[str, dict[str, Any]], reference: dict[str, Any]):
  """MSE(x_k, x*) against iteration k for GD, the hand-set BaseConv and each learned model."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  ax.semilogy(reference["gd_curve"], "k-", lw=2, label="explicit GD")
  ax.semilogy(reference["handset_curve"], "C3--", lw=2, label="hand-set BaseConv")
  for i, (name, values) in enumerate(per_variant.items()):
    if "iterated_curve" in values:
      ax.semilogy(values["iterated_curve"], color=f"C{i}", label=f"learned: {name}")
  ax.set_xlabel("iteration k  (x <- x - 0.5 g(x))")
  ax.set_ylabel("MSE(x_k, x*)")
  ax.set_title("Iterating a gradient module (d=5, n=20, float64)")
  ax.grid(True, which="major", alpha=0.3)
  ax.legend(fontsize=8)
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
