"""Times the official ENAMEL evaluator (q-rz/enamel, the `enam` package, through its `demo.py`).

Started by `enamel_speed.py --official DIR [--official-python PATH]`. The evaluator needs only
numpy, pandas and tqdm, which jaxlab's environment has, so PATH defaults to this Python; it is
never imported by jaxlab. The entry point is the one `demo.py` runs: `demo.get_args` for every
default (tests 8/4/4/4 per level, 6 repeats, hardness 0/3/3/4, timeout factor 2, tolerance
0.01 s, 4 GiB, seed 998244353), `enam.Evaluator` on the checkout's `dataset/enamel.csv` and its
142-problem `PROBLEMSET`, the tests made once before the first window (`make_tests`, saved under
`--cache`; the later runs load them, as `demo.py --tests` does), and `Evaluator.evaluate` of one
sample file from the checkout's `samples/` (`Loader.load`). One timed unit is one full
evaluation: references re-timed per problem (`compute_refs`) and every sample run, checked and
timed, which is what `enamel_speed.py` times for ours.

Changes needed to run it, and nothing else: results are not saved (`save_name=None`), and the
official code's prints (tqdm's bars) go to stderr.

Protocol: see `official_protocol.py` (`serve`); each window runs whole evaluations, so a window
of under a minute is one evaluation, and its reply carries the official metrics of the last
(pass@k, eff@k).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

import official_protocol  # benchmarks/, the script's own directory


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--official", required=True, type=pathlib.Path)
  parser.add_argument("--file", default="humanevalplus-canonical")
  parser.add_argument("--cache", type=pathlib.Path, default=pathlib.Path("/tmp/enamel_official"))
  args = parser.parse_args()
  protocol = official_protocol.take_stdout()   # the official code prints to stdout
  # demo.py resolves its dataset and samples relative to the checkout.
  os.chdir(args.official)
  sys.path.insert(0, str(args.official))
  import demo  # pylint: disable=g-import-not-at-top

  options = demo.get_args(["--load_name", args.file])
  evaluator = demo.Evaluator(
      problems=options.dataset, subset=options.subset, n_tests=options.n_tests,
      n_reps=options.n_reps, hardness=options.hardness, memory_giga=options.memory_giga,
      timeout_factor=options.timeout_factor, tolerence_sec=options.tolerence_sec,
      seed=options.seed)
  args.cache.mkdir(parents=True, exist_ok=True)
  tests = args.cache / "official"
  if not evaluator.load_tests(fname=f"{tests}~tests.pkl"):
    evaluator.make_tests(save_name=str(tests))
  codes = demo.Loader(json_path=options.json_path, zip_path=options.zip_path,
                      tmp_path=options.tmp_path).load(args.file)
  metrics = {}

  def evaluate():
    metrics.update(evaluator.evaluate(codes, k=options.eval_k, save_name=None))

  official_protocol.serve(evaluate, protocol, details=lambda: dict(metrics), file=args.file,
                          problems=len(evaluator.subset), n_tests=list(options.n_tests),
                          n_reps=options.n_reps)


if __name__ == "__main__":
  main()
