"""The quick reproduction's pieces: task data, the estimator x task sweep, claims, plots.

`experiments/flow_mi.py` runs these in order; the notebook calls them one by one.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import results
from jaxlab.data import mi_tasks
from jaxlab.methods.flow_mi import estimators
from jaxlab.methods.flow_mi import fitting
from jaxlab.methods.flow_mi import gaussian
from jaxlab.methods.flow_mi import tasks as tasks_lib

# A flow estimate counts as "close to the truth" within this fraction of the true MI.
CLOSE_RELATIVE_ERROR = 0.1


def options_from_config(config: ml_collections.ConfigDict) -> estimators.Options:
  return estimators.Options(
      **config.model.to_dict(), **config.optim.to_dict(), steps=config.train.steps,
      nv_steps=config.train.nv_steps, batch_size=config.train.batch_size,
      eval_every=config.train.eval_every,
      ckpt_every=config.train.ckpt_every, ksg_neighbors=config.eval.ksg_neighbors,
      train_fraction=config.data.train_fraction)


def selected_tasks(config: ml_collections.ConfigDict) -> list[str]:
  """`data.tasks` less `data.skip_tasks`."""
  skipped = set(config_lib.select_names(config, "data.skip_tasks", tasks_lib.TASKS,
                                        allow_empty=True))
  return [name for name in config_lib.select_names(config, "data.tasks", tasks_lib.TASKS)
          if name not in skipped]


def selected_estimators(config: ml_collections.ConfigDict) -> list[str]:
  return config_lib.select_names(config, "data.estimators", estimators.ALL_METHODS)


def _restricted_tasks(config: ml_collections.ConfigDict, key: str) -> list[str]:
  chosen = set(config_lib.select_names(config, key, tasks_lib.TASKS))
  return [name for name in selected_tasks(config) if name in chosen]


def critic_tasks(config: ml_collections.ConfigDict) -> list[str]:
  """The tasks the critic baselines (InfoNCE, NWJ, DV, MINE) are fitted on (`data.critic_tasks`,
  default every selected task)."""
  return _restricted_tasks(config, "data.critic_tasks")


def nv_tasks(config: ml_collections.ConfigDict) -> list[str]:
  """The tasks NVG and NVF are fitted on (`data.nv_tasks`, default every selected task)."""
  return _restricted_tasks(config, "data.nv_tasks")


def method_tasks(config: ml_collections.ConfigDict, method: str) -> list[str]:
  """The selected tasks `method` is fitted on."""
  if method in estimators.CRITIC_METHODS:
    return critic_tasks(config)
  if method in estimators.NV_METHODS:
    return nv_tasks(config)
  return selected_tasks(config)


def _methods_of(table: dict[str, dict[str, Any]]) -> list[str]:
  """Every estimator that appears for some task, in first-seen order."""
  return list(dict.fromkeys(m for row in table.values() for m in row))


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the combinations that only this method knows, before anything compiles."""
  selected_tasks(config)
  selected_estimators(config)
  critic_tasks(config)
  nv_tasks(config)
  num_train = int(round(config.data.num_samples * config.data.train_fraction))
  config_lib.require(0 < config.data.train_fraction < 1, "data.train_fraction",
                     f"must be in (0, 1), got {config.data.train_fraction}")
  config_lib.require(num_train >= config.train.batch_size, "train.batch_size",
                     f"{config.train.batch_size} exceeds the {num_train} training samples "
                     f"(data.num_samples x data.train_fraction)")
  config_lib.require(config.data.num_seeds >= 1, "data.num_seeds", "must be at least 1")
  config_lib.require(config.boed.method in estimators.ALL_METHODS, "boed.method",
                     f"choose one of {', '.join(estimators.ALL_METHODS)}")
  nv_long_tasks(config)


def task_data(config: ml_collections.ConfigDict, task: tasks_lib.Task) -> fitting.FitData:
  """Every seed's sample of `task` from its TFDS dataset, standardised over both halves."""
  num_train = int(round(config.data.num_samples * config.data.train_fraction))
  num_test = config.data.num_samples - num_train
  dtype = jnp.result_type(float)
  per_seed = []
  for seed in range(config.data.num_seeds):
    arrays = mi_tasks.load_arrays(task, num_train, num_test, seed=config.seed + seed,
                                  data_dir=config.data.data_dir)
    x = gaussian.standardize(jnp.asarray(np.concatenate([arrays["train"][0],
                                                         arrays["test"][0]]), dtype))
    y = gaussian.standardize(jnp.asarray(np.concatenate([arrays["train"][1],
                                                         arrays["test"][1]]), dtype))
    per_seed.append(fitting.FitData(x[:num_train], y[:num_train], x[num_train:],
                                    y[num_train:]))
  return jax.tree.map(lambda *a: jnp.stack(a), *per_seed)


def groups_by_shape(task_names: list[str]) -> dict[tuple[int, int], list[str]]:
  """Tasks grouped by (dim_x, dim_y): a group is fitted as one vmapped batch of datasets."""
  groups: dict[tuple[int, int], list[str]] = {}
  for name in task_names:
    task = tasks_lib.get_task(name)
    groups.setdefault((task.dim_x, task.dim_y), []).append(name)
  return groups


def nv_long_tasks(config: ml_collections.ConfigDict) -> list[str]:
  """The tasks on which NVF / NVG train for `train.nv_steps` (the rest: `train.steps`)."""
  if config.train.nv_steps is None:
    return []
  return config_lib.select_names(config, "train.nv_steps_tasks", tasks_lib.TASKS)


def estimate_group(config: ml_collections.ConfigDict, shape: tuple[int, int], method: str,
                   data: fitting.FitData, workdir: str, *, nv_steps: int | None = None,
                   label: str = "") -> tuple[np.ndarray, float]:
  """Estimates of one estimator on a stack of datasets of one shape ([tasks x seeds]).

  Trained estimators fit every dataset of the group at once (the per-step cost on a CPU is mostly
  fixed overhead, so 27 small fits in one vmap cost a few times one fit) and resume from
  `<workdir>/<dx>x<dy><label>/<method>`; `nv_steps` is the NV family's step budget (None:
  `train.steps`). Returns (estimates, training seconds of earlier invocations that this one
  resumed).
  """
  options = dataclasses.replace(options_from_config(config), nv_steps=nv_steps)
  if method in estimators.CLOSED_FORM:
    return estimators.closed_form(method, data, options), 0.0
  num_datasets = data.x_train.shape[0]
  keys = jax.random.split(jax.random.key(config.seed), num_datasets)
  trainable = estimators.trainable(method, shape[0], shape[1], options)
  group = f"{shape[0]}x{shape[1]}{label}"
  result = fitting.fit(trainable, data, keys, options.schedule(method),
                       workdir=os.path.join(workdir, group, method), desc=f"{group}/{method}",
                       progress=config.train.progress)
  return result.best_mi, result.earlier_s


class Benchmark(NamedTuple):
  estimates: dict[str, dict[str, list[float]]]   # {task: {estimator: [estimate per seed]}}
  earlier_s: float                               # training seconds of resumed earlier runs
  seconds: dict[str, float]                      # {"<dx>x<dy>[-nv_long]/<estimator>": wall s}


def fit_batches(config: ml_collections.ConfigDict, names: list[str], method: str
                ) -> list[tuple[list[str], int | None, str]]:
  """How one shape group's tasks are fitted by `method`: [(tasks, nv_steps, workdir label)].

  One batch, except that the NV family fits the `nv_long_tasks` of the group as a second batch
  with its own step budget (a vmapped fit runs every dataset for the same number of steps).
  """
  long = set(nv_long_tasks(config)) if method in estimators.NV_METHODS else set()
  if not long & set(names):
    return [(names, None, "")]
  if long >= set(names):
    return [(names, config.train.nv_steps, "")]
  return [([n for n in names if n not in long], None, ""),
          ([n for n in names if n in long], config.train.nv_steps, "-nv_long")]


class FitJob(NamedTuple):
  shape: tuple[int, int]
  method: str
  tasks: list[str]
  nv_steps: int | None
  label: str

  @property
  def name(self) -> str:
    return f"{self.shape[0]}x{self.shape[1]}{self.label}/{self.method}"


def fit_jobs(config: ml_collections.ConfigDict) -> list[FitJob]:
  """Every (shape group, estimator, batch) fit of the benchmark, in sweep order."""
  groups = groups_by_shape(selected_tasks(config))
  tasks_of = {method: set(method_tasks(config, method)) for method in selected_estimators(config)}
  jobs = []
  for shape, names in groups.items():
    for method, fitted in tasks_of.items():
      names_here = [n for n in names if n in fitted]
      if names_here:
        jobs += [FitJob(shape, method, batch, nv_steps, label)
                 for batch, nv_steps, label in fit_batches(config, names_here, method)]
  return jobs


def run_benchmark(config: ml_collections.ConfigDict, workdir: str) -> Benchmark:
  """Every fit of `fit_jobs`; `train.parallel_fits` of them run at once, each from its own
  Python thread (XLA:CPU runs one small fit's chunk largely on one core, so two fits at once
  use both; every fit is independent and deterministic, so the estimates do not change)."""
  num_seeds = config.data.num_seeds
  data_of = {name: task_data(config, tasks_lib.get_task(name))
             for name in selected_tasks(config)}
  jobs = fit_jobs(config)
  parallel_fits = max(1, int(config.train.get("parallel_fits", 1)))
  per_fit_progress = config.train.progress and parallel_fits == 1

  def run(job: FitJob) -> tuple[np.ndarray, float, float]:
    data = jax.tree.map(lambda *a: jnp.concatenate(a), *(data_of[n] for n in job.tasks))
    start = time.perf_counter()
    values, resumed_s = estimate_group(
        config_lib.with_overrides(config, {"train": {"progress": per_fit_progress}}),
        job.shape, job.method, data, workdir, nv_steps=job.nv_steps, label=job.label)
    return np.asarray(values, float), resumed_s, time.perf_counter() - start

  with concurrent.futures.ThreadPoolExecutor(max_workers=parallel_fits) as pool:
    futures = [pool.submit(run, job) for job in jobs]
    bar = metrics_lib.Progress(total=len(futures), desc="fits", enabled=config.train.progress,
                               show_rate=False)
    try:
      for done, _ in enumerate(concurrent.futures.as_completed(futures), start=1):
        bar.update(done)
    finally:
      bar.close()
  out: dict[str, dict[str, list[float]]] = {name: {} for name in data_of}
  seconds: dict[str, float] = {}
  earlier_s = 0.0
  for job, future in zip(jobs, futures):
    values, resumed_s, wall_s = future.result()
    seconds[job.name] = wall_s
    earlier_s += resumed_s
    for i, name in enumerate(job.tasks):
      out[name][job.method] = values[i * num_seeds:(i + 1) * num_seeds].tolist()
  return Benchmark({name: out[name] for name in selected_tasks(config)}, earlier_s, seconds)


def summarize_benchmark(estimates: dict[str, dict[str, list[float]]], num_test: int
                        ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
  """(metrics, claims, headline) from the per-seed estimates."""
  truth = {name: tasks_lib.get_task(name).mutual_information for name in estimates}
  mean_estimate = {t: {m: fitting.mean_ignoring_nan(v) for m, v in row.items()}
                   for t, row in estimates.items()}
  abs_error = {t: {m: fitting.mean_ignoring_nan(np.abs(np.asarray(v) - truth[t]))
                   for m, v in row.items()} for t, row in estimates.items()}
  metrics = {"true_mi": truth, "estimate": mean_estimate, "abs_error": abs_error,
             "estimate_per_seed": estimates, "log_num_test": math.log(num_test)}

  def mean_error(task_names, method):
    values = [abs_error[t][method] for t in task_names if method in abs_error.get(t, {})]
    return float(np.mean(values)) if values else math.nan

  def fitted_on_all(task_names, method):
    # A baseline fitted on only some of a claim's tasks (`data.critic_tasks`, `data.nv_tasks`)
    # is left out of that claim rather than averaged over a different set of tasks.
    return all(method in estimates[t] for t in task_names)

  claims = []
  large = [t for t in tasks_lib.LARGE_MI_TASKS if t in estimates]
  capped = [t for t in large if truth[t] > math.log(num_test)]
  methods = _methods_of(estimates)
  headline = None
  if large and {"jvf", "infonce"} <= set(methods):
    jvf, infonce = mean_error(large, "jvf"), mean_error(large, "infonce")
    baselines = {m: mean_error(large, m) for m in ("nvf", "infonce", "mine", "ksg", "cca")
                 if fitted_on_all(large, m)}
    claims.append(results.claim(
        "large_mi_jvf_beats_infonce",
        "On large-MI Gaussians JVF lands closer to the true MI than InfoNCE, which is capped "
        "near log N (mean |error|, nats).",
        ours=jvf, baselines=baselines, holds=jvf < infonce,
        comparison="mean |JVF - I| < mean |InfoNCE - I| over the large-MI tasks"))
    headline = results.headline("JVF mean |error| on large-MI Gaussians (nats)", ours=jvf,
                                paper=None, unit="nats")
    if "nvf" in methods:
      nvf = mean_error(large, "nvf")
      claims.append(results.claim(
          "large_mi_nvf_beats_infonce",
          "On large-MI Gaussians NVF lands closer to the true MI than InfoNCE.",
          ours=nvf, baselines={"infonce": infonce}, holds=nvf < infonce,
          comparison="mean |NVF - I| < mean |InfoNCE - I| over the large-MI tasks"))
    if capped:
      cap_gap = float(np.mean([truth[t] - mean_estimate[t]["infonce"] for t in capped]))
      close = [abs_error[t]["jvf"] <= CLOSE_RELATIVE_ERROR * truth[t] for t in capped]
      claims.append(results.claim(
          "jvf_close_above_log_n",
          f"Where the true MI exceeds log N_test = {math.log(num_test):.2f}, JVF stays within "
          f"{CLOSE_RELATIVE_ERROR:.0%} of it on every such task (InfoNCE cannot exceed log N).",
          ours=float(np.max([abs_error[t]["jvf"] / truth[t] for t in capped])),
          baselines={"infonce_shortfall_nats": cap_gap}, holds=all(close),
          comparison=f"max relative |JVF - I| <= {CLOSE_RELATIVE_ERROR}"))
  transformed = [t for t in tasks_lib.TRANSFORMED_LARGE_MI_TASKS if t in estimates]
  if transformed and {"jvf", "jvg"} <= set(methods):
    jvf, jvg = mean_error(transformed, "jvf"), mean_error(transformed, "jvg")
    baselines = {m: mean_error(transformed, m) for m in ("jvg", "cca", "nvf", "nvg")
                 if fitted_on_all(transformed, m)}
    claims.append(results.claim(
        "marginal_transforms_jvf_beats_gaussian",
        "Under invertible marginal transforms (x^3, exp) of large-MI Gaussians JVF stays close "
        "to the truth where the Gaussian estimators (JVG = CCA) are biased.",
        ours=jvf, baselines=baselines, holds=jvf < jvg,
        comparison="mean |JVF - I| < mean |JVG - I| over the transformed tasks"))
  return metrics, claims, headline


def plot_heatmap(metrics: dict[str, Any]):
  """Tasks x estimators, coloured by |error| / true MI, annotated with the mean estimate."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  task_names = list(metrics["estimate"])
  methods = _methods_of(metrics["estimate"])
  # An estimator not fitted on a task (see `method_tasks`) is a blank cell.
  relative = np.array([[metrics["abs_error"][t].get(m, np.nan) / max(metrics["true_mi"][t], 1e-9)
                        for m in methods] for t in task_names])
  fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(methods), 1.0 + 0.32 * len(task_names)))
  image = ax.imshow(np.clip(relative, 0, 1), cmap="magma_r", vmin=0, vmax=1, aspect="auto")
  for i, t in enumerate(task_names):
    for j, m in enumerate(methods):
      if m not in metrics["estimate"][t]:
        continue
      value = metrics["estimate"][t][m]
      ax.text(j, i, "nan" if not np.isfinite(value) else f"{value:.2f}", ha="center",
              va="center", fontsize=6, color="white" if relative[i, j] > 0.5 else "black")
  ax.set_xticks(range(len(methods)), [m.upper() if m in estimators.PAPER_METHODS else m
                                      for m in methods], rotation=45, ha="right")
  ax.set_yticks(range(len(task_names)),
                [f"{t} ({metrics['true_mi'][t]:.2f})" for t in task_names], fontsize=7)
  ax.set_title("mean estimate (nats); colour: |error| / true MI (clipped at 1)", fontsize=9)
  fig.colorbar(image, ax=ax, fraction=0.03)
  fig.tight_layout()
  return fig


def plot_large_mi(metrics: dict[str, Any]):
  """Estimate against truth on the large-MI tasks, with the InfoNCE ceiling log N_test."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  task_names = [t for t in (*tasks_lib.LARGE_MI_TASKS, *tasks_lib.TRANSFORMED_LARGE_MI_TASKS)
                if t in metrics["estimate"]]
  fig, ax = plt.subplots(figsize=(7, 4))
  if not task_names:
    return fig
  methods = _methods_of({t: metrics["estimate"][t] for t in task_names})
  truth = [metrics["true_mi"][t] for t in task_names]
  positions = np.arange(len(task_names))
  # An estimator that has not converged can be hundreds of nats off: such points are drawn at
  # the edge of the range so the truth stays readable.
  top = 1.3 * max(max(truth), metrics["log_num_test"])
  ax.scatter(positions, truth, marker="_", s=600, color="black", label="true MI", zorder=3)
  for offset, m in zip(np.linspace(-0.3, 0.3, len(methods)), methods):
    values = np.clip([metrics["estimate"][t].get(m, np.nan) for t in task_names], -0.1 * top,
                     top)
    ax.scatter(positions + offset, values, s=14,
               label=m.upper() if m in estimators.PAPER_METHODS else m)
  ax.axhline(metrics["log_num_test"], ls="--", color="gray", lw=0.8, label="log N_test")
  ax.set_ylim(-0.12 * top, 1.02 * top)
  ax.set_title("estimates outside the range are drawn at its edge", fontsize=8)
  ax.set_xticks(positions, task_names, rotation=30, ha="right", fontsize=7)
  ax.set_ylabel("MI (nats)")
  ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  return fig


def boed_options(config: ml_collections.ConfigDict) -> estimators.Options:
  base = options_from_config(config)
  num_train = int(round(config.boed.num_samples * config.data.train_fraction))
  return dataclasses.replace(base, steps=config.boed.steps, nv_steps=None,
                             eval_every=config.boed.eval_every,
                             ckpt_every=config.boed.steps,
                             batch_size=min(config.train.batch_size, num_train))


def boed_claims(summary: dict[str, Any]) -> list[dict[str, Any]]:
  """Designs chosen by the flow estimate localise the source better than random designs, decided
  on the per-run paired difference (every strategy faces the same sources and particles)."""
  errors = summary["posterior_error"]
  per_run = summary["per_run_error"]
  paired = results.paired_comparison(per_run["flow"], per_run["random"], lower_is_better=True)
  return [results.claim(
      "boed_flow_beats_random",
      f"Sequential location finding: after {summary['num_experiments']} experiments, designs "
      f"chosen by the {summary['estimator'].upper()} MI estimate leave a smaller posterior error "
      f"than random designs (paired over {summary['num_runs']} runs).",
      ours=errors["flow"], baselines={k: v for k, v in errors.items() if k != "flow"},
      holds=paired["better"], paired=paired,
      comparison="|posterior mean - source|, flow - random per run < 0 by > 2 standard errors")]
