"""flow_mi reproduction: every MI estimator on every benchmark task, then the BOED demo.

  python -m experiments.flow_mi --config=configs/flow_mi.py:quick

Trained estimators fit all seeds of a task at once in `<workdir>/<task>/<estimator>/` (resumable);
closed-form ones (JVG, CCA, KSG) are recomputed. Writes `<workdir>/results.json` (and, for the
quick preset, `results/flow_mi.json`) plus a heat map of errors and a large-MI plot.
"""
from __future__ import annotations

import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import results
from jaxlab.methods.flow_mi import boed
from jaxlab.methods.flow_mi import reproduction
from jaxlab.methods.flow_mi import tails

SLUG = "flow_mi"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  reproduction.validate(config)
  # An ablation's results stay in the workdir; the README names the file under
  # results/ablations/ each is copied to.
  publish = False if config.ablation else None
  if config.ablation == "student_t_tails":    # a look at the data only: nothing is trained
    return results.write_results(
        workdir, slug=SLUG, config=config,
        metrics={"student_t_tails": tails.student_t_report(config)}, claims=[],
        headline_metric=None, wall_s=time.perf_counter() - start, publish=publish,
        seeds=[config.seed + s for s in range(config.data.num_seeds)])
  benchmark = reproduction.run_benchmark(config, workdir)
  num_test = config.data.num_samples - round(config.data.num_samples * config.data.train_fraction)
  summary, claims, headline = reproduction.summarize_benchmark(benchmark.estimates, num_test)
  # Where the run's time goes: every (shape group, estimator) fit, then the design study.
  summary["seconds"] = {"fits": benchmark.seconds}
  if config.boed.enabled:
    boed_start = time.perf_counter()
    summary["boed"] = boed.run(config.boed, reproduction.boed_options(config), config.seed,
                               progress=config.train.progress)
    summary["seconds"]["boed"] = time.perf_counter() - boed_start
    claims += reproduction.boed_claims(summary["boed"])
  summary["student_t_tails"] = tails.student_t_report(config)
  for filename, figure in (("errors_heatmap.png", reproduction.plot_heatmap(summary)),
                           ("large_mi.png", reproduction.plot_large_mi(summary))):
    results.save_figure(figure, workdir, filename, SLUG, config, publish=publish)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + benchmark.earlier_s,
      seeds=[config.seed + s for s in range(config.data.num_seeds)], publish=publish)


if __name__ == "__main__":
  cli.run(main)
