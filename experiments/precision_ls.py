"""precision_ls reproduction: trains every variant, evaluates, tests the paper's claims.

  python -m experiments.precision_ls --config=configs/precision_ls.py:quick

Each variant trains with the shared loop in `<workdir>/<variant>/` (resumable); the hand-set
BaseConv and explicit GD need no training. Writes `<workdir>/results.json` (and, for the quick
preset, `results/precision_ls.json`) plus two plots.
"""
from __future__ import annotations

import os
import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import metrics
from jaxlab.core import results
from jaxlab.core import train_loop
from jaxlab.methods.precision_ls import reproduction
from jaxlab.methods.precision_ls import training

SLUG = "precision_ls"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  per_variant, loss_curves, final_params = {}, {}, {}
  earlier_s = 0.0   # training time of earlier invocations that this one resumed
  for name in metrics.progress_iter(reproduction.selected_variants(config), "variants",
                                    enabled=config.train.progress):
    variant = reproduction.variant_config(config, name)
    variant_dir = os.path.join(workdir, name)
    source = reproduction.warm_start_source(config, name)
    experiment = training.make_experiment(variant, final_params.get(source))
    run = train_loop.run(experiment, variant, variant_dir, desc=name)
    final_params[name] = run.state["params"]
    earlier_s += run.earlier_s
    per_variant[name] = reproduction.evaluate_variant(variant, run.state["params"])
    loss_curves[name] = metrics.series(metrics.read_jsonl(variant_dir), "train/loss")

  reference = reproduction.handset_and_gd(config)
  summary, claims, headline = reproduction.summarize(per_variant, reference)
  for filename, figure in (
      ("iterated_mse.png", reproduction.plot_iterates(per_variant, reference)),
      ("training_curves.png", reproduction.plot_training(loss_curves))):
    results.save_figure(figure, workdir, filename, SLUG, config)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + earlier_s)


if __name__ == "__main__":
  cli.run(main)
