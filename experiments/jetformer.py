"""jetformer reproduction: trains every variant on 8x8 digits, evaluates, tests the paper's claims.

  python -m experiments.jetformer --config=configs/jetformer.py:quick

Each variant trains its seeds (vmapped) with the shared loop in `<workdir>/<variant>/`
(resumable). Writes `<workdir>/results.json` (and, for the quick and long presets,
`results/jetformer[_long].json`), a grid of class-conditional samples per variant (seed 0) and a
plot of test bpd against sample accuracy per seed.
"""
from __future__ import annotations

import os
import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import metrics
from jaxlab.core import results
from jaxlab.core import train_loop
from jaxlab.methods.jetformer import reproduction
from jaxlab.methods.jetformer import training

SLUG = "jetformer"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  classify, classifier_accuracy = reproduction.fit_classifier(config)
  per_variant, earlier_s = {}, 0.0
  for name in metrics.progress_iter(reproduction.selected_variants(config), "variants",
                                    enabled=config.train.progress):
    variant = reproduction.variant_config(config, name)
    run = train_loop.run(training.make_experiment(variant), variant,
                         os.path.join(workdir, name), desc=name)
    earlier_s += run.earlier_s
    per_variant[name] = reproduction.evaluate_variant(variant, run.state["params"], classify)
  summary, claims, headline = reproduction.summarize(
      per_variant, classifier_accuracy,
      samples_per_seed=config.data.num_classes * config.eval.samples_per_class,
      clean_phase=training.clean_phase(config))
  for name, outcome in per_variant.items():
    accuracy = outcome["sample_accuracy"][0]
    title = (f"{name} (seed 0): test bpd {outcome['test_bpd'][0]:.3f}"
             + (f", classifier accuracy {accuracy:.2f}" if accuracy is not None
                else " (unconditional)"))
    figure = reproduction.plot_samples(outcome["samples"], config.eval.samples_per_class,
                                       config.data.num_classes, title)
    results.save_figure(figure, workdir, f"samples_{name}.png", SLUG, config)
  figure = reproduction.plot_likelihood_vs_samples(
      summary["per_seed"], f"{config.preset}: one point per training seed")
  results.save_figure(figure, workdir, "likelihood_vs_samples.png", SLUG, config)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + earlier_s,
      seeds=list(range(config.train.num_seeds)))


if __name__ == "__main__":
  cli.run(main)
