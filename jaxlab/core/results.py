"""results.json: the one place an experiment's measured numbers live, and the report built from them.

Shape (read by the report builder and by other tools):

  {"slug": ..., "preset": ..., "commit": <git sha>, "wall_s": ..., "device": "cpu x1 (2 cores)",
   "seeds": [...], "headline": {"name": ..., "ours": ..., "paper": ..., "unit": ...},
   "metrics": {...nested...},
   "claims": [{"name", "statement", "ours", "baselines", "paper", "holds", "comparison",
               "paired"}]}

`holds` is computed by the experiment from measured numbers. A claim that compares two arms is
decided by `paired_comparison` over >= 2 (in practice >= 3) seeds or paired examples, and carries
its numbers in `paired`. `wall_s` is the time it took to
produce the results, including the training time of earlier invocations that this one resumed. The quick preset also copies the file
to `results/<slug>.json` (the long preset to `results/<slug>_long.json`), which
`python -m experiments.report` turns into `results/REPORT.md` and the README's method table.
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
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import parallel

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "results"
STATUSES = ("not started", "partial", "reproduced")


SIGNIFICANCE = 2.0   # a paired difference counts when it exceeds this many standard errors


def standard_error(values: Sequence[float] | np.ndarray) -> float:
  """Standard error of the mean, std (ddof 1) / sqrt(n); NaN for fewer than two values."""
  values = np.asarray(values, np.float64).reshape(-1)
  return float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else math.nan


def paired_comparison(ours: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray,
                      *, lower_is_better: bool, min_effect: float = 0.0) -> dict[str, Any]:
  """Decides "ours is better than the baseline" over paired values (the same seeds, or the same
  examples and keys): differences `ours - baseline` per pair, their mean and standard error.

  `better` is the one-sided verdict: the mean improvement (in the better direction) exceeds
  `min_effect` by more than `SIGNIFICANCE` standard errors. `mean_better` is the plain comparison
  of the two means (improvement > `min_effect`), kept beside it. For metrics spanning orders of
  magnitude (an MSE of 1e-13 against 1e-5) pass logarithms, so no single pair dominates. A
  non-finite difference gives `better = False` and is counted in `nonfinite`.

  Raises ValueError for fewer than two pairs (one seed is an anecdote, not a verdict) or arms of
  different lengths.
  """
  ours = np.asarray(ours, np.float64).reshape(-1)
  baseline = np.asarray(baseline, np.float64).reshape(-1)
  if ours.shape != baseline.shape:
    raise ValueError(f"paired_comparison needs the same pairs in both arms; got {ours.size} "
                     f"values for ours and {baseline.size} for the baseline")
  n = int(ours.size)
  if n < 2:
    raise ValueError(f"paired_comparison needs >= 2 paired values (seeds or examples), got "
                     f"n={n}: a single pair has no standard error, so no verdict is possible")
  difference = ours - baseline
  finite = np.isfinite(difference)
  mean = float(difference.mean())
  stderr = standard_error(difference)
  improvement = -mean if lower_is_better else mean
  all_finite = bool(finite.all())
  return {"difference": mean, "stderr": stderr, "n": n,
          "ours_mean": float(ours.mean()), "baseline_mean": float(baseline.mean()),
          "lower_is_better": bool(lower_is_better), "min_effect": float(min_effect),
          "better": all_finite and improvement - min_effect > SIGNIFICANCE * stderr,
          "mean_better": all_finite and improvement > min_effect,
          "nonfinite": int(n - finite.sum())}


def format_paired(paired: Mapping[str, Any]) -> str:
  """`0.031 +- 0.008 (n=5)` for one comparison; `label: ...; label: ...` for a mapping of them."""
  if "n" not in paired:
    return "; ".join(f"{label}: {format_paired(p)}" for label, p in paired.items())
  verdict = "" if paired.get("better") else ", not significant"
  return (f"{format_number(paired['difference'])} +- {format_number(paired['stderr'])} "
          f"(n={paired['n']}{verdict})")


def claim(name: str, statement: str, *, ours: Any, holds: bool,
          baselines: Mapping[str, Any] | None = None, paper: Any = None,
          comparison: str = "",
          paired: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """One claim of the paper tested by the experiment; `holds` comes from measured numbers.

  `paired` is a `paired_comparison` result (or a mapping of labels to several of them) when the
  claim compares two arms over seeds or paired examples.
  """
  out = {"name": name, "statement": statement, "ours": ours,
         "baselines": dict(baselines or {}), "paper": paper, "holds": bool(holds),
         "comparison": comparison}
  if paired is not None:
    out["paired"] = metrics_lib.to_python(dict(paired))
  return out


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


# Set by the command line (`core.cli`) when `--config.<key>=...` overrides or `:<preset>,key=value`
# config arguments change the preset: such a
# run is not the preset's result, so it must not replace the file under results/.
_publish_blocked_by: list[str] = []


def block_publishing(overridden_keys: Sequence[str]) -> None:
  """Later `write_results` / `save_figure` calls in this process publish nothing by default."""
  _publish_blocked_by[:] = list(overridden_keys)


def _default_publish(config: ml_collections.ConfigDict) -> bool:
  return config.preset in config_lib.PUBLISHED_PRESETS and not _publish_blocked_by


def published_stem(slug: str, config: ml_collections.ConfigDict) -> str:
  """`<slug>` for the quick preset, `<slug>_<preset>` otherwise (`<slug>_long`)."""
  return config_lib.results_stem(slug, config.preset)


def write_results(workdir: str | os.PathLike, *, slug: str, config: ml_collections.ConfigDict,
                  metrics: Mapping[str, Any], claims: Sequence[Mapping[str, Any]],
                  headline_metric: Mapping[str, Any] | None, wall_s: float,
                  seeds: Sequence[int] | None = None,
                  publish: bool | None = None) -> dict[str, Any]:
  """Writes `workdir/results.json`; for the quick and long presets (or with `publish`) also
  `results/<slug>.json` or `results/<slug>_long.json`, unless `block_publishing` was called."""
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
    publish = _default_publish(config)
  if publish and path.exists():
    RESULTS_DIR.mkdir(exist_ok=True)
    shutil.copyfile(path, RESULTS_DIR / f"{published_stem(slug, config)}.json")
  return payload


def save_figure(figure: Any, workdir: str | os.PathLike, filename: str, slug: str,
                config: ml_collections.ConfigDict, publish: bool | None = None) -> None:
  """Saves a matplotlib figure in the workdir (process 0) and, for quick and long runs (or as
  `publish` says), in results/ as `<slug>_<filename>` or `<slug>_long_<filename>`. Closes the
  figure: pyplot keeps every open one alive, and a process that runs several experiments (a
  notebook, the test workers) would accumulate them."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  try:
    if jax.process_index() != 0:
      return
    path = pathlib.Path(workdir) / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    if publish is None:
      publish = _default_publish(config)
    if publish:
      RESULTS_DIR.mkdir(exist_ok=True)
      shutil.copyfile(path, RESULTS_DIR / f"{published_stem(slug, config)}_{filename}")
  finally:
    plt.close(figure)


def load_all(results_dir: str | os.PathLike = RESULTS_DIR) -> dict[str, dict[str, Any]]:
  """`results/*.json` by file stem: `<slug>` (quick) and `<slug>_long` (long)."""
  out = {}
  for path in sorted(pathlib.Path(results_dir).glob("*.json")):
    with open(path, encoding="utf-8") as f:
      out[path.stem] = json.load(f)
  return out


def merged_claims(quick: Mapping[str, Any] | None,
                  long: Mapping[str, Any] | None) -> list[dict[str, Any]]:
  """The claims that decide a method's status: the quick preset's, each replaced by the long
  preset's claim of the same name where one exists (a claim about a converged regime is decided
  at the budget where it can hold), plus claims only the long preset tests."""
  long_claims = {c.get("name"): c for c in (long or {}).get("claims") or []}
  out = [long_claims.pop(c.get("name"), c) for c in (quick or {}).get("claims") or []]
  return out + list(long_claims.values())


def status_of(payload: Mapping[str, Any] | None,
              long: Mapping[str, Any] | None = None) -> str:
  """`reproduced` when every claim holds, `partial` when a result exists but a claim does not."""
  if not payload and not long:
    return "not started"
  claims = merged_claims(payload, long)
  return "reproduced" if claims and all(c.get("holds") for c in claims) else "partial"


def format_number(value: Any) -> str:
  if value is None:
    return "—"
  if isinstance(value, Mapping):
    return ", ".join(f"{k}: {format_number(v)}" for k, v in value.items())
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
  lines = ["| claim | holds | ours | baselines | paper | paired difference (ours - baseline) "
           "| test |", "|---|---|---|---|---|---|---|"]
  for c in payload.get("claims", []):
    baselines = ", ".join(f"{k}: {format_number(v)}" for k, v in c.get("baselines", {}).items())
    paired = format_paired(c["paired"]) if c.get("paired") else "—"
    lines.append(f"| {table_cell(c['statement'])} | {'yes' if c['holds'] else '**no**'} | "
                 f"{format_number(c.get('ours'))} | {baselines or '—'} | "
                 f"{table_cell(format_number(c.get('paper')))} | {table_cell(paired)} | "
                 f"{table_cell(c.get('comparison', ''))} |")
  return lines


def run_line(payload: Mapping[str, Any]) -> str:
  stem = config_lib.results_stem(str(payload.get("slug")), str(payload.get("preset")))
  return (f"Measured by the `{payload.get('preset')}` preset at commit "
          f"`{str(payload.get('commit'))[:10]}` in {payload.get('wall_s')} s on "
          f"{payload.get('device')}, seeds {payload.get('seeds')} (`results/{stem}.json`).")


# Metrics under a key of this name hold every seed's values: kept in results.json for paired
# comparisons, left out of the README tables (which show the means and standard errors).
PER_SEED_KEY = "per_seed"


def method_results_block(payload: Mapping[str, Any],
                         long: Mapping[str, Any] | None = None) -> str:
  """The measured numbers of one results.json (and of its long preset), for the method's README."""
  lines = []
  for run in (p for p in (payload, long) if p):
    if run is long:
      lines += ["", "**`long` preset** (decides the claims it shares with the quick preset):", ""]
    lines += [run_line(run), ""]
    lines += claims_table(run)
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| `{name}` | {format_number(value) if not isinstance(value, list) else value} |"
              for name, value in flatten_metrics(run.get("metrics", {}))
              if PER_SEED_KEY not in name.split(".")]
  return "\n".join(lines)


def _replace_block(text: str, begin: str, end: str, body: str) -> str:
  head, rest = text.split(begin, 1)
  _, tail = rest.split(end, 1)
  return f"{head}{begin}\n{body}\n{end}{tail}"


def _command(slug: str, preset: str) -> str:
  return f"`python -m experiments.{slug} --config=configs/{slug}.py:{preset}`"


def methods_table(methods: Sequence[tuple[str, str]],
                  payloads: Mapping[str, Mapping[str, Any]]) -> str:
  """The README's table: one row per (slug, title), status and headline from results files. A
  method with a long preset shows the long headline (marked) and both commands."""
  lines = ["| method | paper | status | headline (ours) | paper | command |",
           "|---|---|---|---|---|---|"]
  for slug, title in methods:
    payload, long = payloads.get(slug), payloads.get(config_lib.results_stem(slug, "long"))
    status = status_of(payload, long)
    long_head = (long or {}).get("headline") or {}
    head = long_head or (payload or {}).get("headline") or {}
    ours = paper = "—"
    if head:
      marker = "; `long` preset" if long_head else ""
      ours = table_cell(f"{format_number(head.get('ours'))} ({head.get('name', '')}{marker})")
      paper = table_cell(format_number(head.get("paper")))
    commands = []
    if payload or (REPO_ROOT / "configs" / f"{slug}.py").exists():
      commands.append(_command(slug, "quick"))
    if long:
      commands.append(_command(slug, "long"))
    lines.append(f"| `{slug}` | {title} | {status} | {ours} | {paper} | "
                 f"{'<br>'.join(commands) or '—'} |")
  return "\n".join(lines)


def _plots(stem: str, results_dir: pathlib.Path, exclude: str | None = None) -> list[str]:
  plots = sorted(results_dir.glob(f"{stem}_*.png"))
  return [f"![{p.stem}]({p.name})" for p in plots
          if exclude is None or not p.name.startswith(exclude)]


def report_markdown(methods: Sequence[tuple[str, str]],
                    payloads: Mapping[str, Mapping[str, Any]],
                    results_dir: str | os.PathLike = RESULTS_DIR) -> str:
  """results/REPORT.md: every claim of every method with results, the long preset's under the
  quick one's, with links to the plots."""
  results_dir = pathlib.Path(results_dir)
  out = ["# jaxlab reproduction report", "",
         "Generated by `python -m experiments.report` from `results/*.json`; every number below "
         "was produced by running the experiment's quick preset, or its `long` preset where a "
         "claim needs a larger budget (a long claim decides the status in place of the quick "
         "claim of the same name).", "",
         methods_table(methods, payloads), ""]
  for slug, title in methods:
    long_stem = config_lib.results_stem(slug, "long")
    runs = [(payloads.get(slug), slug, f"{long_stem}_"),
            (payloads.get(long_stem), long_stem, None)]
    if not any(run for run, _, _ in runs):
      continue
    out += [f"## `{slug}`: {title}", ""]
    for run, stem, exclude in runs:
      if not run:
        continue
      if stem == long_stem:
        out += ["### `long` preset", ""]
      out += [run_line(run), ""]
      out += claims_table(run)
      plots = _plots(stem, results_dir, exclude)
      if plots:
        out += [""] + plots
      out.append("")
  return "\n".join(out)


def rebuild(methods: Sequence[tuple[str, str]], readme: str | os.PathLike,
            results_dir: str | os.PathLike = RESULTS_DIR) -> list[pathlib.Path]:
  """Rewrites results/REPORT.md, the README's methods table and each method README's results
  block from results/*.json. Returns the files written."""
  payloads = load_all(results_dir)
  report = pathlib.Path(results_dir, "REPORT.md")
  report.write_text(report_markdown(methods, payloads, results_dir) + "\n")
  readme = pathlib.Path(readme)
  text = readme.read_text()
  if TABLE_BEGIN not in text or TABLE_END not in text:
    raise ValueError(f"{readme} has no {TABLE_BEGIN!r} ... {TABLE_END!r} block to rewrite")
  readme.write_text(_replace_block(text, TABLE_BEGIN, TABLE_END,
                                   methods_table(methods, payloads)))
  written = [report, readme]
  for slug, _ in methods:
    payload = payloads.get(slug)
    long = payloads.get(config_lib.results_stem(slug, "long"))
    method_readme = REPO_ROOT / "jaxlab" / "methods" / slug / "README.md"
    if (payload or long) and method_readme.exists() and (
        RESULTS_BEGIN in method_readme.read_text()):
      method_readme.write_text(_replace_block(method_readme.read_text(), RESULTS_BEGIN,
                                              RESULTS_END, method_results_block(payload, long)))
      written.append(method_readme)
  return written
