"""One calibration split and the summary over splits: what the reproduction measures.

A split trains every method on the training half (a seeded half of the source segments, with all
their systems) and scores it on the other half: Kendall tau-b over all held-out items
(`tau_test`), on the training items (`tau_train`) and the mean per-source-segment tau
(`tau_grouped`). Single metrics are scored the same way; the best single metric is chosen on the
training half, never on the test half.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from jaxlab.methods.metametrics import calibration
from jaxlab.methods.metametrics import data


def taus(prediction: np.ndarray, items: data.Items, train: np.ndarray) -> dict[str, float]:
  test = ~train
  return {"tau_train": calibration.kendall(prediction[train], items.mqm[train]),
          "tau_test": calibration.kendall(prediction[test], items.mqm[test]),
          "tau_grouped": calibration.grouped_kendall(prediction[test], items.mqm[test],
                                                     items.seg_id[test])}


def run_split(scores: Mapping[str, np.ndarray], items: data.Items, train: np.ndarray,
              methods: Sequence[str], options: Mapping[str, Mapping[str, Any]], seed: int
              ) -> dict[str, Any]:
  """{"single": {metric: taus}, "best_single": name, <method>: taus + seconds (+ weights)}."""
  record: dict[str, Any] = {"single": {m: taus(np.asarray(v), items, train)
                                       for m, v in scores.items()}}
  record["best_single"] = max(record["single"], key=lambda m: record["single"][m]["tau_train"])
  train_scores = {m: np.asarray(v)[train] for m, v in scores.items()}
  for method in methods:
    fitted = calibration.calibrate(train_scores, items.mqm[train], method, seed=seed,
                                   **options.get(method, {}))
    row = taus(fitted.predict(scores), items, train)
    row["seconds"] = fitted.info["seconds"]
    if fitted.weights is not None:
      row["weights"] = dict(zip(fitted.metric_names, map(float, fitted.weights)))
    if method == "gp":
      row["num_unused"] = fitted.num_unused
      row["tau_by_evaluation"] = fitted.info["tau_by_evaluation"]
    if method == "xgb":
      row["best_params"] = fitted.info["best_params"]
    record[method] = row
  return record


def _summary(values: Sequence[float]) -> dict[str, Any]:
  values = [float(v) for v in values]
  return {"mean": float(np.mean(values)), "std": float(np.std(values)), "per_split": values}


def summarise(records: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
  """Split means with `.per_split` lists, the layout of `results/metametrics.json`."""
  names = list(records[0]["single"])
  out: dict[str, Any] = {"num_splits": len(records), "single": {}}
  for metric in names:
    out["single"][metric] = {key: _summary([r["single"][metric][key] for r in records])
                             for key in ("tau_test", "tau_train", "tau_grouped")}
  chosen = [r["best_single"] for r in records]
  out["best_single"] = {
      "per_split": chosen,
      **{key: _summary([r["single"][c][key] for r, c in zip(records, chosen)])
         for key in ("tau_test", "tau_train", "tau_grouped")}}
  for method in methods:
    row = {key: _summary([r[method][key] for r in records])
           for key in ("tau_test", "tau_train", "tau_grouped", "seconds")}
    if "weights" in records[0][method]:
      row["weights"] = {m: _summary([r[method]["weights"][m] for r in records]) for m in names}
    if method == "gp":
      row["num_unused"] = _summary([r[method]["num_unused"] for r in records])
    if method == "xgb":
      row["best_params"] = [r[method]["best_params"] for r in records]
    out[method] = row
  return out
