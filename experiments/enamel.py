"""enamel: scores sample files with the ENAMEL protocol (pass@k, eff@k) in a sandbox.

  python -m experiments.enamel --config=configs/enamel.py:quick          # the 3 shipped files
  python -m experiments.enamel --config=configs/enamel.py --config.samples=PATH

Generates (once, cached under the data directory) and loads the test cases, then evaluates each
sample file problem by problem (resumable: `<workdir>/<file>/metrics.jsonl`), prints pass@k and
eff@k, and writes per-problem outcomes to `<workdir>/<file>/per_problem.json` and the summary to
`<workdir>/results.json` (for the quick preset on the shipped files, also `results/enamel.json`).
"""
from __future__ import annotations

import time

import ml_collections

from jaxlab.core import cli
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import results
from jaxlab.methods.enamel import problems as problems_lib
from jaxlab.methods.enamel import reproduction
from jaxlab.methods.enamel import testgen

SLUG = "enamel"


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  samples = reproduction.validate(config)
  indices = reproduction.problem_indices(config)
  all_problems = problems_lib.load_problems()
  tests = testgen.load_tests(all_problems, indices, data_dir=config.data.data_dir,
                             progress=lambda todo: metrics_lib.progress_iter(
                                 todo, "generating tests", enabled=config.train.progress))
  summary = {name: reproduction.evaluate_file(file_samples, indices, all_problems, tests,
                                              config, workdir, name)
             for name, file_samples in samples.items()}
  for name, metrics in summary.items():
    print(f"{name}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()
                                  if k.startswith(("pass@", "eff@"))), flush=True)
  claims, headline = reproduction.claims(summary)
  return results.write_results(
      workdir, slug=SLUG, config=config, metrics=summary, claims=claims,
      headline_metric=headline, wall_s=time.perf_counter() - start,
      publish=config.preset == "quick" and not config.samples)


if __name__ == "__main__":
  cli.run(main, single_process=(
      "eff@k compares execution times, which must all be measured on one machine, and the "
      "sandbox runs one candidate at a time on it"))
