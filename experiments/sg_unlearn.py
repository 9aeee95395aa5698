"""sg_unlearn reproduction: original, retrain, FT, GA, RL, l1-sparse and SG over an alpha sweep.

  python -m experiments.sg_unlearn --config=configs/sg_unlearn.py:quick

Every phase trains all seeds (and SG all alphas) at once in `<workdir>/<setting>/<method>/`
(resumable; the original model in `<workdir>/original/`). Writes `<workdir>/results.json` (and,
for the quick preset, `results/sg_unlearn.json`) and a plot of MIA AUC against test accuracy.
"""
from __future__ import annotations

import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import results
from jaxlab.methods.sg_unlearn import reproduction

SLUG = "sg_unlearn"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  reproduction.validate(config)
  outcome, earlier_s = reproduction.run(config, workdir)
  summary = reproduction.summarize(outcome)
  claims, headline = reproduction.claims(summary)
  results.save_figure(reproduction.plot(summary), workdir, "mia_vs_accuracy.png", SLUG, config)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + earlier_s,
      seeds=[config.seed + s for s in range(config.data.num_seeds)])


if __name__ == "__main__":
  cli.run(main)
