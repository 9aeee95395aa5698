"""The shipped PiCO data (Apache-2.0, see data/LICENSE): the real judgments, the true order, logs.

- `true_order()`: the 15 MT-Bench models best first, the order every metric ranks against (the
  official code's `model_list`, the human Chatbot Arena order of the paper).
- `load_real()`: gpt-3.5-turbo's 3,291 double-order judgments as `battles.Battles`; the only
  reviewer whose judgments exist offline.
- `disagreement_rate()`: how often its two verdicts contradict each other, and how often the
  first-position answer wins both games; what `simulate.calibrate_top_reviewer` fits.
- `official_logs()`: the 16 official runs on the full 15-reviewer data (seed 4), parsed.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import pathlib
import re
from typing import Sequence, Union

import numpy as np

from jaxlab.methods.pico import battles as battles_lib

DATA_DIR = pathlib.Path(__file__).with_name("data")
REAL_FILE = DATA_DIR / "gpt-3.5-turbo_pair_short.jsonl"
QUESTIONS_FILE = DATA_DIR / "mt_bench_questions.jsonl"
LOG_DIR = DATA_DIR / "official_logs"

PathLike = Union[str, os.PathLike]
Records = Sequence[dict]


@functools.lru_cache(maxsize=None)
def true_order() -> tuple[str, ...]:
  """The 15 model names, best first (ground_truth.json)."""
  with open(DATA_DIR / "ground_truth.json") as file:
    return tuple(json.load(file)["true_order"])


def read_jsonl(path: PathLike) -> list[dict]:
  """One dict per non-empty line."""
  with open(path) as file:
    return [json.loads(line) for line in file if line.strip()]


def load_real(path: PathLike | None = None) -> battles_lib.Battles:
  """The real judgment file as battles over `true_order()` (3,291 battles, one reviewer).

  Unknown verdicts, models or judges and ranked models without battles raise, naming them.
  """
  return battles_lib.from_records(read_jsonl(path or REAL_FILE), models=true_order())


def double_verdict_rates(g1_winner: Sequence[str], g2_winner: Sequence[str]) -> dict[str, float]:
  """The two position-bias rates of double verdicts, both in the original labels.

  - "disagree": one game says `model_1`, the other `model_2` (the verdict followed the position,
    not the answer). A tie against a win is not counted: that is how the data README's "about
    42%" arises (41.8%; counting every differing pair, ties included, gives 45.9%).
  - "first_position": the answer shown first won both games: game 1 `model_1` (model_1 was first)
    and game 2 `model_2` (the swapped game shows model_2 first).
  """
  first = np.asarray(g1_winner)
  second = np.asarray(g2_winner)
  if first.shape != second.shape or first.ndim != 1 or first.size == 0:
    raise ValueError(f"need two equally long, non-empty verdict lists; got shapes "
                     f"{first.shape} and {second.shape}")
  first_wins_both = (first == "model_1") & (second == "model_2")
  second_wins_both = (first == "model_2") & (second == "model_1")
  return {"disagree": float(np.mean(first_wins_both | second_wins_both)),
          "first_position": float(np.mean(first_wins_both))}


def disagreement_rate(records: Records | PathLike | None = None) -> dict[str, float]:
  """`double_verdict_rates` of judgment records (a JSONL path, the records, or the real file).

  Takes the raw records, not `Battles`: a battle's score of 1/2 merges contradictions with ties.
  """
  if records is None or isinstance(records, (str, os.PathLike)):
    records = read_jsonl(records or REAL_FILE)
  if isinstance(records, battles_lib.Battles):
    raise TypeError("disagreement_rate needs the raw verdicts (records or a JSONL path): "
                    "Battles keep only the combined outcome")
  return double_verdict_rates([r["g1_winner"] for r in records],
                              [r["g2_winner"] for r in records])


# One log line: "2024-02-06 16:53:48,712 - INFO - <message>".
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - INFO - (.*)$")
_HEADER = re.compile(r"^#+ (.+?)#+$")
_RANKED = re.compile(r"^#(\d+) (\S+) \| Grade:(\S+)$")
_STEM = re.compile(r"^frac([\d.]+)_(\w+)_seed(\d+)$")


def _parse_log_blocks(text: str) -> list[dict]:
  """Each "########## <run> ##########" block of a log: its ranking and metric lines."""
  blocks: list[dict] = []
  for line in text.splitlines():
    match = _LOG_LINE.match(line.strip())
    if not match:
      continue
    time = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    message = match.group(2).strip()
    if header := _HEADER.match(message):
      blocks.append({"run": header.group(1), "start": time, "ranking": [], "grades": []})
      continue
    if not blocks:
      raise ValueError(f"log line before any run header: {line!r}")
    block = blocks[-1]
    if ranked := _RANKED.match(message):
      if int(ranked.group(1)) != len(block["ranking"]) + 1:
        raise ValueError(f"ranking lines out of order at {line!r}")
      block["ranking"].append(ranked.group(2))
      block["grades"].append(float(ranked.group(3)))
      block["ranked_at"] = time
    elif message.startswith("["):
      block["order"] = json.loads(message)
    elif message.startswith("Permutation Entropy:"):
      block["pen_consecutive"] = json.loads(message.split(":", 1)[1])[0]
    elif message.startswith("Random Permutation Entropy:"):
      block["pen_random"] = json.loads(message.split(":", 1)[1])[0]
    elif message.startswith("Number of Count Inversions:"):
      block["cin"] = int(message.split(":", 1)[1])
    elif message.startswith("Number of Longest Increasing Subsequence:"):
      block["lis"] = int(message.split(":", 1)[1])
    else:
      raise ValueError(f"unrecognised log line {line!r}")
  return blocks


def parse_log(path: PathLike) -> dict:
  """One official log: the last run block (the `Reversed` logs hold the same block twice).

  Returns {"method", "fraction", "seed" (from the file name), "run" (the block header),
  "ranking" (names, best first), "grades", "order" (the ranking as indices into `true_order()`,
  as logged and checked against the names), "pen_consecutive" and "pen_random" (the logged
  permutation entropies: consecutive windows, random triples), "cin", "lis", "seconds" (header
  to ranking: the run time), "num_blocks"}.
  """
  path = pathlib.Path(path)
  blocks = _parse_log_blocks(path.read_text())
  if not blocks:
    raise ValueError(f"{path.name}: no run block")
  keys = ("ranking", "order", "pen_consecutive", "pen_random", "cin", "lis")
  for block in blocks:
    missing = [k for k in keys if k not in block or (k == "ranking" and not block[k])]
    if missing:
      raise ValueError(f"{path.name}: run {block['run']!r} lacks {missing}")
  # Repeated blocks are reruns of the same deterministic job; a mismatch means a different run.
  if any(tuple(b["order"]) != tuple(blocks[-1]["order"]) for b in blocks):
    raise ValueError(f"{path.name}: its run blocks give different rankings")
  last = blocks[-1]
  reference = {name: i for i, name in enumerate(true_order())}
  if [reference[name] for name in last["ranking"]] != list(last["order"]):
    raise ValueError(f"{path.name}: logged indices do not match the ranked names")
  stem = _STEM.match(path.stem)
  if not stem:
    raise ValueError(f"{path.name}: expected frac<f>_<method>_seed<s>.log")
  return {"method": stem.group(2), "fraction": float(stem.group(1)), "seed": int(stem.group(3)),
          "run": last["run"], "ranking": tuple(last["ranking"]), "grades": tuple(last["grades"]),
          "order": tuple(last["order"]), "pen_consecutive": float(last["pen_consecutive"]),
          "pen_random": float(last["pen_random"]), "cin": last["cin"], "lis": last["lis"],
          "seconds": (last["ranked_at"] - last["start"]).total_seconds(),
          "num_blocks": len(blocks)}


def official_logs(log_dir: PathLike | None = None) -> dict[str, dict]:
  """`parse_log` of every official log, keyed by file stem (e.g. "frac1_Peer_review_seed4")."""
  paths = sorted(pathlib.Path(log_dir or LOG_DIR).glob("*.log"))
  if not paths:
    raise FileNotFoundError(f"no *.log files in {log_dir or LOG_DIR}")
  return {path.stem: parse_log(path) for path in paths}
