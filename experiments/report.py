"""Rebuilds results/REPORT.md and the README's methods table from results/*.json; with --run,
first runs one preset of every experiment (or of some) and says what it did.

  python -m experiments.report
  python -m experiments.report --run [--preset=quick|long] [--only=slug,slug]

`make report` is the first form, `make reproduce [PRESET=long] [ONLY=<slug>]` the second. With
--run each experiment runs in its own process with `--workdir=workdirs/<slug>-<preset>` (so a
rerun resumes), one after another; a failure is reported and the others still run. With
`--preset=long` and no `--only`, configs without a long preset are skipped (named in the table);
naming one in `--only` is an error. After the rebuild a table lists, per method: preset, wall
time of this invocation, the results' own wall time (it includes training resumed from earlier
invocations), claims held / tested, and the outcome; then the total time. The exit status is 1
when any experiment failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys
import time

from jaxlab.core import config as config_lib
from jaxlab.core import results

ROOT = results.REPO_ROOT

# The nineteen methods, in the order of the project's mission.
METHODS = (
    ("sg_unlearn", "Adversarial Machine Unlearning"),
    ("ctrl", "Adding Conditional Control to Diffusion Models with Reinforcement Learning"),
    ("enamel", "How efficient is LLM-generated code? (ENAMEL, eff@k)"),
    ("lotus", "Lotus: Diffusion-based Visual Foundation Model for Dense Prediction"),
    ("leap", "Better than Your Teacher: LLM Agents that Learn from Privileged AI Feedback"),
    ("reward_reduction", "Reward Dimension Reduction for Scalable Multi-Objective RL"),
    ("sr_wdro", "Mitigating Robust Overfitting in Wasserstein DRO"),
    ("flow_mi", "Flow-based Variational Mutual Information"),
    ("precision_ls", "Towards Learning High-Precision Least Squares Algorithms with Sequence "
                     "Models"),
    ("metametrics", "MetaMetrics: Calibrating Metrics for Generation Tasks"),
    ("neural_spacetimes", "Neural Spacetimes for DAG Representation Learning"),
    ("ise", "Instructional Segment Embedding"),
    ("btbs_lns", "Binarized-Tightening, Branch and Search on Learning LNS Policies for MIP"),
    ("semantix", "Semantix: An Energy-guided Sampler for Semantic Style Transfer"),
    ("diffusion_purification", "Robustness of Diffusion-Based Purification: A Stochastic "
                               "Perspective (ADDT, RBGM)"),
    ("attention_pruning", "Beyond Linear Approximations: Pruning the Attention Matrix"),
    ("jetformer", "JetFormer: An Autoregressive Generative Model of Raw Images and Text"),
    ("freecg", "FreeCG: Free the Design Space of Clebsch-Gordan Transform for Force Fields"),
    ("pico", "PiCO: Peer Review in LLMs based on Consistency Optimization"),
)


@dataclasses.dataclass
class Outcome:
  slug: str
  preset: str
  status: str            # ok | failed (exit N) | skipped (reason)
  wall_s: float = 0.0
  results_wall_s: float | None = None
  held: int | None = None
  tested: int | None = None


def config_slugs() -> list[str]:
  return sorted(p.stem for p in (ROOT / "configs").glob("[!_]*.py"))


def has_preset(slug: str, preset: str) -> bool:
  try:
    config_lib.load_config(ROOT / "configs" / f"{slug}.py", preset)
  except config_lib.ConfigError as e:
    if str(e).startswith(f"unknown preset {preset!r}"):
      return False
    raise
  return True


def run_one(slug: str, preset: str, python: str) -> Outcome:
  workdir = ROOT / "workdirs" / f"{slug}-{preset}"
  command = [python, "-m", f"experiments.{slug}", f"--config=configs/{slug}.py:{preset}",
             f"--workdir={workdir.relative_to(ROOT)}"]
  print(f"== {slug} ({preset}) ==", flush=True)
  start = time.perf_counter()
  returncode = subprocess.run(command, cwd=ROOT, check=False).returncode
  outcome = Outcome(slug, preset, "ok" if returncode == 0 else f"failed (exit {returncode})",
                    wall_s=time.perf_counter() - start)
  payload_path = workdir / "results.json"
  if returncode == 0 and payload_path.exists():
    payload = json.loads(payload_path.read_text())
    claims = payload.get("claims") or []
    outcome.results_wall_s = payload.get("wall_s")
    outcome.held = sum(bool(c.get("holds")) for c in claims)
    outcome.tested = len(claims)
  return outcome


def summary_table(outcomes: list[Outcome], total_s: float) -> str:
  lines = ["| method | preset | wall time (s) | results wall_s | claims held / tested | outcome |",
           "|---|---|---|---|---|---|"]
  for o in outcomes:
    claims = f"{o.held} / {o.tested}" if o.tested is not None else "—"
    wall = f"{o.wall_s:.1f}" if not o.status.startswith("skipped") else "—"
    lines.append(f"| `{o.slug}` | {o.preset} | {wall} | "
                 f"{results.format_number(o.results_wall_s)} | {claims} | {o.status} |")
  held = sum(o.held or 0 for o in outcomes)
  tested = sum(o.tested or 0 for o in outcomes)
  lines.append(f"| **total** | | {total_s:.1f} | | {held} / {tested} | "
               f"{sum(o.status == 'ok' for o in outcomes)} ok |")
  return "\n".join(lines)


def rebuild() -> None:
  for path in results.rebuild(METHODS, ROOT / "README.md"):
    print(f"rebuilt {path.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--run", action="store_true",
                      help="run the experiments first (what `make reproduce` does)")
  parser.add_argument("--preset", default="quick",
                      help="with --run: quick (default) or long; smoke and paper work too")
  parser.add_argument("--only", default="",
                      help="with --run: comma-separated slugs (default: every config)")
  parser.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if not args.run:
    rebuild()
    return 0
  known = config_slugs()
  only = [s.strip() for s in args.only.split(",") if s.strip()]
  for slug in only:
    if slug not in known:
      parser.error(f"--only names {slug!r}; configs/ has {', '.join(known)}")
  outcomes, start = [], time.perf_counter()
  for slug in only or known:
    if not has_preset(slug, args.preset):
      if only:
        parser.error(f"configs/{slug}.py has no {args.preset!r} preset")
      outcomes.append(Outcome(slug, args.preset, f"skipped (no {args.preset} preset)"))
      continue
    outcomes.append(run_one(slug, args.preset, args.python))
  total_s = time.perf_counter() - start
  rebuild()
  print()
  print(summary_table(outcomes, total_s))
  return 1 if any(o.status.startswith("failed") for o in outcomes) else 0


if __name__ == "__main__":
  sys.exit(main())
