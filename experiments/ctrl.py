"""ctrl reproduction: CTRL and its baselines on the offline tasks, with the claims.

  python -m experiments.ctrl --config=configs/ctrl.py:quick

The pretrained prior comes from the prior cache (`jaxlab.diffusion.priors`: trained on the first
run, loaded after); CTRL's fine-tuning resumes from `<workdir>/<task>/ctrl_n<N>/`. Writes
`<workdir>/results.json` (and, for the quick preset, `results/ctrl.json`) and a figure of samples.
"""
from __future__ import annotations

import copy
import os
import time

import ml_collections
import numpy as np

from jaxlab.core import cli
from jaxlab.core import config as config_lib
from jaxlab.core import results
from jaxlab.diffusion import priors
from jaxlab.methods.ctrl import digit_tasks
from jaxlab.methods.ctrl import finetune
from jaxlab.methods.ctrl import study
from jaxlab.methods.ctrl import tasks as tasks_lib
from jaxlab.methods.ctrl import toy2d

SLUG = "ctrl"
# The validation split of the reward classifier needs at least 2 examples.
MIN_OFFLINE = 10
DIGITS_TRAIN_IMAGES = 1797   # scikit-learn's digits, before the test split
KEPT = ("methods", "noise_floor", "truth_accepted")


def validate(config: ml_collections.ConfigDict) -> None:
  """Every check that needs no compiling: a bad value fails here, naming its key."""
  config_lib.select_names(config, "tasks", tasks_lib.TASKS)
  config_lib.select_names(config, "baselines", study.BASELINES)
  try:
    finetune.Settings.from_config(config.ctrl, num_labels=toy2d.NUM_LABELS)
  except ValueError as e:
    raise config_lib.ConfigError(f"config group 'ctrl': {e}") from None
  train_size = DIGITS_TRAIN_IMAGES - config.digits.prior.dataset_options.num_test
  for size in config.data.offline_sizes:
    config_lib.require(int(size) >= MIN_OFFLINE, "data.offline_sizes",
                       f"each N must be at least {MIN_OFFLINE} (the reward classifier holds "
                       f"out {config.reward.validation_fraction:.0%}), got {size}")
    config_lib.require(int(size) <= train_size, "data.offline_sizes",
                       f"each N must be at most the digits training split's {train_size} "
                       f"images, got {size}")
  ink = config.digits.ink
  config_lib.require(min(ink.num_digit, ink.num_ink) >= MIN_OFFLINE, "digits.ink",
                     f"num_digit and num_ink must be at least {MIN_OFFLINE}")
  config_lib.require(MIN_OFFLINE <= ink.num_both <= min(ink.num_digit, ink.num_ink),
                     "digits.ink.num_both", f"must be in [{MIN_OFFLINE}, min(num_digit, "
                     f"num_ink)], got {ink.num_both}")
  config_lib.require(ink.num_digit + ink.num_ink - ink.num_both <= train_size, "digits.ink",
                     f"num_digit + num_ink - num_both must be at most {train_size}")
  for group in ("toy2d", "digits"):
    rl_steps = config[group].rl_steps
    config_lib.require(rl_steps is None or rl_steps > 0, f"{group}.rl_steps",
                       f"must be a positive number of updates or None, got {rl_steps}")
    try:
      priors.PriorSpec.from_config(config[group].prior)
    except priors.SpecError as e:
      raise config_lib.ConfigError(
          f"config key '{group}.prior.{e.key}': {e.reason}") from None


def toy2d_claims(metrics: dict) -> list[dict]:
  claims = []
  for size_key, row in metrics.items():
    ctrl, floor = row["methods"]["ctrl"], row["noise_floor"]
    claims.append(results.claim(
        f"toy2d_{size_key}_ctrl_reaches_target",
        f"toy2d, N = {size_key[1:]}: CTRL's samples are within twice the noise floor of the "
        "target law p_pre(x) p_hat(y | x) (energy distance, mean over labels and seeds).",
        ours=ctrl["ed_target"],
        baselines={"noise_floor": floor,
                   **{m: v["ed_target"] for m, v in row["methods"].items() if m != "ctrl"}},
        holds=bool(ctrl["ed_target"] <= 2 * floor),
        comparison="ed_target(CTRL) <= 2 x noise_floor", paper="qualitative (no table)"))
  return claims


def headline(metrics: dict) -> dict | None:
  """The compositional task's joint accuracy (CTRL against the better CFG): the paper's case for
  rewarding each attribute with its own classifier. None when the run left that task out."""
  rows = metrics.get("digits_class_ink")
  if not rows:
    return None
  methods = next(iter(rows.values()))["methods"]
  if "ctrl" not in methods or not any(m.startswith("cfg_w") for m in methods):
    return None
  cfg = _better_cfg(methods, "acc_joint")
  return {"name": f"digits_class_ink joint accuracy: CTRL vs CFG ({cfg})",
          "ours": f"{methods['ctrl']['acc_joint']:.3f} vs {methods[cfg]['acc_joint']:.3f}",
          "paper": "CTRL best on the compositional task (SD 1.5, not comparable)", "unit": ""}


def _better_cfg(methods: dict, key: str) -> str:
  return max((m for m in methods if m.startswith("cfg_w")), key=lambda m: methods[m][key])


def _accuracy_gap(ctrl: dict, other: dict, key: str) -> dict:
  """CTRL minus `other` on a seed-paired accuracy, with the paired and the binomial SE."""
  paired = results.paired_comparison(ctrl[f"{key}_seeds"], other[f"{key}_seeds"],
                                     lower_is_better=False)
  # Each seed's binomial SE pooled over the seeds: the SE of the seed-mean accuracy.
  pooled = lambda arm: arm.get(f"{key}_binomial_se", 0.0) / np.sqrt(len(arm[f"{key}_seeds"]))
  binomial = float(np.hypot(pooled(ctrl), pooled(other)))
  return {"difference": paired["difference"], "paired_se": paired["stderr"],
          "binomial_se": binomial, "paired_better": paired["better"]}


def digits_claims(metrics: dict) -> list[dict]:
  claims = []
  rows = metrics.get("digits_class", {})
  gaps = {}
  for size_key, row in rows.items():
    methods = row["methods"]
    ctrl = methods["ctrl"]
    if any(m.startswith("cfg_w") for m in methods):
      cfg = _better_cfg(methods, "accuracy")
      gaps[size_key] = dict(_accuracy_gap(ctrl, methods[cfg], "accuracy"), cfg=cfg,
                            fd_lower=bool(ctrl["fd_truth"] < methods[cfg]["fd_truth"]))
    if "reconstruction_guidance" in methods:
      gap = _accuracy_gap(ctrl, methods["reconstruction_guidance"], "accuracy")
      claims.append(results.claim(
          f"digits_class_{size_key}_ctrl_at_least_reconstruction_guidance",
          f"digits_class, N = {size_key[1:]}: CTRL's oracle accuracy is at least reconstruction "
          "guidance's (seed means).", ours=ctrl["accuracy"],
          baselines={"reconstruction_guidance": methods["reconstruction_guidance"]["accuracy"],
                     "paired_se": gap["paired_se"]},
          holds=bool(gap["difference"] >= 0), comparison="accuracy(CTRL) >= accuracy(RG)",
          paper="qualitative (no table)"))
  if "n50" in gaps:
    gap = gaps["n50"]
    threshold = 2 * max(gap["paired_se"], gap["binomial_se"])
    claims.append(results.claim(
        "digits_class_n50_ctrl_beats_cfg",
        "digits_class, N = 50: CTRL's oracle accuracy beats the better CFG by more than 2 "
        "standard errors (the larger of the seed-paired and the binomial one), with a lower "
        "fd_truth.", ours=rows["n50"]["methods"]["ctrl"]["accuracy"],
        baselines={gap["cfg"]: rows["n50"]["methods"][gap["cfg"]]["accuracy"],
                   "difference": gap["difference"], "paired_se": gap["paired_se"],
                   "binomial_se": gap["binomial_se"],
                   "ctrl_fd_truth": rows["n50"]["methods"]["ctrl"]["fd_truth"],
                   "cfg_fd_truth": rows["n50"]["methods"][gap["cfg"]]["fd_truth"]},
        holds=bool(gap["difference"] > threshold and gap["fd_lower"]),
        comparison="acc(CTRL) - acc(best CFG) > 2 SE and fd_truth(CTRL) < fd_truth(CFG)",
        paper="qualitative (no table)"))
  larger = [k for k in gaps if k != "n50"]
  if "n50" in gaps and larger:
    big = max(larger, key=lambda k: int(k[1:]))
    claims.append(results.claim(
        "digits_class_gap_shrinks_with_n",
        f"digits_class: CTRL's accuracy lead over the better CFG is smaller at N = {big[1:]} "
        "than at N = 50.", ours=gaps[big]["difference"],
        baselines={"gap_n50": gaps["n50"]["difference"]},
        holds=bool(gaps[big]["difference"] < gaps["n50"]["difference"]),
        comparison=f"gap({big}) < gap(n50)", paper="qualitative (no table)"))
  for size_key, row in metrics.get("digits_class_ink", {}).items():
    methods = row["methods"]
    if not any(m.startswith("cfg_w") for m in methods):
      continue
    cfg = _better_cfg(methods, "acc_joint")
    gap = _accuracy_gap(methods["ctrl"], methods[cfg], "acc_joint")
    claims.append(results.claim(
        "digits_class_ink_ctrl_beats_cfg",
        "digits_class_ink: CTRL, rewarded by separate digit and ink classifiers, gets both "
        "labels right more often than CFG trained on the images that carry both "
        "(seed-paired).", ours=methods["ctrl"]["acc_joint"],
        baselines={cfg: methods[cfg]["acc_joint"], "paired_se": gap["paired_se"]},
        holds=bool(gap["paired_better"]), comparison="acc_joint(CTRL) > acc_joint(best CFG)",
        paper="qualitative (no table)"))
  return claims


def plot_digits(samples: dict, num_labels: int, title: str, per_label: int = 4):
  """One row per method (truth first), `per_label` samples of each label."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names = ["truth", *[n for n in samples if n != "truth"]]
  columns = num_labels * per_label
  fig, axes = plt.subplots(len(names), 1, figsize=(columns * 0.3, len(names) * 0.45 + 0.4),
                           squeeze=False)
  for ax, name in zip(axes[:, 0], names):
    tiles = []
    for label in range(num_labels):
      shown = np.asarray(samples[name].get(label, np.zeros((0, 8, 8, 1))))[:per_label]
      shown = np.concatenate([shown, -np.ones((per_label - len(shown), *shown.shape[1:]))]) \
          if len(shown) < per_label else shown
      tiles.extend(list(shown[..., 0]))
    ax.imshow(np.concatenate(tiles, axis=1), cmap="gray_r", vmin=-1, vmax=1)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=7)
  fig.suptitle(title, fontsize=8)
  fig.tight_layout()
  return fig


def plot_toy2d(metrics: dict, samples: dict):
  del metrics
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(samples), figsize=(3 * len(samples), 3), squeeze=False)
  for ax, (name, by_label) in zip(axes[0], samples.items()):
    for label, points in by_label.items():
      ax.scatter(points[:, 0], points[:, 1], s=2, alpha=0.5, label=f"y = {label}")
    ax.set_title(name, fontsize=8)
    ax.set_xlim(-3, 3)
    ax.set_ylim(-3, 3)
    ax.set_aspect("equal")
  axes[0][0].legend(fontsize=6)
  fig.tight_layout()
  return fig


def _collect(metrics: dict, task: str, rows: dict, prior: priors.Prior) -> None:
  """Files one task's rows under metrics.<task>, .ctrl_train.<task>, .seconds.<task>,
  .reward_classifier.<task>."""
  metrics[task] = {k: {kk: vv for kk, vv in v.items() if kk in KEPT} for k, v in rows.items()}
  metrics.setdefault("ctrl_train", {})[task] = {k: v["ctrl_train"] for k, v in rows.items()}
  metrics.setdefault("seconds", {})[task] = {k: v["seconds"] for k, v in rows.items()}
  metrics.setdefault("reward_classifier", {})[task] = {k: v["reward_classifier"]
                                                       for k, v in rows.items()}
  metrics.setdefault("prior", {})[task] = prior.summary()


def with_group_steps(config: ml_collections.ConfigDict, group: str) -> ml_collections.ConfigDict:
  """`config` with train.steps (so CTRL's updates and CFG's steps, which refer to it) set to
  `<group>.rl_steps` where that is given."""
  rl_steps = config[group].rl_steps
  if rl_steps is None:
    return config
  grouped = copy.deepcopy(config)
  with grouped.unlocked():
    grouped.train.steps = int(rl_steps)
  return grouped


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  validate(config)
  selected = config_lib.select_names(config, "tasks", tasks_lib.TASKS)
  metrics: dict = {}
  claims: list = []
  if "toy2d" in selected:
    spec = priors.PriorSpec.from_config(config.toy2d.prior)
    prior = priors.load_or_train(spec, config.toy2d.prior.cache_dir,
                                 progress=config.train.progress)
    rows = {}
    for size in config.data.offline_sizes:
      rows[f"n{size}"] = toy2d.run_size(with_group_steps(config, "toy2d"), prior, int(size),
                                        os.path.join(workdir, "toy2d"))
    _collect(metrics, "toy2d", rows, prior)
    claims += toy2d_claims(metrics["toy2d"])
    last = rows[f"n{config.data.offline_sizes[-1]}"]
    results.save_figure(plot_toy2d(metrics["toy2d"], last["samples"]), workdir,
                        "toy2d_samples.png", SLUG, config)
  digits_selected = [t for t in selected if t.startswith("digits")]
  if digits_selected:
    spec = priors.PriorSpec.from_config(config.digits.prior)
    prior = priors.load_or_train(spec, config.digits.prior.cache_dir,
                                 progress=config.train.progress)
    found = digit_tasks.run(with_group_steps(config, "digits"), prior, digits_selected, workdir)
    metrics["oracle_test_accuracy"] = found.pop("oracle_test_accuracy")
    for task, rows in found.items():
      _collect(metrics, task, rows, prior)
      for size_key, row in rows.items():
        results.save_figure(
            plot_digits(row["samples"], tasks_lib.num_labels(task), f"{task}, {size_key}"),
            workdir, f"{task}_{size_key}_samples.png", SLUG, config)
    claims += digits_claims(metrics)
  return results.write_results(workdir, slug=SLUG, config=config, metrics=metrics, claims=claims,
                               headline_metric=headline(metrics), wall_s=time.perf_counter() - start,
                               seeds=[config.seed + s for s in range(config.ctrl.num_seeds)])


if __name__ == "__main__":
  cli.run(main)
