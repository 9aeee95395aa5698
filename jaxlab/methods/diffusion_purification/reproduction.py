"""The quick reproduction: classifier, DDPM pretraining, the three fine-tunings, the attacks on
every model, claims and a figure. `experiments/diffusion_purification.py` runs them in order; the
notebook calls them one by one.

Workdir layout (every training resumable through the shared loop): `classifier/`,
`finetune/<plain | addt_no_rbgm | addt>/`; the pretrained DDPM lives in the prior cache
(`jaxlab.diffusion.priors`), trained there on first use.
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
from jaxlab.diffusion import priors
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
# "Most of the gain disappears": the DW-box gain over the undefended classifier is at most this
# fraction of the EOT gain.
FAR_BELOW = 0.5
# The DW-box attack has converged when PGD-<steps> and PGD-<convergence_steps> differ by at most
# this much robust accuracy.
CONVERGED_WITHIN = 0.01
# The purifiers whose DW-box attack also runs on to `attack.convergence_steps` steps.
CONVERGENCE_MODELS = ("pretrained",)
# What the summary keeps of each paired comparison (the claim's `paired` entry too).
PAIRED_FIELDS = ("difference", "stderr", "n", "better")


def selected_models(config) -> list[str]:
  return config_lib.select_names(config, "models", MODELS)


def validate(config: ml_collections.ConfigDict) -> None:
  selected_models(config)
  try:
    models_lib.prior_spec(config)
  except priors.SpecError as e:
    raise config_lib.ConfigError(f"config key 'prior.{e.key}' {e.reason}") from None
  config_lib.require_choice(config, "prior.parameterization", models_lib.PARAMETERIZATIONS)
  config_lib.require_choice(config, "diffusion.variance", schedules.REVERSE_VARIANCES)
  d, a, e = config.diffusion, config.attack, config.eval
  config_lib.require(config.data.size >= 8, "data.size",
                     f"must be at least the digits' 8 pixels, got {config.data.size}")
  num_steps = config.prior.num_steps
  config_lib.require(0 <= d.t_star < num_steps, "diffusion.t_star",
                     f"must be in [0, prior.num_steps = {num_steps}), got {d.t_star}")
  config_lib.require(a.epsilon > 0 and a.step_size > 0, "attack.epsilon",
                     "attack.epsilon and attack.step_size must be positive")
  config_lib.require(a.steps >= 1 and a.eot >= 1, "attack.steps",
                     f"attack.steps and attack.eot must be >= 1, got {a.steps}, {a.eot}")
  config_lib.require(e.num_draws >= 1, "eval.num_draws", f"must be >= 1, got {e.num_draws}")
  config_lib.require(e.num_seeds >= 1, "eval.num_seeds", f"must be >= 1, got {e.num_seeds}")
  config_lib.require(a.convergence_steps == 0 or a.convergence_steps > a.steps,
                     "attack.convergence_steps",
                     f"must be 0 (no check) or more than attack.steps = {a.steps}, "
                     f"got {a.convergence_steps}")
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


def load_prior(config: ml_collections.ConfigDict) -> priors.Prior:
  """The pretrained DDPM from the prior cache (trained there on first use)."""
  return priors.load_or_train(models_lib.prior_spec(config), config.prior.cache_dir,
                              data_dir=config.data.data_dir, progress=config.train.progress,
                              log_every=config.train.log_every,
                              ckpt_every=config.train.ckpt_every, mesh=config.mesh.to_dict())


def train_all(config: ml_collections.ConfigDict, workdir: str
              ) -> tuple[Any, dict[str, Any], float, dict[str, Any]]:
  """(classifier params, {model: EMA denoiser params}, training time of earlier calls, the
  prior's summary: loaded from the cache or trained, and its training time)."""
  classifier_steps = _steps(config, "classifier_steps")
  classifier = _run(training.classifier_experiment(config, classifier_steps), config,
                    classifier_steps, os.path.join(workdir, "classifier"), "classifier")
  prior = load_prior(config)
  # A prior resumed here counts its earlier calls; one loaded was paid for by another run.
  earlier = classifier.earlier_s + (prior.train_s - prior.call_s
                                    if prior.source == "resumed" else 0.0)
  classifier_params = classifier.state["params"]
  denoisers = {}
  for name in metrics_lib.progress_iter(selected_models(config), "fine-tunings",
                                        enabled=config.train.progress):
    if name == "pretrained":
      denoisers[name] = prior.params
      continue
    run = train_loop.run(
        training.diffusion_experiment(config, config.train.steps, perturbation=name,
                                      init_params=prior.params,
                                      classifier_params=classifier_params),
        config, os.path.join(workdir, "finetune", name), desc=f"fine-tune {name}")
    earlier += run.earlier_s
    denoisers[name] = run.state["ema"]
  return classifier_params, denoisers, earlier, prior.summary()


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
  """{"no_defence": {...}, <model>: {clean_acc, robust_acc_eot, robust_acc_dwbox, denoise_mse,
  seed_std: {protocol}, per_seed: {protocol: [mean per purification seed]}}, "paired_gain":
  {"<a>_vs_<b>": {protocol: results.paired_comparison}}, "stochasticity": ..., "dwbox_convergence":
  ...}. Every model is scored on the same test batches with the same keys in each of
  `eval.num_seeds` purification seeds (so the examples are the pairs; an image's accuracy is its
  mean over the seeds). The models in CONVERGENCE_MODELS also run the DW-box attack on to
  `attack.convergence_steps` steps, in the first seed."""
  with train_loop.precision_scope(config):
    batches = test_batches(config)
    undefended = evaluation.undefended_evaluator(config)
    undefended_per_example = evaluation.concatenate_batches([
        undefended(classifier_params, x, y, evaluation.batch_key(config.seed, i))
        for i, (x, y) in enumerate(batches)])
    summary: dict[str, Any] = {"no_defence": {
        name: float(np.mean(values)) for name, values in undefended_per_example.items()}}
    evaluators = {check: evaluation.evaluator(config, check_convergence=check)
                  for check in (False, True)}
    denoising = evaluation.denoising_error(config)
    per_example = {}
    num_seeds = config.eval.num_seeds
    runs = [(name, seed) for name in denoisers for seed in range(num_seeds)]
    per_seed: dict[str, list[dict[str, np.ndarray]]] = {name: [] for name in denoisers}
    for name, seed in metrics_lib.progress_iter(runs, "attacks", enabled=config.train.progress):
      check = seed == 0 and name in CONVERGENCE_MODELS and config.attack.convergence_steps > 0
      per_seed[name].append(evaluation.concatenate_batches([
          evaluators[check](classifier_params, denoisers[name], x, y,
                            evaluation.batch_key(config.seed, i, seed))
          for i, (x, y) in enumerate(batches)]))
    for name, seeds in per_seed.items():
      per_example[name] = {protocol: np.mean([s[protocol] for s in seeds], axis=0)
                           for protocol in evaluation.PROTOCOLS}
      summary[name] = {protocol: float(np.mean(values))
                       for protocol, values in per_example[name].items()}
      if evaluation.DWBOX_LONG in seeds[0]:
        # The longer attack ran in the first seed only: it pairs with that seed's PGD-<steps>.
        per_example[name][evaluation.DWBOX_LONG] = seeds[0][evaluation.DWBOX_LONG]
        per_example[name]["robust_acc_dwbox_first_seed"] = seeds[0]["robust_acc_dwbox"]
        summary[name][evaluation.DWBOX_LONG] = float(np.mean(seeds[0][evaluation.DWBOX_LONG]))
      seed_means = {protocol: [float(np.mean(s[protocol])) for s in seeds]
                    for protocol in evaluation.PROTOCOLS}
      summary[name]["seed_std"] = {protocol: float(np.std(values, ddof=1)) if num_seeds > 1
                                   else 0.0 for protocol, values in seed_means.items()}
      summary[name][results.PER_SEED_KEY] = seed_means
      summary[name]["denoise_mse"] = float(np.mean([
          denoising(denoisers[name], x, evaluation.batch_key(config.seed + 1, i))
          for i, (x, _) in enumerate(batches)]))
    summary["paired_gain"] = {
        f"{ours}_vs_{baseline}": {protocol: paired_gain(
            per_example[ours][protocol], per_example[baseline][protocol])
                                  for protocol in evaluation.PROTOCOLS}
        for ours, baseline in PAIRED_COMPARISONS
        if ours in per_example and baseline in per_example}
    pre = per_example.get("pretrained")
    if pre is not None:
      summary["stochasticity"] = stochasticity_test(
          pre["robust_acc_eot"], pre["robust_acc_dwbox"], undefended_per_example["robust_acc_pgd"])
      if evaluation.DWBOX_LONG in pre:
        comparison = results.paired_comparison(pre[evaluation.DWBOX_LONG],
                                               pre["robust_acc_dwbox_first_seed"],
                                               lower_is_better=False)
        summary["dwbox_convergence"] = {
            **{field: comparison[field] for field in PAIRED_FIELDS[:3]},
            "steps": config.attack.steps, "long_steps": config.attack.convergence_steps}
    summary["num_images"] = config.eval.num_images
    summary["num_seeds"] = num_seeds
    return summary


def stochasticity_test(eot: np.ndarray, dwbox: np.ndarray, undefended: np.ndarray
                       ) -> dict[str, Any]:
  """The paper's "stochasticity is the main driver" as a paired test over images: the DW-box gain
  over the undefended classifier is at most FAR_BELOW of the EOT gain, i.e. per image
  (eot - u) - (dwbox - u) / FAR_BELOW >= 0, decided by `results.paired_comparison` (> 2 standard
  errors)."""
  ours = eot - undefended
  baseline = (dwbox - undefended) / FAR_BELOW
  comparison = results.paired_comparison(ours, baseline, lower_is_better=False)
  return {"eot_gain": float(np.mean(ours)), "dwbox_gain": float(np.mean(dwbox - undefended)),
          **{field: comparison[field] for field in PAIRED_FIELDS}}


def paired_gain(ours: np.ndarray, baseline: np.ndarray) -> dict[str, Any]:
  comparison = results.paired_comparison(ours, baseline, lower_is_better=False)
  return {field: comparison[field] for field in PAIRED_FIELDS}


def claims(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
  out = []
  pre = summary.get("pretrained")
  test = summary.get("stochasticity")
  if pre and test:
    undefended = summary["no_defence"]["robust_acc_pgd"]
    out.append(results.claim(
        "stochasticity_is_the_main_driver",
        "Most of the robustness purification adds over the undefended classifier comes from "
        "its stochasticity: with every noise fixed (DW-box) the gain largely disappears",
        ours={"dwbox gain": test["dwbox_gain"]},
        baselines={"eot gain": test["eot_gain"], "undefended robust acc": undefended},
        holds=test["eot_gain"] > 0 and bool(test["better"]),
        paired={"eot gain - dwbox gain / " + f"{FAR_BELOW:g}": test},
        paper="robustness collapses under DW-box (stochasticity is the main driver)",
        comparison=f"pretrained: (DW-box - undefended) <= {FAR_BELOW:g} x (EOT - undefended) by "
                   f"more than {results.SIGNIFICANCE:g} paired standard errors over the images, "
                   "robust accuracies under the same PGD budget"))
  convergence = summary.get("dwbox_convergence")
  if pre and convergence:
    steps, long_steps = convergence["steps"], convergence["long_steps"]
    out.append(results.claim(
        "dwbox_attack_converged",
        f"The DW-box attack has converged: PGD-{steps} and PGD-{long_steps} give the same "
        "robust accuracy within one point",
        ours={f"pgd{long_steps}": pre[evaluation.DWBOX_LONG],
              "difference": convergence["difference"], "stderr": convergence["stderr"]},
        baselines={f"pgd{steps} (same seed)": pre[evaluation.DWBOX_LONG]
                   - convergence["difference"]},
        holds=abs(convergence["difference"]) <= CONVERGED_WITHIN,
        paper="the DW-box evaluation is an attack run to convergence",
        comparison=f"pretrained: |DW-box robust acc at PGD-{long_steps} - at PGD-{steps}| <= "
                   f"{CONVERGED_WITHIN:g}"))
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
