"""diffusion_purification reproduction: classifier, DDPM, three fine-tunings, attacks, claims.

  python -m experiments.diffusion_purification --config=configs/diffusion_purification.py:quick

  python -m experiments.diffusion_purification \
      --config=configs/diffusion_purification.py:quick,ablation=x0_mlp

Trainings resume from `<workdir>/{classifier,pretrain,finetune/<model>}/`. Writes
`<workdir>/results.json` (and, for the quick preset, `results/diffusion_purification.json`) and a
figure of the accuracies with example adversarial and purified digits.
"""
from __future__ import annotations

import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import results
from jaxlab.methods.diffusion_purification import reproduction

SLUG = "diffusion_purification"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  reproduction.validate(config)
  classifier_params, denoisers, earlier_s, prior = reproduction.train_all(config, workdir)
  summary = reproduction.evaluate(config, classifier_params, denoisers)
  summary["prior"] = prior
  claims, headline = reproduction.claims(summary)
  shown = denoisers.get("addt", next(iter(denoisers.values())))
  figure = reproduction.plot(summary, reproduction.examples(config, classifier_params, shown))
  # An ablation's results stay in the workdir; the README names the file under
  # results/ablations/ each is copied to.
  publish = False if config.ablation else None
  results.save_figure(figure, workdir, "robustness.png", SLUG, config, publish=publish)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start + earlier_s, publish=publish)


if __name__ == "__main__":
  cli.run(main)
