"""Evaluating sample files: every problem's references, every sample scored, pass@k and eff@k.

Resumable: each problem's outcome is appended to `<workdir>/<sample file>/metrics.jsonl` as soon
as it is scored; a rerun on the same workdir reloads the problems already there and evaluates
only the rest (delete the file to re-time everything).
"""
from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any

import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import results
from jaxlab.methods.enamel import estimators
from jaxlab.methods.enamel import evaluation
from jaxlab.methods.enamel import problems as problems_lib
from jaxlab.methods.enamel import testgen

# Published (README leaderboard) and official-evaluator (enam 0.2.0, 2-core CPU) pass@1 / eff@1.
PUBLISHED = {"humaneval-canonical": (0.908, 0.458), "humanevalplus-canonical": (0.958, 0.517),
             "enamel-references": (1.0, 1.0)}
OFFICIAL_HERE = {"humaneval-canonical": (0.9085, 0.4725),
                 "humanevalplus-canonical": (0.9648, 0.5224),
                 "enamel-references": (1.0, 0.9867)}


def settings(config: ml_collections.ConfigDict) -> evaluation.Settings:
  e = config.eval
  return evaluation.Settings(hardness=tuple(e.hardness), num_repeats=e.num_repeats,
                             timeout_factor=e.timeout_factor, tolerance_s=e.tolerance_s,
                             memory_bytes=int(e.memory_gib * 2**30))


def problem_indices(config: ml_collections.ConfigDict) -> list[int]:
  """The problem set, or the subset `data.problems` names, capped at `train.steps` problems."""
  chosen = config.data.problems
  if chosen == "all":
    indices = list(problems_lib.PROBLEMSET)
  else:
    try:
      indices = [int(s) for s in chosen.split(",") if s.strip()]
    except ValueError:
      raise config_lib.ConfigError("config key 'data.problems' must be 'all' or a comma-"
                                   f"separated list of problem indices, got {chosen!r}") from None
    outside = [i for i in indices if i not in problems_lib.PROBLEMSET]
    if outside:
      raise config_lib.ConfigError(f"config key 'data.problems' names {outside}, which are not "
                                   "in the 142-problem set")
  return indices[:config.train.steps]


def sample_files(config: ml_collections.ConfigDict) -> dict[str, pathlib.Path]:
  if config.samples:
    path = pathlib.Path(config.samples)
    return {path.stem: path}
  return {name: problems_lib.sample_file_path(name) for name in problems_lib.SAMPLE_FILES}


def validate(config: ml_collections.ConfigDict) -> dict[str, dict[int, list[str]]]:
  """Loads (and so checks) every sample file before anything runs."""
  problem_indices(config)
  for key in ("num_repeats", "timeout_factor", "memory_gib"):
    if config.eval[key] <= 0:
      raise config_lib.ConfigError(f"config key 'eval.{key}' must be positive")
  if len(config.eval.hardness) != len(testgen.NUM_TESTS):
    raise config_lib.ConfigError(f"config key 'eval.hardness' needs {len(testgen.NUM_TESTS)} "
                                 "levels")
  return {name: problems_lib.load_samples(path) for name, path in sample_files(config).items()}


def evaluate_file(samples: dict[int, list[str]], indices: list[int],
                  all_problems: list[problems_lib.Problem],
                  tests: dict[int, testgen.ProblemTests], config: ml_collections.ConfigDict,
                  workdir: str, name: str) -> dict[str, Any]:
  """Scores one sample file; returns per-problem outcomes and the summary metrics."""
  out_dir = pathlib.Path(workdir) / name
  out_dir.mkdir(parents=True, exist_ok=True)
  done = {}
  log = out_dir / "metrics.jsonl"
  if log.exists():
    done = {r["problem"]: r for r in metrics_lib.read_jsonl(log)}
  run_settings = settings(config)
  start = time.perf_counter()
  with metrics_lib.MetricWriter(out_dir) as writer:
    todo = [i for i in indices if i not in done]
    for i in metrics_lib.progress_iter(todo, desc=f"{name}", enabled=config.train.progress):
      problem = all_problems[i]
      references = evaluation.measure_references(problem, tests[i], run_settings)
      check = testgen.checker(problem)
      scores = [evaluation.score_sample(problem, code, tests[i], references, run_settings, check)
                for code in samples[i]]
      record = {"problem": i, "passed": [s.passed for s in scores],
                "efficiency": [s.efficiency for s in scores],
                "levels": [s.level_efficiencies for s in scores],
                "outcome": [s.outcome for s in scores],
                "time_limit_s": references.time_limit,
                "eval/pass": float(np.mean([s.passed for s in scores])),
                "eval/efficiency": float(np.mean([s.efficiency for s in scores]))}
      writer.write(indices.index(i) + 1, record)
      done[i] = record
  records = [done[i] for i in indices]
  num_samples = min(len(r["passed"]) for r in records)
  ks = estimators.ks_to_report(num_samples, tuple(config.eval.ks))
  efficiencies = np.asarray([r["efficiency"][:num_samples] for r in records], np.float64)
  correct = np.asarray([sum(r["passed"][:num_samples]) for r in records])
  summary: dict[str, Any] = {}
  for k in ks:
    summary[f"pass@{k}"] = float(np.mean(np.asarray(estimators.pass_at_k(correct, num_samples,
                                                                         k))))
    summary[f"eff@{k}"] = float(np.mean(np.asarray(estimators.eff_at_k(efficiencies, k))))
  summary["problems"] = len(records)
  summary["wall_s"] = round(time.perf_counter() - start, 1)
  outcomes = [o for r in records for o in r["outcome"]]
  summary["outcomes"] = {o: outcomes.count(o) for o in sorted(set(outcomes))}
  (out_dir / "per_problem.json").write_text(json.dumps(records, indent=1) + "\n")
  return summary


def claims(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
  """pass@1 must equal the official evaluator's (deterministic); eff@1 is reported next to it
  and the published figure (machine-dependent)."""
  out, headline = [], None
  full = all(m["problems"] == len(problems_lib.PROBLEMSET) for m in summary.values())
  for name, metrics in summary.items():
    if name not in OFFICIAL_HERE or not full:
      continue
    official_pass, official_eff = OFFICIAL_HERE[name]
    out.append(results.claim(
        f"pass1_matches_official_{name}",
        f"{name}: pass@1 equals the official evaluator's (correctness is deterministic)",
        ours=metrics["pass@1"], holds=abs(metrics["pass@1"] - official_pass) < 5e-4,
        baselines={"official_enam_0.2.0": official_pass, "eff@1 ours": metrics["eff@1"],
                   "eff@1 official here": official_eff},
        paper=f"pass@1 {PUBLISHED[name][0]}, eff@1 {PUBLISHED[name][1]}",
        comparison="|pass@1 - official| < 5e-4 (one problem is 1/142 = 7e-3)"))
  if "humanevalplus-canonical" in summary:
    m = summary["humanevalplus-canonical"]
    headline = results.headline("HumanEval+ canonical eff@1 (pass@1)",
                                ours=f"{m['eff@1']:.3f} ({m['pass@1']:.4f})",
                                paper="0.517 (0.958)")
  return out, headline
