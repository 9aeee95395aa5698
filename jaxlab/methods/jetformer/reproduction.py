"""The quick reproduction's pieces: variants, evaluations, an independent classifier, claims, plots.

`experiments/jetformer.py` runs these in order; the notebook calls them one by one.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import replicas
from jaxlab.core import results
from jaxlab.data import digits
from jaxlab.methods.jetformer import sampling
from jaxlab.methods.jetformer import training

def selected_variants(config: ml_collections.ConfigDict) -> list[str]:
  names = list(config.variants.keys())
  if config.run_variants == "all":
    return names
  chosen = [n.strip() for n in config.run_variants.split(",") if n.strip()]
  for name in chosen:
    if name not in names:
      raise config_lib.ConfigError(
          f"config key 'run_variants' names {name!r}; choose from all, {', '.join(names)}")
  return chosen


def variant_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  return config_lib.with_overrides(config, config.variants[name].to_dict())


def fit_classifier(config: ml_collections.ConfigDict):
  """Logistic regression on real training digits: the judge of generated samples."""
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
  train = training.train_arrays(config, "train")
  test = training.train_arrays(config, "test")
  features = lambda images: images.reshape(len(images), -1) / (config.data.num_levels - 1)
  classifier = LogisticRegression(max_iter=3000, C=1.0)
  classifier.fit(features(train["image"]), train["label"])
  accuracy = float(np.mean(classifier.predict(features(test["image"])) == test["label"]))
  return (lambda images: classifier.predict(features(np.asarray(images)))), accuracy


class Evaluator:
  """The evaluations of one variant, each jitted once and applied to every seed's params."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    model = training.make_model(config)
    test = training.train_arrays(config, "test")
    self.test_labels = test["label"]
    test = {k: jnp.asarray(v) for k, v in test.items()}
    self.labels = jnp.repeat(jnp.arange(config.data.num_classes), config.eval.samples_per_class)
    options = dict(num_levels=config.data.num_levels, patch=config.model.patch)

    def bpd(params, key):
      """Class-conditional bits per dimension on the whole test split (one dequantisation)."""
      _, metrics = training.loss_fn(model.module(params), test, key, config=config,
                                    noise_std=jnp.zeros([]), train=False)
      return metrics["bpd"]

    def draw(params, key):
      return sampling.sample_levels(
          model.module(params), key, self.labels, temperature=config.eval.temperature,
          cfg_weight=config.eval.cfg_weight, num_candidates=config.eval.rejection_candidates,
          image_shape=digits.IMAGE_SHAPE, **options)

    self.bpd = jax.jit(bpd)
    self.draw = jax.jit(draw)
    self.factored_std = jax.jit(lambda p, key: sampling.factored_std(
        model.module(p), key, test["image"], **options))
    self.predict = jax.jit(lambda p: sampling.predict_classes(model.module(p), test["image"],
                                                              **options))

  def generate(self, params: Any, key: jax.Array) -> tuple[np.ndarray, np.ndarray, float]:
    """(`samples_per_class` images per class, their intended labels, the guidance sampler's
    acceptance rate)."""
    samples, acceptance = self.draw(params, key)
    return np.asarray(samples), np.asarray(self.labels), float(acceptance)

  def understanding_accuracy(self, params: Any) -> float:
    return float(np.mean(np.asarray(self.predict(params)) == self.test_labels))


def _nan_to_none(value: float) -> float | None:
  return None if not np.isfinite(value) else value


def evaluate_variant(config: ml_collections.ConfigDict, params: Any, classify
                     ) -> dict[str, Any]:
  """Per training seed (params are replica-stacked): test bpd, sample accuracy, guidance
  acceptance, factored-out std; samples of seed 0 for the grid; understanding accuracy for a
  model trained on image-first examples."""
  evaluator = Evaluator(config)
  out: dict[str, Any] = {"test_bpd": [], "sample_accuracy": [], "cfg_acceptance": [],
                         "factored_std": []}
  for r in range(replicas.num_replicas(params)):
    seed_params = replicas.take(params, r)
    key = jax.random.fold_in(jax.random.key(config.seed + 1), r)
    out["test_bpd"].append(float(evaluator.bpd(seed_params, key)))
    samples, labels, acceptance = evaluator.generate(seed_params, jax.random.fold_in(key, 1))
    if r == 0:
      out["samples"] = samples
    # Without a decoder the model cannot condition on the class: no sample accuracy to report.
    out["sample_accuracy"].append(float(np.mean(classify(samples) == labels))
                                  if config.model.use_decoder else None)
    out["cfg_acceptance"].append(_nan_to_none(acceptance))
    out["factored_std"].append(_nan_to_none(float(
        evaluator.factored_std(seed_params, jax.random.fold_in(key, 2)))))
    if config.model.use_decoder and config.optim.understanding_prob > 0:
      out.setdefault("understanding_accuracy", []).append(
          evaluator.understanding_accuracy(seed_params))
  return out


def _mean(values: list[float | None]) -> float | None:
  finite = [v for v in values if v is not None]
  return float(np.mean(finite)) if finite else None


def _stderr(values: list[float | None], samples_per_seed: int) -> float | None:
  """Over seeds when there are >= 2, else the binomial error of one model's samples."""
  finite = [v for v in values if v is not None]
  if not finite:
    return None
  if len(finite) >= 2:
    return results.standard_error(finite)
  p = finite[0]
  return float(np.sqrt(p * (1 - p) / samples_per_seed))


def summarize(per_variant: dict[str, dict[str, Any]], classifier_accuracy: float,
              samples_per_seed: int, clean_phase: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
  """Means over seeds in `test_bpd`, `sample_accuracy` (with `sample_accuracy_stderr`),
  `factored_std`, `cfg_acceptance`; every seed's value under `per_seed`. Claims comparing two
  variants are decided by `results.paired_comparison` over the seeds."""
  per_seed = {key: {v: r[key] for v, r in per_variant.items()}
              for key in ("test_bpd", "sample_accuracy", "factored_std", "cfg_acceptance")}
  bpd = {v: _mean(x) for v, x in per_seed["test_bpd"].items()}
  accuracy = {v: _mean(x) for v, x in per_seed["sample_accuracy"].items()}
  metrics: dict[str, Any] = {
      "test_bpd": bpd, "sample_accuracy": accuracy,
      "sample_accuracy_stderr": {v: _stderr(x, samples_per_seed)
                                 for v, x in per_seed["sample_accuracy"].items()},
      "factored_std": {v: _mean(x) for v, x in per_seed["factored_std"].items()},
      "cfg_acceptance": {v: _mean(x) for v, x in per_seed["cfg_acceptance"].items()},
      "classifier_test_accuracy": classifier_accuracy, "per_seed": per_seed}
  if clean_phase is not None:
    metrics["clean_phase"] = clean_phase
  understanding = [r["understanding_accuracy"] for r in per_variant.values()
                   if "understanding_accuracy" in r]
  if understanding:
    metrics["understanding_accuracy"] = _mean(understanding[0])

  def paired(metric, ours, baseline, lower_is_better):
    ours_values, baseline_values = per_seed[metric][ours], per_seed[metric][baseline]
    if min(len(ours_values), len(baseline_values)) < 2:
      raise config_lib.ConfigError(
          f"comparing {ours} with {baseline} needs >= 2 training seeds each (train.num_seeds); "
          f"got {len(ours_values)} and {len(baseline_values)}")
    return results.paired_comparison(ours_values, baseline_values,
                                     lower_is_better=lower_is_better)

  claims = []
  for baseline, name, statement in (
      ("ar_raw_patches", "flow_beats_raw_patches",
       "Training the flow end to end with the AR model gives a better likelihood than the same "
       "GMM-AR model on raw patches (no flow)."),
      ("flow_only", "ar_prior_beats_flow_alone",
       "An autoregressive prior over the flow's soft tokens beats the flow with a factorised "
       "N(0, 1) prior (Jet alone).")):
    if {"jetformer", baseline} <= bpd.keys():
      comparison = paired("test_bpd", "jetformer", baseline, lower_is_better=True)
      claims.append(results.claim(
          name, statement, ours=bpd["jetformer"], baselines={baseline: bpd[baseline]},
          holds=comparison["better"], paired=comparison,
          comparison=f"paired over seeds: test bpd jetformer < {baseline}"))
  if {"jetformer", "no_curriculum"} <= bpd.keys():
    likelihood = paired("test_bpd", "no_curriculum", "jetformer", lower_is_better=True)
    samples = paired("sample_accuracy", "jetformer", "no_curriculum", lower_is_better=False)
    claims.append(results.claim(
        "curriculum_trades_likelihood_for_samples",
        "The noise curriculum trades likelihood for sample quality: without it the test bpd is "
        "lower but class-conditional samples are recognised less often.",
        ours=accuracy["jetformer"],
        baselines={"no_curriculum_accuracy": accuracy["no_curriculum"],
                   "jetformer_bpd": bpd["jetformer"], "no_curriculum_bpd": bpd["no_curriculum"]},
        holds=likelihood["better"] and samples["better"],
        paired={"bpd no_curriculum - jetformer": likelihood,
                "accuracy jetformer - no_curriculum": samples},
        comparison="paired over seeds: bpd(no_curriculum) < bpd(jetformer) and "
                   "accuracy(jetformer) > accuracy(no_curriculum)"))
  if {"jetformer", "no_factor_out"} <= bpd.keys():
    comparison = paired("sample_accuracy", "jetformer", "no_factor_out", lower_is_better=False)
    claims.append(results.claim(
        "factoring_out_helps",
        "Modelling only part of each soft token autoregressively (the rest under N(0, 1)) gives "
        "better class-conditional samples than modelling every dimension.",
        ours=accuracy["jetformer"],
        baselines={"no_factor_out_accuracy": accuracy["no_factor_out"],
                   "jetformer_bpd": bpd["jetformer"], "no_factor_out_bpd": bpd["no_factor_out"]},
        holds=comparison["better"], paired=comparison,
        comparison="paired over seeds: sample accuracy jetformer > no_factor_out"))
  headline = (results.headline("test bits/dim, JetFormer on 8x8 digits", ours=bpd["jetformer"],
                               paper=None, unit="bpd") if "jetformer" in bpd else None)
  return metrics, claims, headline


def plot_samples(samples: np.ndarray, labels_per_row: int, num_classes: int, title: str):
  """A grid: one row per class, `labels_per_row` samples each."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(num_classes, labels_per_row,
                           figsize=(0.6 * labels_per_row, 0.6 * num_classes))
  axes = np.asarray(axes).reshape(num_classes, labels_per_row)
  for c in range(num_classes):
    for j in range(labels_per_row):
      axes[c, j].imshow(samples[c * labels_per_row + j, ..., 0], cmap="gray_r", vmin=0, vmax=16)
      axes[c, j].axis("off")
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return fig


def plot_likelihood_vs_samples(per_seed: dict[str, dict[str, list]], title: str):
  """Test bpd against sample accuracy, one point per training seed, one colour per variant:
  the trade-off the curriculum claim is about, at a glance."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(5.5, 4))
  for name, bpds in per_seed["test_bpd"].items():
    accuracies = per_seed["sample_accuracy"][name]
    points = [(b, a) for b, a in zip(bpds, accuracies) if a is not None]
    if points:
      ax.scatter(*zip(*points), label=name, s=30)
  ax.set_xlabel("test bits/dim (lower is better)")
  ax.set_ylabel("class-conditional sample accuracy")
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig
