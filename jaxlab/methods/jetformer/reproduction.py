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
from jaxlab.core import results
from jaxlab.data import digits
from jaxlab.methods.jetformer import sampling
from jaxlab.methods.jetformer import training

VARIANTS = ("jetformer", "flow_only", "ar_raw_patches", "no_curriculum", "no_factor_out")


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


def test_bpd(config: ml_collections.ConfigDict, params: Any, key: jax.Array) -> float:
  """Class-conditional bits per dimension on the whole test split (one dequantisation draw)."""
  model = training.make_model(config)
  batch = {k: jnp.asarray(v) for k, v in training.train_arrays(config, "test").items()}

  @jax.jit
  def bpd(params):
    _, metrics = training.loss_fn(model.module(params), batch, key, config=config,
                                  noise_std=jnp.zeros([]), train=False)
    return metrics["bpd"]
  return float(bpd(params))


def generate(config: ml_collections.ConfigDict, params: Any, key: jax.Array) -> tuple[
    np.ndarray, np.ndarray]:
  """(`samples_per_class` images per class, their intended labels)."""
  model = training.make_model(config)
  labels = jnp.repeat(jnp.arange(config.data.num_classes), config.eval.samples_per_class)

  @jax.jit
  def draw(params, key):
    return sampling.sample_levels(
        model.module(params), key, labels, temperature=config.eval.temperature,
        cfg_weight=config.eval.cfg_weight, num_candidates=config.eval.rejection_candidates,
        num_levels=config.data.num_levels, patch=config.model.patch,
        image_shape=digits.IMAGE_SHAPE)
  return np.asarray(draw(params, key)), np.asarray(labels)


def understanding_accuracy(config: ml_collections.ConfigDict, params: Any) -> float:
  model = training.make_model(config)
  test = training.train_arrays(config, "test")
  predict = jax.jit(lambda p, images: sampling.predict_classes(
      model.module(p), images, num_levels=config.data.num_levels, patch=config.model.patch))
  return float(np.mean(np.asarray(predict(params, jnp.asarray(test["image"])))
                       == test["label"]))


def evaluate_variant(config: ml_collections.ConfigDict, params: Any, classify
                     ) -> dict[str, Any]:
  key = jax.random.key(config.seed + 1)
  out: dict[str, Any] = {"test_bpd": test_bpd(config, params, key)}
  samples, labels = generate(config, params, jax.random.fold_in(key, 1))
  out["samples"] = samples
  # Without a decoder the model cannot condition on the class: no sample accuracy to report.
  out["sample_accuracy"] = (float(np.mean(classify(samples) == labels))
                            if config.model.use_decoder else None)
  if config.model.use_decoder and config.optim.understanding_prob > 0:
    out["understanding_accuracy"] = understanding_accuracy(config, params)
  return out


def summarize(per_variant: dict[str, dict[str, Any]], classifier_accuracy: float
              ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
  bpd = {v: r["test_bpd"] for v, r in per_variant.items()}
  accuracy = {v: r["sample_accuracy"] for v, r in per_variant.items()}
  metrics: dict[str, Any] = {"test_bpd": bpd, "sample_accuracy": accuracy,
                             "classifier_test_accuracy": classifier_accuracy}
  if "jetformer" in per_variant and "understanding_accuracy" in per_variant["jetformer"]:
    metrics["understanding_accuracy"] = per_variant["jetformer"]["understanding_accuracy"]
  claims = []
  if {"jetformer", "ar_raw_patches"} <= bpd.keys():
    claims.append(results.claim(
        "flow_beats_raw_patches",
        "Training the flow end to end with the AR model gives a better likelihood than the same "
        "GMM-AR model on raw patches (no flow).",
        ours=bpd["jetformer"], baselines={"ar_raw_patches": bpd["ar_raw_patches"]},
        holds=bpd["jetformer"] < bpd["ar_raw_patches"],
        comparison="test bpd jetformer < ar_raw_patches"))
  if {"jetformer", "flow_only"} <= bpd.keys():
    claims.append(results.claim(
        "ar_prior_beats_flow_alone",
        "An autoregressive prior over the flow's soft tokens beats the flow with a factorised "
        "N(0, 1) prior (Jet alone).",
        ours=bpd["jetformer"], baselines={"flow_only": bpd["flow_only"]},
        holds=bpd["jetformer"] < bpd["flow_only"],
        comparison="test bpd jetformer < flow_only"))
  if {"jetformer", "no_curriculum"} <= bpd.keys():
    holds = (bpd["no_curriculum"] <= bpd["jetformer"]
             and accuracy["jetformer"] > accuracy["no_curriculum"])
    claims.append(results.claim(
        "curriculum_trades_likelihood_for_samples",
        "The noise curriculum trades likelihood for sample quality: without it the test bpd is "
        "lower but class-conditional samples are recognised less often.",
        ours=accuracy["jetformer"],
        baselines={"no_curriculum_accuracy": accuracy["no_curriculum"],
                   "jetformer_bpd": bpd["jetformer"], "no_curriculum_bpd": bpd["no_curriculum"]},
        holds=holds,
        comparison="bpd(no_curriculum) <= bpd(jetformer) and accuracy(jetformer) > "
                   "accuracy(no_curriculum)"))
  if {"jetformer", "no_factor_out"} <= bpd.keys():
    claims.append(results.claim(
        "factoring_out_helps",
        "Modelling only part of each soft token autoregressively (the rest under N(0, 1)) gives "
        "better class-conditional samples than modelling every dimension.",
        ours=accuracy["jetformer"],
        baselines={"no_factor_out_accuracy": accuracy["no_factor_out"],
                   "jetformer_bpd": bpd["jetformer"], "no_factor_out_bpd": bpd["no_factor_out"]},
        holds=accuracy["jetformer"] > accuracy["no_factor_out"],
        comparison="sample accuracy jetformer > no_factor_out"))
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
