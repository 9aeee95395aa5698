"""lotus reproduction: the prior, five fine-tuning variants for depth and normals, evaluation.

  python -m experiments.lotus --config=configs/lotus.py:quick

The prior trains in `<workdir>/prior/`, each fine-tuning in `<workdir>/<task>/<variant>/` (all
resumable, shared loop). Writes `<workdir>/results.json` (and, for the quick preset,
`results/lotus.json`) and a figure of inputs, ground truth and predictions.
"""
from __future__ import annotations

import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import results
from jaxlab.methods.lotus import reproduction

SLUG = "lotus"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  reproduction.validate(config)
  trained, earlier_s = reproduction.train_all(config, workdir)
  summary, rows = reproduction.evaluate(config, trained)
  claims, headline = reproduction.claims(summary)
  results.save_figure(reproduction.plot(rows), workdir, "predictions.png", SLUG, config)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + earlier_s,
      seeds=reproduction.detail_seeds(config) or [config.seed])


if __name__ == "__main__":
  cli.run(main)
