"""Throughput of the ENAMEL sandbox and the wall time of a full evaluation of one sample file.

  python benchmarks/enamel_speed.py [--file humanevalplus-canonical] [--no-append] [--brief]
  python benchmarks/enamel_speed.py --official DIR [--official-python PATH] [--rounds 5]

--brief (a smoke check; never writes RESULTS.md): the round trip as below (2,000 calls take a
fraction of a second, fewer leave the start-up's jitter in the per-call figure), the full evaluation
cut to the first 10 problems with 2 repeats per case instead of 6. It runs no JAX: its time is the
sandbox's, on the CPU, whatever the machine's accelerator.

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* worker start-up time (one sandboxed process per sample and problem) and the per-call round trip
  once the worker is up, on a trivial program;
* programs executed per second over a full evaluation (reference timing + the sample, every case
  and repeat) and its wall time, with the tests already generated (cached). The issue's target
  is under two minutes, against about one minute for the official evaluator elsewhere.

--official DIR (a local checkout of q-rz/enamel; nothing is downloaded) times the official
evaluator's full evaluation of the same file beside ours instead, interleaved (ours, official,
... for --rounds rounds; each window is one whole evaluation of each, about a minute), in a worker
process (`benchmarks/enamel_official_worker.py` names the entry point; it needs numpy, pandas and
tqdm, which this environment has, so --official-python is optional). The table, with both sides'
pass@1 and eff@1 of their last run, goes to the "enamel official" block of RESULTS.md.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.common import add_official_flags, beside_official, brief_mark, parse_args, publish, machine, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import problems  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import reproduction  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import sandbox  # pylint: disable=g-import-not-at-top
from jaxlab.methods.enamel import testgen  # pylint: disable=g-import-not-at-top

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = pathlib.Path(__file__).resolve().parent / "enamel_official_worker.py"
TRIVIAL = "def f(x):\n    return x + 1\n"


def startup_and_round_trip(calls: int = 2000) -> tuple[float, float]:
  start = time.perf_counter()
  sandbox.run_cases(TRIVIAL, "f", [((1,), 1, 1.0)])
  startup = time.perf_counter() - start
  start = time.perf_counter()
  sandbox.run_cases(TRIVIAL, "f", [((i,), 1, 1.0) for i in range(calls)])
  per_call = (time.perf_counter() - start - startup) / calls
  return startup, per_call


def full_evaluator(file: str, workdir: pathlib.Path):
  """A callable running one full evaluation of `file` at the quick preset's settings, with the
  tests generated (or loaded) beforehand, each run in a fresh directory (an evaluation resumes
  problem by problem from its own); and the dict its last summary goes to."""
  config = config_lib.with_overrides(
      config_lib.load_config(ROOT / "configs" / "enamel.py", "quick"),
      {"train": {"progress": False}})
  all_problems = problems.load_problems()
  indices = reproduction.problem_indices(config)
  tests = testgen.load_tests(all_problems, indices)
  samples = problems.load_samples(problems.sample_file_path(file))
  last: dict = {}

  def evaluate():
    last.update(reproduction.evaluate_file(samples, indices, all_problems, tests, config,
                                           str(workdir / str(time.time_ns())), file))
  return evaluate, last


def side_by_side_lines(args) -> list[str]:
  ours_last: dict = {}

  def make_ours():
    evaluate, last = full_evaluator(args.file, pathlib.Path(args.workdir))
    ours_last.update(last=last)

    def evaluations_per_second(seconds: float) -> float:
      count, start = 0, time.perf_counter()
      while time.perf_counter() - start < seconds:
        evaluate()
        count += 1
      return count / (time.perf_counter() - start)
    return evaluations_per_second

  result, info = beside_official(args, WORKER, [f"--file={args.file}"], make_ours)
  ours, official = ours_last["last"], info.get("last_window", {})
  row = result.seconds_row(f"full evaluation of `{args.file}`", 1)
  return [f"\n## enamel beside the official evaluator, {machine()}{brief_mark(args)}\n\n",
          f"One full evaluation of `{args.file}` ({info.get('problems')} problems; tests made "
          f"beforehand, references re-timed, every case run, checked and timed; tests "
          f"{info.get('n_tests')} per level, {info.get('n_reps')} repeats). Official: "
          f"`{args.official}`, `enam.Evaluator.evaluate` as its `demo.py` sets it up "
          "(`benchmarks/enamel_official_worker.py`), in-process `exec` under `setitimer`; ours: "
          "`reproduction.evaluate_file` at the quick preset, one sandboxed worker process per "
          f"sample and problem. {args.rounds} rounds, one evaluation per window, ours then "
          "official.\n\n",
          "| workload | jaxlab s | official s | speed-up (median of rounds) | load before windows |"
          "\n|---|---|---|---|---|\n", row,
          f"\nLast run's pass@1 / eff@1: ours {ours.get('pass@1', float('nan')):.4f} / "
          f"{ours.get('eff@1', float('nan')):.4f}, official "
          f"{official.get('pass@1', float('nan')):.4f} / {official.get('eff@1', float('nan')):.4f}"
          " (pass@1 is deterministic; eff@1 depends on the machine's timings).\n"]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--file", default="humanevalplus-canonical")
  parser.add_argument("--workdir", default="/tmp/enamel_speed")
  parser.add_argument("--no-append", action="store_true")
  add_official_flags(parser)
  args = parse_args(parser)
  if args.official is not None:
    if args.brief:
      parser.error("--brief times ours alone (a cut evaluation); drop it with --official")
    publish(side_by_side_lines(args), "enamel official", write=writes_results(args))
    return
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
          f"\nTarget: under 120 s. Beside the official evaluator: the \"enamel official\" "
          f"block (`--official`).\n")
  publish([text], "enamel", write=writes_results(args))


if __name__ == "__main__":
  main()
