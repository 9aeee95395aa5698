"""flow_mi diagnostic: the Student-t tasks' dependence is in the tails (seconds, no training).

  python -m experiments.flow_mi_tails --config=configs/flow_mi.py:quick

For every Student-t task and data seed of the benchmark: Pearson and Spearman correlation of the
first coordinate pair, the share of the correlation carried by its 5 most extreme products, and
the Gaussian MI of each half. Writes `<workdir>/results.json`; the quick preset's is committed as
`results/ablations/flow_mi_student_t.json`.
"""
from __future__ import annotations

import shutil
import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import results
from jaxlab.methods.flow_mi import tails

SLUG = "flow_mi_tails"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  report = tails.student_t_report(config)
  payload = results.write_results(
      workdir, slug=SLUG, config=config, metrics={"student_t": report}, claims=[],
      headline_metric=None, wall_s=time.perf_counter() - start, publish=False,
      seeds=[config.seed + s for s in range(config.data.num_seeds)])
  if config.preset == "quick":
    results.RESULTS_DIR.joinpath("ablations").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(f"{workdir}/results.json",
                    results.RESULTS_DIR / "ablations" / "flow_mi_student_t.json")
  return payload


if __name__ == "__main__":
  cli.run(main)
