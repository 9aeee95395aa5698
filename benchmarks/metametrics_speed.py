"""metametrics: seconds for the base metrics per 1,000 segments, per BO iteration, per XGB search.

  python benchmarks/metametrics_speed.py [--preset quick] [--no-append] [--brief]

Setting: en-de of the WMT21 TED MQM ratings, the training half of split 0 (about 3,400 items,
8 metrics). Prints, and writes to benchmarks/RESULTS.md in place of this method's previous
table: the eight lexical metrics per 1,000 segments (uncached), gp seconds per Bayesian
optimisation iteration (the preset's 5 + n_iter, divided by the evaluations), one Kendall tau,
and one XGB search at the preset's settings. None of it runs in JAX: BO and XGBoost are the
libraries the official code uses.

--brief (a smoke check; never writes RESULTS.md): 100 segments, 5 + 3 BO iterations, a 2 x 2
XGB search.
"""
from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, machine, preset_command_line, publish, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.methods.metametrics import calibration  # pylint: disable=g-import-not-at-top
from jaxlab.methods.metametrics import data  # pylint: disable=g-import-not-at-top
from jaxlab.methods.metametrics import metrics  # pylint: disable=g-import-not-at-top


def seconds(fn) -> tuple[float, object]:
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def main() -> None:
  args, config = preset_command_line("metametrics")
  items = data.load_pair("en-de")
  num_segments = 100 if args.brief else 1000
  metric_seconds, _ = seconds(lambda: metrics.score_segments(
      items.hypothesis[:num_segments], items.reference[:num_segments], items.language))
  scores, _ = metrics.cached_scores("en-de", items.hypothesis, items.reference, items.language)
  train = data.split_by_source(items.seg_id, config.seed)
  train_scores = {m: v[train] for m, v in scores.items()}
  human = items.mqm[train]
  init_points, n_iter = int(config.gp.init_points), (3 if args.brief else int(config.gp.n_iter))
  gp_seconds, gp = seconds(lambda: calibration.calibrate(
      train_scores, human, "gp", seed=0, init_points=init_points, n_iter=n_iter))
  evaluations = gp.info["evaluations"]
  matrix = np.stack(list(train_scores.values()), axis=1)
  repeats = 20
  tau_seconds, _ = seconds(lambda: [calibration.kendall(matrix @ gp.weights, human)
                                    for _ in range(repeats)])
  xgb_options = (dict(n_iter=2, cv=2) if args.brief else
                 dict(n_iter=int(config.xgb.n_iter), cv=int(config.xgb.cv)))
  xgb_options["n_jobs"] = int(config.xgb.n_jobs)
  xgb_seconds, _ = seconds(lambda: calibration.calibrate(train_scores, human, "xgb", seed=0,
                                                         **xgb_options))
  rows = [
      (f"8 lexical metrics, per 1,000 segments (timed on {num_segments})",
       metric_seconds * 1000 / num_segments),
      (f"gp, per BO iteration ({init_points} + {n_iter} evaluations: GP fit, acquisition, "
       "Kendall tau)", gp_seconds / evaluations),
      ("one Kendall tau-b on the training half", tau_seconds / repeats),
      (f"one XGB search ({xgb_options['n_iter']} iterations x {xgb_options['cv']}-fold, "
       "then the refit)", xgb_seconds),
  ]
  lines = [f"\n## metametrics ({args.preset} preset), {machine()}{brief_mark(args)}\n\n",
           f"en-de, training half of split 0 ({int(train.sum()):,} items, 8 metrics), one run "
           "each (these are seconds, not a median over repeats; BO and XGBoost are NumPy/C++ "
           "libraries, not JAX).\n\n", "| what | seconds |\n|---|---|\n"]
  for label, value in rows:
    lines.append(f"| {label} | {value:.4f} |\n")
    print(lines[-1], end="", flush=True)
  publish(lines, "metametrics", writes_results(args))


if __name__ == "__main__":
  main()
