"""reward_reduction: which (method, seeds, preset) chunks finish on this backend, and which hang.

  python benchmarks/reward_reduction_hang_check.py [--wait 90] [ours:3:paper pca:5:paper ...]

On XLA:CPU with jax 0.10.2 some of the training chunks never complete: the caller waits on the
chunk's output and every worker thread idles (method README, Deviations). Each case here trains
one method for 1,000 environment steps at a preset's settings in its own process (seeds not
padded, so `ae`'s padding can be checked too) and is reported `hung` when it has not finished
within --wait seconds. Run it on a new jaxlib or another backend before trusting the paper preset
there. Prints a table; writes nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CASES = ("ours:3:quick", "ours:3:paper", "pca:5:paper", "npca:5:paper", "ae:3:quick",
                 "ae:4:quick")


def run_case(method: str, num_seeds: int, preset: str) -> None:
  """Trains one case in this process (the child side)."""
  sys.path.insert(0, str(ROOT))
  import jax  # pylint: disable=g-import-not-at-top
  from experiments import reward_reduction as experiment  # pylint: disable=g-import-not-at-top
  from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxlab.core import parallel  # pylint: disable=g-import-not-at-top
  from jaxlab.methods.reward_reduction import training  # pylint: disable=g-import-not-at-top
  from jaxlab.methods.reward_reduction import traffic  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(ROOT / "configs" / "reward_reduction.py", preset)
  _, traffic_config, settings = experiment.options(
      config_lib.with_overrides(config, {"methods": method}))
  env_params = traffic.demand(int(config.env.demand_seed), traffic_config,
                              vehicles=float(config.env.vehicles),
                              weibull_scale=float(config.env.weibull_scale))
  chosen = dataclasses.replace(settings[method], total_steps=1_000)
  run = training.train(chosen, env_params, list(range(num_seeds)), mesh=parallel.make_mesh(),
                       progress=False)
  jax.block_until_ready(run.state)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("cases", nargs="*", default=DEFAULT_CASES,
                      help="method:seeds:preset, e.g. ours:3:paper")
  parser.add_argument("--wait", type=float, default=90.0,
                      help="seconds before a case counts as hung (a finished one takes 7-15 s)")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    method, seeds, preset = args.child.split(":")
    run_case(method, int(seeds), preset)
    return
  print("| method | seeds | preset | outcome | seconds |\n|---|---|---|---|---|")
  for case in args.cases:
    method, seeds, preset = case.split(":")
    tic = time.perf_counter()
    try:
      done = subprocess.run([sys.executable, __file__, "--child", case], cwd=ROOT,
                            timeout=args.wait, capture_output=True, text=True, check=False)
      outcome = "ok" if done.returncode == 0 else f"error: {done.stderr.strip()[-200:]}"
    except subprocess.TimeoutExpired:
      outcome = "hung"
    print(f"| {method} | {seeds} | {preset} | {outcome} | {time.perf_counter() - tic:.1f} |",
          flush=True)


if __name__ == "__main__":
  main()
