"""The quick reproduction: the prior, every (task, variant) fine-tuning, evaluation on the
in-distribution and held-out scenes, claims, and a figure.

Every (task, variant) trains once, at `config.seed`. The detail-preserver claim compares two arms
whose margin is small, so depth Lotus-G with and without the preserver also train at
`train.detail_preserver_seeds - 1` more seeds (data order and noise; the same prior), and the
claim is decided on the per-seed paired difference of the edge error.

`experiments/lotus.py` runs these in order; the notebook calls them one by one.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import results
from jaxlab.core import train_loop
from jaxlab.methods.lotus import metrics as metrics_lib_lotus
from jaxlab.methods.lotus import training
from jaxlab.methods.lotus import variants as variants_lib

TEST_SETS = {"in_distribution": "train", "zero_shot": "heldout"}
# "At least as accurate": the single-step error may exceed the multi-step one by this fraction.
ACCURACY_TOLERANCE = 0.05
MIN_SPEEDUP = 5.0
# The arms of the detail-preserver claim (depth): without, with.
DETAIL_ARMS = ("lotus_g", "lotus_g_detail")


def selected_variants(config) -> list[str]:
  return config_lib.select_names(config, "variants", variants_lib.VARIANTS)


def selected_tasks(config) -> list[str]:
  return config_lib.select_names(config, "tasks", training.TASKS)


def validate(config: ml_collections.ConfigDict) -> None:
  selected_variants(config), selected_tasks(config)
  if config.diffusion.schedule not in ("linear", "cosine"):
    raise config_lib.ConfigError("config key 'diffusion.schedule' must be 'linear' or 'cosine'")
  if config.train.detail_preserver_seeds < 1:
    raise config_lib.ConfigError("config key 'train.detail_preserver_seeds' must be >= 1")
  if config.data.size % 2 ** (len(config.model.channel_multipliers) - 1):
    raise config_lib.ConfigError("config key 'data.size' must be divisible by 2^(levels - 1) "
                                 "of 'model.channel_multipliers'")


def detail_seeds(config: ml_collections.ConfigDict) -> list[int]:
  """Training seeds of the detail-preserver arms; empty unless both arms and depth are run."""
  if not (set(DETAIL_ARMS) <= set(selected_variants(config))
          and "depth" in selected_tasks(config)):
    return []
  return [config.seed + i for i in range(config.train.detail_preserver_seeds)]


def train_all(config: ml_collections.ConfigDict, workdir: str
              ) -> tuple[dict[Any, Any], float]:
  """Parameters after the prior and every fine-tuning, keyed (task, variant) at `config.seed`
  and (task, variant, seed) for the extra seeds of the detail-preserver arms; the resumed time.
  """
  earlier = 0.0
  prior_steps = config.train.prior_steps or config.train.steps
  prior = train_loop.run(training.make_experiment(config, steps=prior_steps),
                         config_lib.with_overrides(config, {"train": {"steps": prior_steps}}),
                         os.path.join(workdir, "prior"), desc="prior")
  earlier += prior.earlier_s
  init_params = training.widen_prior(prior.state["params"])
  trained = {}
  jobs = [(task, v, config.seed) for task in selected_tasks(config)
          for v in selected_variants(config)]
  jobs += [("depth", v, seed) for seed in detail_seeds(config)[1:] for v in DETAIL_ARMS]
  for task, variant, seed in metrics_lib.progress_iter(jobs, "fine-tunings",
                                                       enabled=config.train.progress):
    extra_seed = seed != config.seed
    name = f"{variant}_seed{seed}" if extra_seed else variant
    run = train_loop.run(
        training.make_experiment(config, variant=variant, task=task, init_params=init_params),
        config_lib.with_overrides(config, {"seed": seed}), os.path.join(workdir, task, name),
        desc=f"{task}/{name}")
    earlier += run.earlier_s
    trained[(task, variant, seed) if extra_seed else (task, variant)] = run.state["params"]
  return trained, earlier


def predict_all(config, predict, params, images: np.ndarray, seed: int) -> np.ndarray:
  out = []
  batch = config.eval.batch_size
  for start in range(0, len(images), batch):
    key = jax.random.fold_in(jax.random.key(seed), start)
    out.append(np.asarray(predict(params, jnp.asarray(images[start:start + batch]), key)))
  return np.concatenate(out)


def evaluate(config: ml_collections.ConfigDict, trained: dict[Any, Any]
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Metrics per task, test set and variant; also predictions for the figure."""
  summary: dict[str, Any] = {"depth": {}, "normal": {}, "seed_variance": {}, "edge_error": {},
                             "infer_ms": {}}
  figure_rows: dict[str, np.ndarray] = {}
  data = {name: training.task_arrays(config, "test", distribution)
          for name, distribution in TEST_SETS.items()}
  seeds = list(range(config.eval.num_seeds))
  edges = metrics_lib_lotus.occlusion_edges(data["in_distribution"]["depth"],
                                            data["in_distribution"]["object_id"])

  def edge_error(predictions):
    arrays = data["in_distribution"]
    return float(np.mean([metrics_lib_lotus.edge_depth_error(p.mean(-1), arrays["depth"], edges)
                          for p in predictions]))

  for key, params in trained.items():
    if len(key) == 3:    # an extra seed of a detail-preserver arm: below
      continue
    task, variant = key
    predict = training.predictor(config, variant)
    for test_name, arrays in data.items():
      predictions = []
      for s in seeds:
        start = time.perf_counter()
        predictions.append(predict_all(config, predict, params, arrays["image"], s))
        seconds = time.perf_counter() - start
      if test_name == "in_distribution":
        if len(seeds) == 1:    # the only pass compiled the predictor: time a warm one
          start = time.perf_counter()
          predict_all(config, predict, params, arrays["image"], 1)
          seconds = time.perf_counter() - start
        # The last seed's pass is warm (the first compiled it); this also costs no extra
        # sampling, which matters for the 10-step samplers.
        summary["infer_ms"].setdefault(task, {})[variant] = (
            1e3 * seconds / len(arrays["image"]))
      if task == "depth":
        scores = [metrics_lib_lotus.depth_metrics(p.mean(-1), arrays["depth"])
                  for p in predictions]
      else:
        scores = [metrics_lib_lotus.normal_metrics(p, arrays["normal"]) for p in predictions]
      summary[task].setdefault(test_name, {})[variant] = {
          k: float(np.mean([s[k] for s in scores])) for k in scores[0]}
      if test_name == "in_distribution":
        spread = np.std(np.stack(predictions), axis=0).mean()
        summary["seed_variance"].setdefault(task, {})[variant] = float(spread)
        if task == "depth":
          summary["edge_error"][variant] = edge_error(predictions)
        figure_rows[f"{task}/{variant}"] = predictions[0][:4]
  seeds_trained = [key[2] for key in trained if len(key) == 3 and key[1] == DETAIL_ARMS[0]]
  if seeds_trained:
    by_arm = {}
    for arm in DETAIL_ARMS:
      predict = training.predictor(config, arm)
      by_arm[arm] = [summary["edge_error"][arm]] + [
          edge_error([predict_all(config, predict, trained[("depth", arm, seed)],
                                  data["in_distribution"]["image"], s) for s in seeds])
          for seed in seeds_trained]
    summary["detail_preserver"] = {
        "seeds": [config.seed] + seeds_trained, "edge_error": by_arm,
        "paired": results.paired_comparison(by_arm[DETAIL_ARMS[1]], by_arm[DETAIL_ARMS[0]],
                                             lower_is_better=True)}
  figure_rows["image"] = data["in_distribution"]["image"][:4]
  figure_rows["depth_target"] = data["in_distribution"]["depth_target"][:4]
  figure_rows["normal_target"] = data["in_distribution"]["normal_target"][:4]
  return summary, figure_rows


def claims(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
  out = []
  depth = summary["depth"].get("in_distribution", {})
  normal = summary["normal"].get("in_distribution", {})

  def have(*names):
    return all(n in depth and n in normal for n in names)

  if have("eps_multi", "x0_multi"):
    holds = (depth["x0_multi"]["absrel"] < depth["eps_multi"]["absrel"] and
             normal["x0_multi"]["mean_angle"] < normal["eps_multi"]["mean_angle"])
    out.append(results.claim(
        "x0_beats_eps", "x0-prediction gives more accurate depth and normals than "
        "eps-prediction (multi-step, same budget)",
        ours={"absrel": depth["x0_multi"]["absrel"],
              "mean_angle": normal["x0_multi"]["mean_angle"]},
        baselines={"eps absrel": depth["eps_multi"]["absrel"],
                   "eps mean_angle": normal["eps_multi"]["mean_angle"]},
        holds=holds, paper="x0 better (Lotus fig. 3)",
        comparison="x0 AbsRel < eps AbsRel and x0 mean angle < eps mean angle (in-distribution)"))
  if have("x0_multi", "lotus_g"):
    speedup = (summary["infer_ms"]["depth"]["x0_multi"] /
               summary["infer_ms"]["depth"]["lotus_g"])
    accurate = (depth["lotus_g"]["absrel"] <= (1 + ACCURACY_TOLERANCE) * depth["x0_multi"]["absrel"]
                and normal["lotus_g"]["mean_angle"] <=
                (1 + ACCURACY_TOLERANCE) * normal["x0_multi"]["mean_angle"])
    out.append(results.claim(
        "single_step_as_accurate_and_faster",
        "Single-step x0 prediction (Lotus-G) is at least as accurate as multi-step and many "
        "times faster",
        ours={"absrel": depth["lotus_g"]["absrel"],
              "mean_angle": normal["lotus_g"]["mean_angle"], "speedup": speedup},
        baselines={"multi-step absrel": depth["x0_multi"]["absrel"],
                   "multi-step mean_angle": normal["x0_multi"]["mean_angle"]},
        holds=accurate and speedup >= MIN_SPEEDUP, paper="as accurate, ~hundreds of times faster",
        comparison=f"errors within {ACCURACY_TOLERANCE:.0%} of multi-step and speedup >= "
                   f"{MIN_SPEEDUP:g}"))
  edge = summary["edge_error"]
  seeded = summary.get("detail_preserver")
  if seeded is not None:
    paired = seeded["paired"]
    out.append(results.claim(
        "detail_preserver_sharpens_edges",
        "The detail preserver reduces the depth error next to depth discontinuities",
        ours=paired["ours_mean"], baselines={"lotus_g": paired["baseline_mean"]},
        holds=paired["better"], paper="sharper details (Lotus fig. 6)", paired=paired,
        comparison=f"edge AbsRel with the detail preserver below without, paired over "
                   f"{paired['n']} training seeds by more than {results.SIGNIFICANCE:g} "
                   "standard errors"))
  elif "lotus_g" in edge and "lotus_g_detail" in edge:
    out.append(results.claim(
        "detail_preserver_sharpens_edges",
        "The detail preserver reduces the depth error next to depth discontinuities",
        ours=edge["lotus_g_detail"], baselines={"lotus_g": edge["lotus_g"]},
        holds=edge["lotus_g_detail"] < edge["lotus_g"], paper="sharper details (Lotus fig. 6)",
        comparison="edge AbsRel with the detail preserver < without (one training seed: "
                   "train.detail_preserver_seeds = 1)"))
  headline = None
  if "lotus_g" in depth:
    headline = results.headline(
        "Lotus-G depth AbsRel / normal mean angle (in-distribution)",
        ours=f"{depth['lotus_g']['absrel']:.3f} / "
             f"{normal.get('lotus_g', {}).get('mean_angle', float('nan')):.1f}°",
        paper="SOTA zero-shot on NYUv2/KITTI/... (not comparable)")
  return out, headline


def plot(rows: dict[str, np.ndarray]):
  """Input, ground truth and every variant's prediction for 4 test scenes."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  names = ["image", "depth_target"] + [k for k in rows if k.startswith("depth/")] + \
          ["normal_target"] + [k for k in rows if k.startswith("normal/")]
  figure, axes = plt.subplots(4, len(names), figsize=(1.3 * len(names), 5.6), squeeze=False)
  for col, name in enumerate(names):
    for row in range(4):
      value = rows[name][row]
      shown = (value + 1) / 2
      if name.startswith("depth"):
        shown = shown.mean(-1)
      axes[row][col].imshow(np.clip(shown, 0, 1), cmap="viridis" if shown.ndim == 2 else None)
      axes[row][col].axis("off")
    axes[0][col].set_title(name.replace("/", "\n"), fontsize=6)
  figure.tight_layout()
  return figure
