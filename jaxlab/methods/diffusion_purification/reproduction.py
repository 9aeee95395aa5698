"""The quick reproduction: classifier, DDPM pretraining, the three fine-tunings, the attacks on
every model, claims and a figure. `experiments/diffusion_purification.py` runs them in order; the
notebook calls them one by one.

Workdir layout (every training resumable through the shared loop): `classifier/`, `pretrain/`,
`finetune/<plain | addt_no_rbgm | addt>/`.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import parallel
from jaxlab.core import results
from jaxlab.core import train_loop
from jaxlab.diffusion import schedules
from jaxlab.methods.diffusion_purification import addt
from jaxlab.methods.diffusion_purification import evaluation
from jaxlab.methods.diffusion_purification import models as models_lib
from jaxlab.methods.diffusion_purification import training

# The purifiers compared: the pretrained DDPM and its three fine-tunings (same budget each).
MODELS = ("pretrained",) + addt.PERTURBATIONS
# Paired per-example differences reported (same images, same attack and purification keys).
PAIRED_COMPARISONS = (("addt", "plain"), ("addt", "pretrained"), ("addt", "addt_no_rbgm"),
                      ("plain", "pretrained"))
# "Far below": the DW-box robust accuracy is at most this fraction of the EOT one.
FAR_BELOW = 0.5
# What the summary keeps of each paired comparison (the claim's `paired` entry too).
PAIRED_FIELDS = ("difference", "stderr", "n", "better")


def selected_models(config) -> list[str]:
  return config_lib.select_names(config, "models", MODELS)


def validate(config: ml_collections.ConfigDict) -> None:
  selected_models(config)
  config_lib.require_choice(config, "model.denoiser", models_lib.DENOISERS)
  config_lib.require_choice(config, "model.parameterization", models_lib.PARAMETERIZATIONS)
  config_lib.require_choice(config, "diffusion.schedule", ("linear", "cosine"))
  config_lib.require_choice(config, "diffusion.variance", schedules.REVERSE_VARIANCES)
  d, a, e = config.diffusion, config.attack, config.eval
  config_lib.require(config.data.size >= 8, "data.size",
                     f"must be at least the digits' 8 pixels, got {config.data.size}")
  config_lib.require(0 <= d.t_star < d.num_steps, "diffusion.t_star",
                     f"must be in [0, diffusion.num_steps = {d.num_steps}), got {d.t_star}")
  config_lib.require(a.epsilon > 0 and a.step_size > 0, "attack.epsilon",
                     "attack.epsilon and attack.step_size must be positive")
  config_lib.require(a.steps >= 1 and a.eot >= 1, "attack.steps",
                     f"attack.steps and attack.eot must be >= 1, got {a.steps}, {a.eot}")
  config_lib.require(e.num_draws >= 1, "eval.num_draws", f"must be >= 1, got {e.num_draws}")
  config_lib.require(0 < e.num_images <= config.data.num_test, "eval.num_images",
                     f"must be in (0, data.num_test = {config.data.num_test}], "
                     f"got {e.num_images}")
  config_lib.require(e.num_images % e.batch_size == 0, "eval.num_images",
                     f"must be a multiple of eval.batch_size = {e.batch_size}")
  config_lib.require(0 <= config.addt.lambda_max < 1, "addt.lambda_max",
                     f"must be in [0, 1), got {config.addt.lambda_max}")


def _steps(config, key: str) -> int:
  return config.train.get(key) or config.train.steps


def _run(experiment, config, steps, workdir, desc):
  return train_loop.run(experiment,
                        config_lib.with_overrides(config, {"train": {"steps": steps}}),
                        workdir, desc=desc)


def train_all(config: ml_collections.ConfigDict, workdir: str
              ) -> tuple[Any, dict[str, Any], float]:
  """(classifier params, {model: EMA denoiser params}, training time of earlier calls)."""
  classifier_steps = _steps(config, "classifier_steps")
  classifier = _run(training.classifier_experiment(config, classifier_steps), config,
                    classifier_steps, os.path.join(workdir, "classifier"), "classifier")
  pretrain_steps = _steps(config, "pretrain_steps")
  pretrain = _run(training.diffusion_experiment(config, pretrain_steps), config, pretrain_steps,
                  os.path.join(workdir, "pretrain"), "DDPM pretraining")
  earlier = classifier.earlier_s + pretrain.earlier_s
  classifier_params = classifier.state["params"]
  denoisers = {}
  for name in metrics_lib.progress_iter(selected_models(config), "fine-tunings",
                                        enabled=config.train.progress):
    if name == "pretrained":
      denoisers[name] = pretrain.state["ema"]
      continue
    run = train_loop.run(
        training.diffusion_experiment(config, config.train.steps, perturbation=name,
                                      init_params=pretrain.state["ema"],
                                      classifier_params=classifier_params),
        config, os.path.join(workdir, "finetune", name), desc=f"fine-tune {name}")
    earlier += run.earlier_s
    denoisers[name] = run.state["ema"]
  return classifier_params, denoisers, earlier


def test_batches(config: ml_collections.ConfigDict):
  """[(x, y)] global batches of the first `eval.num_images` test images (a fixed random order),
  sharded over the data axis; on a pod each process contributes its contiguous slice."""
  test = models_lib.load_split(config, "test")
  order = np.random.default_rng(config.data.seed).permutation(len(test["label"]))
  order = order[:config.eval.num_images]
  mesh = parallel.make_mesh(config.mesh)
  size = config.eval.batch_size
  local = size // jax.process_count()
  start = jax.process_index() * local
  batches = []
  for i in range(0, len(order), size):
    rows = order[i:i + size][start:start + local]
    batches.append(parallel.shard_batch((test["image"][rows], test["label"][rows]), mesh))
  return batches


def evaluate(config: ml_collections.ConfigDict, classifier_params: Any,
             denoisers: dict[str, Any]) -> dict[str, Any]:
  """{"no_defence": {...}, <model>: {clean_acc, robust_acc_eot, robust_acc_dwbox,
  denoise_mse}, "paired_gain": {"<a>_vs_<b>": {protocol: results.paired_comparison}}}, every
  model scored on the same test batches with the same keys (so the examples are the pairs)."""
  with train_loop.precision_scope(config):
    batches = test_batches(config)
    undefended = evaluation.undefended_evaluator(config)
    summary: dict[str, Any] = {"no_defence": evaluation.mean_over_batches([
        undefended(classifier_params, x, y, evaluation.batch_key(config.seed, i))
        for i, (x, y) in enumerate(batches)])}
    evaluate_batch = evaluation.evaluator(config)
    denoising = evaluation.denoising_error(config)
    per_example = {}
    for name in metrics_lib.progress_iter(list(denoisers), "attacks",
                                          enabled=config.train.progress):
      params = denoisers[name]
      per_example[name] = evaluation.concatenate_batches([
          evaluate_batch(classifier_params, params, x, y, evaluation.batch_key(config.seed, i))
          for i, (x, y) in enumerate(batches)])
      summary[name] = {protocol: float(np.mean(values))
                       for protocol, values in per_example[name].items()}
      summary[name]["denoise_mse"] = float(np.mean([
          denoising(params, x, evaluation.batch_key(config.seed + 1, i))
          for i, (x, _) in enumerate(batches)]))
    summary["paired_gain"] = {
        f"{ours}_vs_{baseline}": {protocol: paired_gain(
            per_example[ours][protocol], per_example[baseline][protocol])
                                  for protocol in evaluation.PROTOCOLS}
        for ours, baseline in PAIRED_COMPARISONS
        if ours in per_example and baseline in per_example}
    summary["num_images"] = config.eval.num_images
    return summary


def paired_gain(ours: np.ndarray, baseline: np.ndarray) -> dict[str, Any]:
  comparison = results.paired_comparison(ours, baseline, lower_is_better=False)
  return {field: comparison[field] for field in PAIRED_FIELDS}


def claims(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
  out = []
  pre = summary.get("pretrained")
  if pre:
    out.append(results.claim(
        "dwbox_far_below_stochastic",
        "Robust accuracy of diffusion purification measured under the Deterministic White-Box "
        "(all noises fixed) is far below the stochastic white-box (EOT) figure",
        ours={"dwbox": pre["robust_acc_dwbox"]}, baselines={"eot": pre["robust_acc_eot"]},
        holds=pre["robust_acc_dwbox"] <= FAR_BELOW * pre["robust_acc_eot"],
        paper="robustness collapses under DW-box (stochasticity is the main driver)",
        comparison=f"pretrained: DW-box robust acc <= {FAR_BELOW:g} x EOT robust acc"))
    undefended = summary["no_defence"]["robust_acc_pgd"]
    gain_dwbox = pre["robust_acc_dwbox"] - undefended
    gain_eot = pre["robust_acc_eot"] - undefended
    out.append(results.claim(
        "stochasticity_is_the_main_driver",
        "Most of the robustness purification adds over the undefended classifier comes from "
        "its stochasticity: with every noise fixed (DW-box) the gain largely disappears",
        ours={"dwbox gain": gain_dwbox}, baselines={"eot gain": gain_eot,
                                                    "undefended robust acc": undefended},
        holds=gain_eot > 0 and gain_dwbox <= FAR_BELOW * gain_eot,
        paper="robustness collapses under DW-box (stochasticity is the main driver)",
        comparison=f"pretrained: (DW-box - undefended) <= {FAR_BELOW:g} x (EOT - undefended), "
                   "robust accuracies under the same PGD budget"))
  ours, plain = summary.get("addt"), summary.get("plain")
  if ours and plain and pre:
    paired = summary["paired_gain"]["addt_vs_plain"]
    protocols = ("robust_acc_eot", "robust_acc_dwbox")
    out.append(results.claim(
        "addt_raises_robustness",
        "ADDT (CGPO + RBGM) fine-tuning raises robust accuracy under both the stochastic "
        "white-box and the DW-box, against the same fine-tuning budget with plain noise",
        ours={"eot": ours["robust_acc_eot"], "dwbox": ours["robust_acc_dwbox"],
              **{f"gain {p.removeprefix('robust_acc_')}": paired[p]["difference"]
                 for p in protocols},
              **{f"gain stderr {p.removeprefix('robust_acc_')}": paired[p]["stderr"]
                 for p in protocols}},
        baselines={"plain eot": plain["robust_acc_eot"],
                   "plain dwbox": plain["robust_acc_dwbox"],
                   "pretrained eot": pre["robust_acc_eot"],
                   "pretrained dwbox": pre["robust_acc_dwbox"]},
        holds=all(paired[p]["better"] for p in protocols),
        paired={p.removeprefix("robust_acc_"): paired[p] for p in protocols},
        paper="ADDT improves robustness in both settings",
        comparison=f"paired per-image gain of ADDT over plain fine-tuning > "
                   f"{results.SIGNIFICANCE:g} standard errors, under EOT and under DW-box"))
  headline = None
  if ours and pre:
    headline = results.headline(
        "robust acc, DW-box / EOT: ADDT vs pretrained",
        ours=f"{ours['robust_acc_dwbox']:.3f} / {ours['robust_acc_eot']:.3f} vs "
             f"{pre['robust_acc_dwbox']:.3f} / {pre['robust_acc_eot']:.3f}",
        paper="ADDT raises both; DW-box << EOT (CIFAR-10, not comparable)")
  return out, headline


def plot(summary: dict[str, Any], examples: dict[str, np.ndarray] | None = None):
  """Grouped bars of clean / EOT / DW-box accuracy per model (and, given `examples`, a row of
  clean, DW-box adversarial and purified digits)."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  names = [m for m in MODELS if m in summary]
  rows = 2 if examples else 1
  figure = plt.figure(figsize=(8, 3.4 * rows))
  axis = figure.add_subplot(rows, 1, 1)
  width = 0.8 / len(evaluation.PROTOCOLS)
  for i, protocol in enumerate(evaluation.PROTOCOLS):
    values = [summary[m][protocol] for m in names]
    bars = axis.bar(np.arange(len(names)) + (i - 1) * width, values, width,
                    label=protocol.replace("_", " "))
    axis.bar_label(bars, fmt="%.2f", fontsize=6)
  reference = summary["no_defence"]["robust_acc_pgd"]
  axis.axhline(reference, color="grey", linestyle=":", label=f"no defence, PGD ({reference:.2f})")
  axis.set_xticks(np.arange(len(names)), names)
  axis.set_ylim(0, 1.22)
  axis.set_ylabel("accuracy")
  axis.legend(fontsize=7, loc="upper center", ncol=4, frameon=False)
  axis.set_title(f"Digits, {summary['num_images']} test images: purification under attack")
  if examples:
    keys = list(examples)
    count = examples[keys[0]].shape[0]
    for r, key in enumerate(keys):
      for c in range(count):
        ax = figure.add_subplot(rows * len(keys), count, (len(keys) + r) * count + c + 1)
        ax.imshow(examples[key][c, ..., 0], cmap="gray", vmin=-1, vmax=1)
        ax.axis("off")
        if c == 0:
          ax.set_title(key, fontsize=6, loc="left")
  figure.tight_layout()
  return figure


def examples(config: ml_collections.ConfigDict, classifier_params: Any, denoiser_params: Any,
             count: int = 8) -> dict[str, np.ndarray]:
  """Clean test digits, their DW-box adversarial versions and the purified adversarial images."""
  with train_loop.precision_scope(config):
    test = models_lib.load_split(config, "test")
    index = np.linspace(0, len(test["label"]) - 1, count).astype(int)
    x, y = jnp.asarray(test["image"][index]), jnp.asarray(test["label"][index])
    key = jax.random.split(evaluation.batch_key(config.seed, 0), 4)[3]
    x_adv, purified = evaluation.adversarial_examples(config)(classifier_params, denoiser_params,
                                                              x, y, key)
    return {"clean": np.asarray(x), "DW-box adversarial": np.asarray(x_adv),
            "purified": np.asarray(purified)}
