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
  per_variant, loss_curves, final_params, plateau_steps, start_mse = {}, {}, {}, {}, {}
  plateau = reproduction.plateau_mse(config)
  earlier_s = 0.0   # training time of earlier invocations that this one resumed
  for name in metrics.progress_iter(reproduction.selected_variants(config), "variants",
                                    enabled=config.train.progress):
    variant = reproduction.variant_config(config, name)
    variant_dir = os.path.join(workdir, name)
    source = reproduction.warm_start_source(config, name)
    initial = reproduction.initial_params(variant, source, final_params)
    if source == reproduction.HANDSET_SOURCE:
      start_mse[name] = reproduction.grad_mse_per_seed(variant, initial)
    experiment = training.make_experiment(variant, initial)
    run = train_loop.run(experiment, variant, variant_dir, desc=name)
    final_params[name] = run.state["params"]
    earlier_s += run.earlier_s
    per_variant[name] = reproduction.evaluate_variant(variant, run.state["params"])
    records = metrics.read_jsonl(variant_dir)
    seeds = [metrics.series(records, f"train/loss_seed{r}") for r in range(variant.train.num_seeds)]
    loss_curves[name] = (seeds[0][0], [values for _, values in seeds])
    if variant.data.task == "gradient" and not source:
      plateau_steps[name] = [reproduction.steps_to_leave_plateau(steps, values, plateau)
                             for steps, values in seeds]

  reference = reproduction.handset_and_gd(config)
  summary, claims, headline = reproduction.summarize(per_variant, reference, plateau_steps,
                                                     start_mse)
  gradient_curves = {k: v for k, v in loss_curves.items() if k in plateau_steps}
  other_curves = {k: v for k, v in loss_curves.items() if k not in plateau_steps}
  figures = [("iterated_mse.png", reproduction.plot_iterates(per_variant, reference)),
             ("training_curves.png", reproduction.plot_training(gradient_curves, plateau))]
  if other_curves:
    figures.append(("other_training_curves.png", reproduction.plot_training(other_curves)))
  for filename, figure in figures:
    results.save_figure(figure, workdir, filename, SLUG, config)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + earlier_s,
      seeds=list(range(config.train.num_seeds)))   # replica r of config.seed


if __name__ == "__main__":
  cli.run(main)
