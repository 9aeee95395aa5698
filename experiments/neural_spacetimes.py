"""neural_spacetimes reproduction: NST vs Minkowski vs de Sitter on synthetic DAGs and DREAM5.

  python -m experiments.neural_spacetimes --config=configs/neural_spacetimes.py:quick

Every (dataset group, dimension, model) is fitted in `<workdir>/<group>/<model>_dim<d>/`
(resumable). Writes `<workdir>/results.json` (and, for the quick preset,
`results/neural_spacetimes.json`) and a bar chart of |mean distortion - 1|.
"""
from __future__ import annotations

import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import results
from jaxlab.methods.neural_spacetimes import reproduction

SLUG = "neural_spacetimes"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  reproduction.validate(config)
  graphs = reproduction.load_graphs(config)
  per_seed, earlier_s = reproduction.run(config, workdir, graphs)
  summary = reproduction.summarize(per_seed, graphs)
  claims, headline = reproduction.claims(summary)
  results.save_figure(reproduction.plot(summary), workdir, "distortion.png", SLUG, config)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + earlier_s,
      seeds=[config.seed + s for s in range(config.data.num_seeds)])


if __name__ == "__main__":
  cli.run(main)
