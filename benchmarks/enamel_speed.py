"""Throughput of the ENAMEL sandbox and the wall time of a full evaluation of one sample file.

  python benchmarks/enamel_speed.py [--file humanevalplus-canonical] [--no-append] [--brief]

--brief (a smoke check; never writes RESULTS.md): the round trip as below (2,000 calls take a
fraction of a second, fewer leave the start-up's jitter in the per-call figure), the full evaluation
cut to the first 10 problems with 2 repeats per case instead of 6. It runs no JAX: its time is the
sandbox's, on the CPU, whatever the machine's accelerator.

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* worker start-up time (one sandboxed process per sample and problem) and the per-call round trip
  once the worker is up, on a trivial program;
* programs executed per second over a full evaluation (reference timing + the sample, every case
  and repeat) and its wall time, with the tests already generated (cached). The official
  evaluator (enam 0.2.0) needs about one minute per sample file on a 2-core CPU; the target is
  under two minutes.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.common import brief_mark, parse_args, publish, machine, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import problems  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import reproduction  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import sandbox  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import testgen  # pylint: disable=g-import-not-at-top

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRIVIAL = "def f(x):\n    return x + 1\n"


def startup_and_round_trip(calls: int = 2000) -> tuple[float, float]:
  start = time.perf_counter()
  sandbox.run_cases(TRIVIAL, "f", [((1,), 1, 1.0)])
  startup = time.perf_counter() - start
  start = time.perf_counter()
  sandbox.run_cases(TRIVIAL, "f", [((i,), 1, 1.0) for i in range(calls)])
  per_call = (time.perf_counter() - start - startup) / calls
  return startup, per_call


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--file", default="humanevalplus-canonical")
  parser.add_argument("--workdir", default="/tmp/enamel_speed")
  parser.add_argument("--no-append", action="store_true")
  args = parse_args(parser)
  startup, per_call = startup_and_round_trip()
  overrides = {"train": {"progress": False}}
  if args.brief:
    # train.steps caps the problems evaluated; 2 repeats per case, as in the smoke preset.
    overrides = {"train": {"progress": False, "steps": 10}, "eval": {"num_repeats": 2}}
  config = config_lib.with_overrides(
      config_lib.load_config(ROOT / "configs" / "enamel.py", "quick"), overrides)
  all_problems = problems.load_problems()
  indices = reproduction.problem_indices(config)
  tests = testgen.load_tests(all_problems, indices)
  samples = problems.load_samples(problems.sample_file_path(args.file))
  settings = reproduction.settings(config)
  calls = sum(2 * sum(len(cases) * settings.repeats(level)
                      for level, cases in enumerate(tests[i].inputs)) for i in indices)
  workdir = pathlib.Path(args.workdir) / str(time.time_ns())
  start = time.perf_counter()
  summary = reproduction.evaluate_file(samples, indices, all_problems, tests, config,
                                       str(workdir), args.file)
  wall = time.perf_counter() - start
  text = (f"\n## enamel sandbox and full evaluation, {machine()}{brief_mark(args)}\n\n"
          f"| measure | value |\n|---|---|\n"
          f"| worker start-up (spawn, limits, exec of a trivial program) | {startup * 1e3:.1f} ms |\n"
          f"| round trip per call once the worker is up | {per_call * 1e6:.0f} µs |\n"
          f"| full evaluation of `{args.file}` ({len(indices)} problems, references re-timed, "
          f"cached tests) | {wall:.1f} s |\n"
          f"| calls scheduled (references + samples, every case and repeat; a sample stopped by "
          f"a time-out runs fewer) | {calls} |\n"
          f"| scheduled calls per second over the full evaluation | {calls / wall:.0f} |\n"
          f"| pass@1 / eff@1 of that run | {summary['pass@1']:.4f} / {summary['eff@1']:.4f} |\n"
          f"\nOfficial evaluator (enam 0.2.0) on a 2-core CPU: about 60 s per sample file once "
          f"the tests exist; target: under 120 s.\n")
  publish([text], "enamel", write=writes_results(args))


if __name__ == "__main__":
  main()
