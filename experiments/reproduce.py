"""Runs one preset of every experiment (or of some), rebuilds the report, and says what it did.

  python -m experiments.reproduce [--preset=quick|long] [--only=slug,slug]

`make reproduce [PRESET=long] [ONLY=<slug>]` calls this. Each experiment runs in its own process
with `--workdir=workdirs/<slug>-<preset>` (so a rerun resumes), one after another; a failure is
reported and the others still run. With `--preset=long` and no `--only`, configs without a long
preset are skipped (named in the table); naming one in `--only` is an error. At the end
`results/REPORT.md` and the README table are rebuilt from results/*.json and a table lists, per
method: preset, wall time of this invocation, the results' own wall time (it includes training
resumed from earlier invocations), claims held / tested, and the outcome; then the total time.
The exit status is 1 when any experiment failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys
import time

from experiments import report
from jaxlab.core import config as config_lib
from jaxlab.core import results

ROOT = pathlib.Path(__file__).resolve().parents[1]


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


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--preset", default="quick",
                      help="quick (default) or long; smoke and paper work too")
  parser.add_argument("--only", default="", help="comma-separated slugs (default: every config)")
  parser.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  known = config_slugs()
  only = [s.strip() for s in args.only.split(",") if s.strip()]
  for slug in only:
    if slug not in known:
      parser.error(f"--only names {slug!r}; configs/ has {', '.join(known)}")
  slugs = only or known
  outcomes, start = [], time.perf_counter()
  for slug in slugs:
    if not has_preset(slug, args.preset):
      if only:
        parser.error(f"configs/{slug}.py has no {args.preset!r} preset")
      outcomes.append(Outcome(slug, args.preset, f"skipped (no {args.preset} preset)"))
      continue
    outcomes.append(run_one(slug, args.preset, args.python))
  total_s = time.perf_counter() - start
  for path in results.rebuild(report.METHODS, ROOT / "README.md"):
    print(f"rebuilt {path.relative_to(ROOT)}")
  print()
  print(summary_table(outcomes, total_s))
  return 1 if any(o.status.startswith("failed") for o in outcomes) else 0


if __name__ == "__main__":
  sys.exit(main())
