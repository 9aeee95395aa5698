"""ctrl reproduction: CTRL and its baselines on the offline tasks, with the claims.

  python -m experiments.ctrl --config=configs/ctrl.py:quick

The pretrained prior comes from the prior cache (`jaxlab.diffusion.priors`: trained on the first
run, loaded after); CTRL's fine-tuning resumes from `<workdir>/<task>/ctrl_n<N>/`. Writes
`<workdir>/results.json` (and, for the quick preset, `results/ctrl.json`) and a figure of samples.
"""
from __future__ import annotations

import os
import time

import ml_collections
import numpy as np

from jaxlab.core import cli
from jaxlab.core import config as config_lib
from jaxlab.core import results
from jaxlab.diffusion import priors
from jaxlab.methods.ctrl import finetune
from jaxlab.methods.ctrl import tasks as tasks_lib
from jaxlab.methods.ctrl import toy2d

SLUG = "ctrl"
# The validation split of the reward classifier needs at least 2 examples.
MIN_OFFLINE = 10


def validate(config: ml_collections.ConfigDict) -> None:
  """Every check that needs no compiling: a bad value fails here, naming its key."""
  config_lib.select_names(config, "tasks", tasks_lib.TASKS)
  config_lib.select_names(config, "baselines", toy2d.BASELINES)
  try:
    finetune.Settings.from_config(config.ctrl, num_labels=toy2d.NUM_LABELS)
  except ValueError as e:
    raise config_lib.ConfigError(f"config group 'ctrl': {e}") from None
  for size in config.data.offline_sizes:
    config_lib.require(int(size) >= MIN_OFFLINE, "data.offline_sizes",
                       f"each N must be at least {MIN_OFFLINE} (the reward classifier holds "
                       f"out {config.reward.validation_fraction:.0%}), got {size}")
  try:
    priors.PriorSpec.from_config(config.toy2d.prior)
  except priors.SpecError as e:
    raise config_lib.ConfigError(f"config key 'toy2d.prior.{e.key}': {e.reason}") from None


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
      rows[f"n{size}"] = toy2d.run_size(config, prior, int(size),
                                        os.path.join(workdir, "toy2d"))
    metrics["toy2d"] = {k: {kk: vv for kk, vv in v.items()
                            if kk not in ("ctrl_train", "reward_classifier", "samples")}
                        for k, v in rows.items()}
    metrics["ctrl_train"] = {"toy2d": {k: v["ctrl_train"] for k, v in rows.items()}}
    metrics["reward_classifier"] = {"toy2d": {k: v["reward_classifier"]
                                              for k, v in rows.items()}}
    metrics["prior"] = {"toy2d": prior.summary()}
    claims += toy2d_claims(metrics["toy2d"])
    last = rows[f"n{config.data.offline_sizes[-1]}"]
    results.save_figure(plot_toy2d(metrics["toy2d"], last["samples"]), workdir,
                        "toy2d_samples.png", SLUG, config)
  return results.write_results(workdir, slug=SLUG, config=config, metrics=metrics, claims=claims,
                               headline_metric=None, wall_s=time.perf_counter() - start,
                               seeds=[config.seed + s for s in range(config.ctrl.num_seeds)])


if __name__ == "__main__":
  cli.run(main)
