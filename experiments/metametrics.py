"""metametrics reproduction: calibrated metric combinations against the best single metric.

  python -m experiments.metametrics --config=configs/metametrics.py:quick

For each language pair of the WMT21 TED MQM ratings: eight lexical metrics scored once (cached),
then per split (a seeded half of the source segments trains, the other half tests) gp, xgb and
the linear/uniform baselines are calibrated and scored by held-out Kendall tau. Each finished
split is appended to `<workdir>/<pair>/metrics.jsonl`, so a stopped run resumes at the next
split. Writes `<workdir>/results.json` (quick preset: also `results/metametrics.json`) and a
figure of held-out tau per method and metric.
"""
from __future__ import annotations

import pathlib
import time

import ml_collections
import numpy as np

from jaxlab.core import cli
from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import results
from jaxlab.methods.metametrics import calibration
from jaxlab.methods.metametrics import data
from jaxlab.methods.metametrics import metrics as mt_metrics
from jaxlab.methods.metametrics import study

SLUG = "metametrics"
UNIT = "eval/tau_test_gp"   # logged once per finished split (the resume marker)
PAPER = "beats every single metric (MQM, with neural metrics; no tau table in our notes)"


def options(config: ml_collections.ConfigDict):
  pairs = config_lib.select_names(config, "pairs", data.PAIRS)
  methods = config_lib.select_names(config, "methods", calibration.METHODS)
  metric_names = config_lib.select_names(config, "metrics", mt_metrics.METRICS)
  config_lib.require(len(metric_names) >= 2, "metrics", "a combination needs >= 2 metrics")
  config_lib.require(config.train.steps >= 1, "train.steps", "the number of splits must be >= 1")
  config_lib.require(0.0 < config.data.train_fraction < 1.0, "data.train_fraction",
                     f"must be in (0, 1), got {config.data.train_fraction}")
  config_lib.require(config.data.max_segments == 0 or config.data.max_segments >= 4,
                     "data.max_segments", "0 (all) or >= 4 segments (two per half)")
  method_options = {"gp": dict(init_points=int(config.gp.init_points),
                               n_iter=int(config.gp.n_iter)),
                    "xgb": dict(n_iter=int(config.xgb.n_iter), cv=int(config.xgb.cv),
                                n_jobs=int(config.xgb.n_jobs))}
  return pairs, methods, metric_names, method_options


def pair_items(pair: str, max_segments: int) -> data.Items:
  items = data.load_pair(pair)
  if max_segments:
    kept = np.unique(items.seg_id)[:max_segments]
    items = items.take(np.flatnonzero(np.isin(items.seg_id, kept)))
  return items


def run_pair(config, workdir, pair, methods, metric_names, method_options):
  """The pair's split records (resumed from its metrics.jsonl) and how its scores were got."""
  items = pair_items(pair, int(config.data.max_segments))
  start = time.perf_counter()
  progress = lambda chunks: metrics_lib.progress_iter(list(chunks), f"{pair} metrics (chunks)",
                                                      enabled=config.train.progress)
  scores, cached = mt_metrics.cached_scores(pair, items.hypothesis, items.reference,
                                            items.language, metric_names,
                                            cache_dir=config.data.cache_dir, progress=progress)
  scoring = {"seconds": time.perf_counter() - start, "from_cache": cached,
             "num_items": len(items), "num_segments": int(np.unique(items.seg_id).size)}
  out_dir = pathlib.Path(workdir) / pair
  out_dir.mkdir(parents=True, exist_ok=True)
  log = out_dir / "metrics.jsonl"
  done = {r["step"]: r["split"] for r in metrics_lib.read_jsonl(log)} if log.exists() else {}
  splits = list(range(1, int(config.train.steps) + 1))
  todo = [s for s in splits if s not in done]
  with metrics_lib.MetricWriter(out_dir) as writer:
    for split in metrics_lib.progress_iter(todo, f"{pair} splits", config.train.progress):
      seed = config.seed + split - 1
      train = data.split_by_source(items.seg_id, seed, float(config.data.train_fraction))
      record = study.run_split(scores, items, train, methods, method_options, seed)
      markers = {f"eval/tau_test_{m}": record[m]["tau_test"] for m in methods}
      writer.write(split, {UNIT: record.get("gp", record[methods[0]])["tau_test"], **markers,
                           "split": record})
      done[split] = record
  return [done[s] for s in splits], scoring


def claims_of(metrics):
  claims = []
  for pair, summary in metrics.items():
    best = summary["best_single"]["tau_test"]["per_split"]
    for method in ("gp", "xgb"):
      if method not in summary or summary["num_splits"] < 2:
        continue
      ours = summary[method]["tau_test"]["per_split"]
      paired = results.paired_comparison(ours, best, lower_is_better=False)
      wins = int(np.sum(np.asarray(ours) > np.asarray(best)))
      claims.append(results.claim(
          f"{method}_beats_best_single_{pair}",
          f"{pair}: the {method} combination's held-out Kendall tau is above the best single "
          "metric's (chosen on the training half), paired over splits.",
          ours=summary[method]["tau_test"]["mean"],
          baselines={"best_single": summary["best_single"]["tau_test"]["mean"],
                     "splits_won": f"{wins} of {len(ours)}"},
          holds=paired["better"], paired=paired, paper=PAPER,
          comparison="tau_test(method) - tau_test(best single) > 0 by 2 SE over splits"))
  return claims


def plot(metrics, methods):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  pairs = list(metrics)
  figure, axes = plt.subplots(1, len(pairs), figsize=(6.5 * len(pairs), 3.8), squeeze=False)
  for axis, pair in zip(axes[0], pairs):
    summary = metrics[pair]
    names = list(methods) + list(summary["single"])
    rows = [summary[n] if n in methods else summary["single"][n] for n in names]
    means = [r["tau_test"]["mean"] for r in rows]
    stds = [r["tau_test"]["std"] for r in rows]
    colors = ["tab:red" if n in methods else "tab:gray" for n in names]
    axis.bar(np.arange(len(names)), means, yerr=stds, color=colors)
    axis.axhline(summary["best_single"]["tau_test"]["mean"], color="k", lw=0.8, ls="--",
                 label="best single (chosen on train)")
    axis.set_xticks(np.arange(len(names)), names, rotation=45, ha="right")
    axis.set_ylabel("held-out Kendall tau-b vs MQM")
    axis.set_title(f"{pair}: {summary['num_splits']} source-disjoint splits (mean, std)")
    axis.legend(fontsize=8)
  figure.tight_layout()
  return figure


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  pairs, methods, metric_names, method_options = options(config)
  metrics, scoring = {}, {}
  for pair in pairs:
    records, scoring[pair] = run_pair(config, workdir, pair, methods, metric_names,
                                      method_options)
    metrics[pair] = study.summarise(records, methods)
    metrics[pair]["scoring"] = scoring[pair]
  results.save_figure(plot(metrics, methods), workdir, "tau_by_method.png", SLUG, config)
  headline = None
  if "gp" in methods:
    headline = {"name": "held-out Kendall tau, gp / best single metric (" +
                        ", ".join(pairs) + ")",
                "ours": "; ".join(f"{metrics[p]['gp']['tau_test']['mean']:.3f} / "
                                  f"{metrics[p]['best_single']['tau_test']['mean']:.3f}"
                                  for p in pairs),
                "paper": PAPER, "unit": ""}
  return results.write_results(workdir, slug=SLUG, config=config, metrics=metrics,
                               claims=claims_of(metrics), headline_metric=headline,
                               wall_s=time.perf_counter() - start,
                               seeds=[config.seed + s for s in range(int(config.train.steps))])


if __name__ == "__main__":
  cli.run(main, single_process=(
      "Bayesian optimisation and XGBoost on one host; no JAX computation to share"))
