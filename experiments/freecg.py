"""freecg reproduction: FreeCG against ViSNet, SchNet and a NequIP-like model on EMT metal MD.

  python -m experiments.freecg --config=configs/freecg.py:quick

For each system (quick: `cu13`) the MD trajectory is generated once by ASE (TFDS cache), then
every model trains for `train.steps` steps with the official FreeCG loss and schedule, its seeds
as vmapped replicas of one compiled epoch (resumable: `<workdir>/<system>/<model>/`). Each model
is then scored on the test frames (energy and force MAE), on its equivariance error under a
random O(3) transform, its ms per training step and its parameter count. Writes
`<workdir>/results.json` (quick: `results/freecg.json`; long: `results/freecg_long.json`) and
the validation curves.
"""
from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
import numpy as np

from jaxlab.core import cli
from jaxlab.core import config as config_lib
from jaxlab.core import parallel
from jaxlab.core import results
from jaxlab.data import md_emt
from jaxlab.methods.freecg import training

SLUG = "freecg"
EQUIVARIANCE_TOLERANCE = 1e-4
PAPER = "state-of-the-art force MAE on MD17 / rMD17 / MD22 (the note has no table: qualitative)"


def options(config: ml_collections.ConfigDict) -> tuple[list[str], list[str]]:
  models = config_lib.select_names(config, "models", training.MODELS)
  systems = config_lib.select_names(config, "systems", md_emt.SYSTEMS)
  config_lib.require(config.num_seeds >= 1, "num_seeds", "must be >= 1")
  m = config.model
  try:
    training.model_settings(m)
  except ValueError as error:
    raise config_lib.ConfigError(f"config key 'model.groups': {error}") from None
  config_lib.require(m.channels % m.num_heads == 0, "model.num_heads",
                     f"must divide model.channels ({m.channels}), got {m.num_heads}")
  config_lib.require(m.channels % 8 == 0, "model.channels",
                     "must be a multiple of 8 (the head halves it, NequIP splits it by 8)")
  config_lib.require_choice(config, "model.vecnorm_type", ("none", "max_min", "rms"))
  config_lib.require_choice(config, "model.tp_implementation", ("contraction", "e3nn"))
  d = config.data
  config_lib.require(d.num_train + d.num_val < d.num_frames, "data.num_frames",
                     "must exceed data.num_train + data.num_val (the rest is the test split)")
  config_lib.require(config.train.batch_size <= d.num_train, "train.batch_size",
                     f"exceeds the {d.num_train} training frames")
  return models, systems


def train_settings(config: ml_collections.ConfigDict, name: str) -> training.TrainSettings:
  o = config.optim
  return training.TrainSettings(
      name=name, model=training.model_settings(config.model, name),
      batch_size=int(config.train.batch_size), learning_rate=float(o.learning_rate),
      warmup_steps=int(o.warmup_steps), plateau_factor=float(o.plateau_factor),
      plateau_patience=int(o.plateau_patience), min_learning_rate=float(o.min_learning_rate),
      energy_weight=float(o.energy_weight), force_weight=float(o.force_weight),
      energy_ema=float(o.energy_ema))


def load_system(config: ml_collections.ConfigDict, system: str) -> dict[str, dict]:
  d = config.data
  data_config = md_emt.md_emt_config(system, num_frames=d.num_frames, num_train=d.num_train,
                                     num_val=d.num_val, seed=d.md_seed)
  splits = {name: md_emt.load_arrays(split, data_config, d.data_dir)
            for name, split in (("train", "train"), ("val", "validation"), ("test", "test"))}
  splits["test"] = {k: v[:d.num_test_eval] for k, v in splits["test"].items()}
  return splits


def fit_and_score(config, name, system, splits, seeds, mesh, workdir) -> dict:
  """Trains (or resumes) one model on one system and scores every seed; cached in
  `<workdir>/<system>/<name>/summary.json` once the run is complete."""
  model_dir = os.path.join(workdir, system, name)
  summary_path = os.path.join(model_dir, "summary.json")
  if os.path.exists(summary_path):
    with open(summary_path, encoding="utf-8") as f:
      summary = json.load(f)
    if summary["steps"] == config.train.steps and summary["seeds"] == seeds:
      return summary
  settings = train_settings(config, name)
  run = training.train(settings, seeds, splits["train"], splits["val"],
                       steps=config.train.steps, mesh=mesh, workdir=model_dir,
                       ckpt_every_epochs=config.train.ckpt_every,
                       progress=config.train.progress)
  params = run.state["params"]
  test = training.batched(training.device_arrays(splits["test"]),
                          min(config.eval.batch_size, len(splits["test"]["energy"])))
  scores = jax.device_get(training.evaluation_function(settings)(params, test))
  frames = training.device_arrays({k: v[:config.eval.equivariance_frames]
                                   for k, v in splits["test"].items()})
  equivariance = jax.device_get(training.equivariance_function(settings)(
      params, frames, jax.random.key(config.seed + 17)))
  summary = {
      "steps": int(config.train.steps), "seeds": list(seeds),
      "per_seed": {"energy_mae_mev": np.asarray(scores["energy_mae_mev"]).tolist(),
                   "force_mae_mev_a": np.asarray(scores["force_mae_mev_a"]).tolist(),
                   "equivariance_error": np.asarray(equivariance).tolist()},
      "energy_mae_mev": float(np.mean(scores["energy_mae_mev"])),
      "force_mae_mev_a": float(np.mean(scores["force_mae_mev_a"])),
      "equivariance_error": float(np.max(equivariance)),
      "ms_per_step": round(float(run.ms_per_step), 2),
      "params": training.parameter_count(run.state),
      "train_s": round(run.wall_s + run.earlier_s, 1),
      "curve": {"steps": run.curve_steps.tolist(),
                **{k: np.asarray(v).tolist() for k, v in run.curves.items()}},
  }
  if jax.process_index() == 0:
    os.makedirs(model_dir, exist_ok=True)
    with open(summary_path, "w", encoding="utf-8") as f:
      json.dump(summary, f)
  return summary


def claims_of(metrics: dict, seeds: list[int]) -> list[dict]:
  out = []
  paired_ok = len(seeds) >= 2
  for system, models in metrics.items():
    if "freecg" not in models:
      continue
    ours = models["freecg"]
    ours_forces = ours["per_seed"]["force_mae_mev_a"]

    def paired(baseline: str):
      return results.paired_comparison(ours_forces,
                                       models[baseline]["per_seed"]["force_mae_mev_a"],
                                       lower_is_better=True)

    rivals = [b for b in ("visnet", "schnet") if b in models]
    if rivals and paired_ok:
      comparisons = {b: paired(b) for b in rivals}
      out.append(results.claim(
          f"{system}: force MAE below ViSNet and SchNet",
          "FreeCG's force MAE is lower than ViSNet's (the same network without the CG "
          "transform) and SchNet's, at the same width, depth and steps.",
          ours=round(ours["force_mae_mev_a"], 2),
          baselines={b: round(models[b]["force_mae_mev_a"], 2) for b in rivals},
          paper=PAPER, holds=all(c["better"] for c in comparisons.values()),
          comparison="paired over seeds, each difference below 0 by > 2 SE",
          paired=comparisons))
    if "nequip" in models and paired_ok:
      comparison = paired("nequip")
      faster = ours["ms_per_step"] < models["nequip"]["ms_per_step"]
      out.append(results.claim(
          f"{system}: force MAE <= NequIP-like at fewer ms per step",
          "FreeCG matches or beats an equivariant tensor-product network (NequIP-like) in "
          "force MAE while a training step costs less time.",
          ours=f"{ours['force_mae_mev_a']:.2f} meV/A, {ours['ms_per_step']:.1f} ms",
          baselines={"nequip": f"{models['nequip']['force_mae_mev_a']:.2f} meV/A, "
                               f"{models['nequip']['ms_per_step']:.1f} ms"},
          paper="FreeCG beats equivariant baselines at a lower cost (qualitative)",
          holds=comparison["difference"] <= 0 and faster,
          comparison="mean paired difference <= 0 and ms_per_step lower", paired=comparison))
    if "freecg_no_shuffle" in models and paired_ok:
      comparison = paired("freecg_no_shuffle")
      out.append(results.claim(
          f"{system}: abstract-edge shuffling helps",
          "FreeCG with the channel shuffle after the grouped CG has a lower force MAE than "
          "without it.",
          ours=round(ours["force_mae_mev_a"], 2),
          baselines={"freecg_no_shuffle": round(models["freecg_no_shuffle"]["force_mae_mev_a"],
                                                2)},
          paper="shuffling improves accuracy (ablation, qualitative)",
          holds=comparison["better"], comparison="paired over seeds, below 0 by > 2 SE",
          paired=comparison))
    out.append(results.claim(
        f"{system}: equivariance",
        "Energies are invariant and forces equivariant under O(3) (relative error < 1e-4).",
        ours=ours["equivariance_error"], paper="exact (by construction)",
        baselines={m: v["equivariance_error"] for m, v in models.items() if m != "freecg"},
        holds=ours["equivariance_error"] < EQUIVARIANCE_TOLERANCE,
        comparison=f"max relative change of E and rotated F < {EQUIVARIANCE_TOLERANCE}"))
  return out


def plot(metrics: dict):
  import matplotlib  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  systems = list(metrics)
  figure, axes = plt.subplots(len(systems), 2, figsize=(11, 4 * len(systems)), squeeze=False)
  for row, system in enumerate(systems):
    curve_axis, cost_axis = axes[row]
    for name, summary in metrics[system].items():
      steps = np.asarray(summary["curve"]["steps"])
      values = np.asarray(summary["curve"]["val/force_mae_mev_a"], float).reshape(-1, len(steps))
      if steps.size:
        line, = curve_axis.plot(steps, values.mean(0), marker="o", label=name)
        curve_axis.fill_between(steps, values.min(0), values.max(0), alpha=0.2,
                                color=line.get_color())
      cost_axis.scatter(summary["ms_per_step"], summary["force_mae_mev_a"])
      cost_axis.annotate(name, (summary["ms_per_step"], summary["force_mae_mev_a"]))
    curve_axis.set(xlabel="training step", ylabel="validation force MAE (meV/A)",
                   title=f"{system}: validation force MAE (mean, min-max over seeds)",
                   yscale="log")
    curve_axis.legend(fontsize=8)
    cost_axis.set(xlabel="ms per training step (all seeds)", ylabel="test force MAE (meV/A)",
                  title=f"{system}: accuracy against cost", xscale="log", yscale="log")
    # Minor-tick labels of a log axis spanning one decade overlap each other.
    cost_axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  figure.tight_layout()
  return figure


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  models, systems = options(config)
  mesh = parallel.make_mesh(config.mesh)
  seeds = list(range(config.seed, config.seed + config.num_seeds))
  metrics: dict[str, dict] = {}
  data_s = 0.0
  for system in systems:
    began = time.perf_counter()
    splits = load_system(config, system)
    data_s += time.perf_counter() - began
    metrics[system] = {name: fit_and_score(config, name, system, splits, seeds, mesh, workdir)
                       for name in models}
  results.save_figure(plot(metrics), workdir, "curves.png", SLUG, config)
  headline = None
  first = metrics[systems[0]]
  if "freecg" in first:
    others = [m for m in ("visnet", "schnet", "nequip") if m in first]
    headline = {"name": f"{systems[0]} test force MAE (meV/A): FreeCG vs "
                        f"{' / '.join(others)}",
                "ours": f"{first['freecg']['force_mae_mev_a']:.1f} vs "
                        + " / ".join(f"{first[m]['force_mae_mev_a']:.1f}" for m in others),
                "paper": PAPER, "unit": ""}
  metrics_out = {s: {m: {k: v for k, v in summary.items() if k != "curve"}
                     for m, summary in per_model.items()} for s, per_model in metrics.items()}
  metrics_out["timing"] = {"data_s": round(data_s, 1)}
  return results.write_results(workdir, slug=SLUG, config=config, metrics=metrics_out,
                               claims=claims_of(metrics, seeds), headline_metric=headline,
                               wall_s=time.perf_counter() - start, seeds=seeds)


if __name__ == "__main__":
  cli.run(main)
