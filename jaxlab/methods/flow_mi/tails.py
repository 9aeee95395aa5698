"""Why Gaussian-copula estimators see almost nothing of the Student-t tasks' MI, and why their
estimates swing between seeds.

A multivariate Student-t with identity dispersion has zero correlation: all of its mutual
information is tail dependence (x and y share one chi-square scale). A rank correlation sees no
monotone dependence; the sample Pearson correlation is then whatever the handful of jointly
extreme points make it, so any estimator that reads second moments after marginal maps (JVG, CCA,
and JVF, whose Gaussian copula sits after its flows) reports either ~0 or, when a few extreme
pairs land in the half it evaluates on, a spurious positive value. This module measures exactly
that, per task and data seed, from the samples the benchmark uses.
"""
from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.data import mi_tasks
from jaxlab.methods.flow_mi import tasks as tasks_lib

# The extreme products whose share of the correlation's numerator is reported.
NUM_EXTREME = 5


def _ranks(values: np.ndarray) -> np.ndarray:
  return np.argsort(np.argsort(values, axis=0), axis=0).astype(np.float64)


def _gaussian_mi(x: np.ndarray, y: np.ndarray) -> float:
  cov = np.cov(np.concatenate([x, y], axis=1), rowvar=False)
  dx = x.shape[1]
  logdet = lambda m: np.linalg.slogdet(np.atleast_2d(m))[1]
  return float(0.5 * (logdet(cov[:dx, :dx]) + logdet(cov[dx:, dx:]) - logdet(cov)))


def dependence_profile(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                       y_test: np.ndarray) -> dict[str, float]:
  """Second-moment and rank views of the first coordinate pair, and the Gaussian MI of each half.

  `extreme_share`: the fraction of sum |x_i y_i| (standardised, all samples) carried by its
  `NUM_EXTREME` largest terms; near 1 means a few points decide the Pearson correlation.
  """
  x = np.concatenate([x_train, x_test])
  y = np.concatenate([y_train, y_test])
  xs = (x - x.mean(0)) / x.std(0)
  ys = (y - y.mean(0)) / y.std(0)
  products = np.abs(xs[:, 0] * ys[:, 0])
  return {
      "pearson": float(np.corrcoef(x[:, 0], y[:, 0])[0, 1]),
      "spearman": float(np.corrcoef(_ranks(x[:, 0]), _ranks(y[:, 0]))[0, 1]),
      "extreme_share": float(np.sort(products)[-NUM_EXTREME:].sum() / products.sum()),
      "max_abs_standardised": float(max(np.abs(xs).max(), np.abs(ys).max())),
      "gaussian_mi_train_half": _gaussian_mi(x_train, y_train),
      "gaussian_mi_test_half": _gaussian_mi(x_test, y_test),
  }


def student_t_tasks(config: ml_collections.ConfigDict) -> list[str]:
  names = config_lib.select_names(config, "data.tasks", tasks_lib.TASKS)
  return [name for name in names if name.startswith("student-")]


def student_t_report(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """{task: {"true_mi", "seeds": [profile per data seed]}} on the benchmark's own samples."""
  num_train = int(round(config.data.num_samples * config.data.train_fraction))
  num_test = config.data.num_samples - num_train
  report = {}
  for name in student_t_tasks(config):
    task = tasks_lib.get_task(name)
    profiles = []
    for seed in range(config.data.num_seeds):
      arrays = mi_tasks.load_arrays(task, num_train, num_test, seed=config.seed + seed,
                                    data_dir=config.data.data_dir)
      profiles.append(dependence_profile(*arrays["train"], *arrays["test"]))
    report[name] = {"true_mi": task.mutual_information, "seeds": profiles}
  return report
