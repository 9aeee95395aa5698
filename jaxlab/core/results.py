"""results.json: the one place an experiment's measured numbers live, and the report built from them.

Shape (read by the report builder and by other tools):

  {"slug": ..., "preset": ..., "commit": <git sha>, "wall_s": ..., "device": "cpu x1 (2 cores)",
   "seeds": [...], "headline": {"name": ..., "ours": ..., "paper": ..., "unit": ...},
   "metrics": {...nested...},
   "claims": [{"name", "statement", "ours", "baselines", "paper", "holds"}]}

`holds` is computed by the experiment from measured numbers. `wall_s` is the time it took to
produce the results, including the training time of earlier invocations that this one resumed. The quick preset also copies the file
to `results/<slug>.json`, which `python -m experiments.report` turns into `results/REPORT.md` and
the README's method table.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
from typing import Any, Mapping, Sequence

import jax
import ml_collections

from jaxlab.core import metrics as metrics_lib
from jaxlab.core import parallel

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "results"
STATUSES = ("not started", "partial", "reproduced")


def claim(name: str, statement: str, *, ours: Any, holds: bool,
          baselines: Mapping[str, Any] | None = None, paper: Any = None,
          comparison: str = "") -> dict[str, Any]:
  """One claim of the paper tested by the experiment; `holds` comes from measured numbers."""
  return {"name": name, "statement": statement, "ours": ours,
          "baselines": dict(baselines or {}), "paper": paper, "holds": bool(holds),
          "comparison": comparison}


def headline(name: str, *, ours: float | None, paper: Any, unit: str = "") -> dict[str, Any]:
  """The one number the README table shows for a method, next to the paper's."""
  return {"name": name, "ours": ours, "paper": paper, "unit": unit}


def git_commit() -> str:
  """HEAD's sha, with "+dirty" when tracked files outside results/ differ from it (the numbers
  then come from code that no commit holds; results/ is what the run itself writes)."""
  try:
    git = lambda *args: subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                                       text=True, check=True).stdout.strip()
    sha = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  ":(exclude)results")
    return sha + ("+dirty" if changed else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def write_results(workdir: str | os.PathLike, *, slug: str, config: ml_collections.ConfigDict,
                  metrics: Mapping[str, Any], claims: Sequence[Mapping[str, Any]],
                  headline_metric: Mapping[str, Any] | None, wall_s: float,
                  seeds: Sequence[int] | None = None,
                  publish: bool | None = None) -> dict[str, Any]:
  """Writes `workdir/results.json`; with the quick preset (or `publish`) also `results/<slug>.json`."""
  payload = {
      "slug": slug,
      "preset": config.preset,
      "commit": git_commit(),
      "wall_s": round(float(wall_s), 1),
      "device": parallel.describe_devices(),
      "seeds": list(seeds if seeds is not None else [config.seed]),
      "headline": dict(headline_metric) if headline_metric else None,
      "metrics": metrics_lib.to_python(dict(metrics)),
      "claims": [dict(c) for c in claims],
  }
  path = pathlib.Path(workdir) / "results.json"
  metrics_lib.write_json(path, payload)
  if publish is None:
    publish = config.preset == "quick"
  if publish and path.exists():
    RESULTS_DIR.mkdir(exist_ok=True)
    shutil.copyfile(path, RESULTS_DIR / f"{slug}.json")
  return payload


def save_figure(figure: Any, workdir: str | os.PathLike, filename: str, slug: str,
                config: ml_collections.ConfigDict) -> None:
  """Saves a matplotlib figure in the workdir (process 0) and, for quick runs, in results/."""
  if jax.process_index() != 0:
    return
  path = pathlib.Path(workdir) / filename
  path.parent.mkdir(parents=True, exist_ok=True)
  figure.savefig(path, dpi=120)
  if config.preset == "quick":
    RESULTS_DIR.mkdir(exist_ok=True)
    shutil.copyfile(path, RESULTS_DIR / f"{slug}_{filename}")


def load_all(results_dir: str | os.PathLike = RESULTS_DIR) -> dict[str, dict[str, Any]]:
  """`results/<slug>.json` files by slug."""
  out = {}
  for path in sorted(pathlib.Path(results_dir).glob("*.json")):
    with open(path, encoding="utf-8") as f:
      payload = json.load(f)
    out[payload.get("slug", path.stem)] = payload
  return out


def status_of(payload: Mapping[str, Any] | None) -> str:
  """`reproduced` when every claim holds, `partial` when a result exists but a claim does not."""
  if not payload:
    return "not started"
  claims = payload.get("claims") or []
  return "reproduced" if claims and all(c.get("holds") for c in claims) else "partial"


def format_number(value: Any) -> str:
  if value is None:
    return "—"
  if isinstance(value, bool):
    return "yes" if value else "no"
  if isinstance(value, (int, float)):
    if value == 0 or not math.isfinite(value):
      return str(value)
    if abs(value) >= 1e4 or abs(value) < 1e-2:
      return f"{value:.2e}"
    return f"{value:.3g}"
  return str(value)


TABLE_BEGIN = "<!-- methods-table:begin (generated by `python -m experiments.report`) -->"
TABLE_END = "<!-- methods-table:end -->"
RESULTS_BEGIN = "<!-- results:begin (generated by `python -m experiments.report`) -->"
RESULTS_END = "<!-- results:end -->"


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
  """Nested metrics -> [("grad_mse.softmax", 0.03), ...] (lists of scalars kept whole)."""
  rows = []
  for key, value in metrics.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      rows += flatten_metrics(value, f"{name}.")
    else:
      rows.append((name, value))
  return rows


def table_cell(value: Any) -> str:
  """Text safe inside a Markdown table cell (a literal `|` would split the cell)."""
  return str(value).replace("|", "\\|")


def claims_table(payload: Mapping[str, Any]) -> list[str]:
  lines = ["| claim | holds | ours | baselines | paper | test |", "|---|---|---|---|---|---|"]
  for c in payload.get("claims", []):
    baselines = ", ".join(f"{k}: {format_number(v)}" for k, v in c.get("baselines", {}).items())
    lines.append(f"| {table_cell(c['statement'])} | {'yes' if c['holds'] else '**no**'} | "
                 f"{format_number(c.get('ours'))} | {baselines or '—'} | "
                 f"{table_cell(format_number(c.get('paper')))} | "
                 f"{table_cell(c.get('comparison', ''))} |")
  return lines


def method_results_block(payload: Mapping[str, Any]) -> str:
  """The measured numbers of one results.json, for the method's README."""
  lines = [f"Measured by the `{payload.get('preset')}` preset at commit "
           f"`{str(payload.get('commit'))[:10]}` in {payload.get('wall_s')} s on "
           f"{payload.get('device')} (`results/{payload.get('slug')}.json`).", ""]
  lines += claims_table(payload)
  lines += ["", "| metric | value |", "|---|---|"]
  lines += [f"| `{name}` | {format_number(value) if not isinstance(value, list) else value} |"
            for name, value in flatten_metrics(payload.get("metrics", {}))]
  return "\n".join(lines)


def _replace_block(text: str, begin: str, end: str, body: str) -> str:
  head, rest = text.split(begin, 1)
  _, tail = rest.split(end, 1)
  return f"{head}{begin}\n{body}\n{end}{tail}"


def methods_table(methods: Sequence[tuple[str, str]],
                  payloads: Mapping[str, Mapping[str, Any]]) -> str:
  """The README's table: one row per (slug, title), status and headline from results files."""
  lines = ["| method | paper | status | headline (ours) | paper | command |",
           "|---|---|---|---|---|---|"]
  for slug, title in methods:
    payload = payloads.get(slug)
    status = status_of(payload)
    head = (payload or {}).get("headline") or {}
    ours = paper = "—"
    if head:
      ours = table_cell(f"{format_number(head.get('ours'))} ({head.get('name', '')})")
      paper = format_number(head.get("paper"))
    command = (f"`python -m experiments.{slug} --config=configs/{slug}.py:quick`"
               if payload or (REPO_ROOT / "configs" / f"{slug}.py").exists() else "—")
    lines.append(f"| `{slug}` | {title} | {status} | {ours} | {paper} | {command} |")
  return "\n".join(lines)


def report_markdown(methods: Sequence[tuple[str, str]],
                    payloads: Mapping[str, Mapping[str, Any]]) -> str:
  """results/REPORT.md: every claim of every reproduced method, with links to its plots."""
  out = ["# jaxlab reproduction report", "",
         "Generated by `python -m experiments.report` from `results/*.json`; every number below "
         "was produced by running the experiment's quick preset.", "",
         methods_table(methods, payloads), ""]
  for slug, title in methods:
    payload = payloads.get(slug)
    if not payload:
      continue
    out += [f"## `{slug}`: {title}", "",
            f"preset `{payload.get('preset')}`, commit `{str(payload.get('commit'))[:10]}`, "
            f"{payload.get('wall_s')} s on {payload.get('device')}, seeds {payload.get('seeds')}",
            ""]
    out += claims_table(payload)
    plots = sorted(RESULTS_DIR.glob(f"{slug}_*.png"))
    if plots:
      out.append("")
      out += [f"![{p.stem}]({p.name})" for p in plots]
    out.append("")
  return "\n".join(out)


def rebuild(methods: Sequence[tuple[str, str]], readme: str | os.PathLike,
            results_dir: str | os.PathLike = RESULTS_DIR) -> list[pathlib.Path]:
  """Rewrites results/REPORT.md, the README's methods table and each method README's results
  block from results/*.json. Returns the files written."""
  payloads = load_all(results_dir)
  report = pathlib.Path(results_dir, "REPORT.md")
  report.write_text(report_markdown(methods, payloads) + "\n")
  readme = pathlib.Path(readme)
  text = readme.read_text()
  if TABLE_BEGIN not in text or TABLE_END not in text:
    raise ValueError(f"{readme} has no {TABLE_BEGIN!r} ... {TABLE_END!r} block to rewrite")
  readme.write_text(_replace_block(text, TABLE_BEGIN, TABLE_END,
                                   methods_table(methods, payloads)))
  written = [report, readme]
  for slug, payload in payloads.items():
    method_readme = REPO_ROOT / "jaxlab" / "methods" / slug / "README.md"
    if method_readme.exists() and RESULTS_BEGIN in method_readme.read_text():
      method_readme.write_text(_replace_block(method_readme.read_text(), RESULTS_BEGIN,
                                              RESULTS_END, method_results_block(payload)))
      written.append(method_readme)
  return written
