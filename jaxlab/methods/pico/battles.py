"""Judged battles as arrays: the one format every part of pico reads.

A battle is one reviewer's double verdict on one pair of models' answers to one question (the
second game with the answers in swapped order, both verdicts in the original labels). Its outcome
for the pair, from the official scoring: more `model_1` than `model_2` verdicts -> model_a wins
(1, 0), the reverse -> (0, 1), otherwise (1/2, 1/2) (disagreements, ties and errors).

Reviewers are models too (peer review): `reviewer[i]` indexes `models`, like `model_a` and
`model_b`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

VERDICTS = ("model_1", "model_2", "tie", "error")


@dataclasses.dataclass(frozen=True)
class Battles:
  models: tuple[str, ...]      # every ranked model; indices below point into it
  model_a: np.ndarray          # [B] int32, the first model of the pair (the file's model_1)
  model_b: np.ndarray          # [B] int32
  reviewer: np.ndarray         # [B] int32, the judging model
  score_a: np.ndarray          # [B] float32 in {0, 0.5, 1}; model_b's is 1 - score_a
  question: np.ndarray         # [B] int32, question id

  def __post_init__(self):
    sizes = {len(a) for a in (self.model_a, self.model_b, self.reviewer, self.score_a,
                              self.question)}
    if len(sizes) != 1:
      raise ValueError(f"battle arrays have different lengths: {sorted(sizes)}")

  @property
  def num_battles(self) -> int:
    return int(len(self.score_a))

  @property
  def num_models(self) -> int:
    return len(self.models)

  def take(self, index: np.ndarray) -> "Battles":
    """The battles at `index` (a subset, e.g. a fraction of each reviewer's)."""
    index = np.asarray(index)
    return dataclasses.replace(self, model_a=self.model_a[index], model_b=self.model_b[index],
                               reviewer=self.reviewer[index], score_a=self.score_a[index],
                               question=self.question[index])


def outcome(first: str, second: str) -> float:
  """model_1's score from the two verdicts (official scoring); unknown verdicts raise."""
  for verdict in (first, second):
    if verdict not in VERDICTS:
      raise ValueError(f"unknown verdict {verdict!r}; expected one of {VERDICTS}")
  wins_1 = (first == "model_1") + (second == "model_1")
  wins_2 = (first == "model_2") + (second == "model_2")
  return 1.0 if wins_1 > wins_2 else 0.0 if wins_2 > wins_1 else 0.5


def from_records(records: Sequence[dict], models: Sequence[str]) -> Battles:
  """Battles from judgment records in the official schema (`question_id`, `model_1`,
  `model_2`, `g1_winner`, `g2_winner`, `judge` = [reviewer, prompt]). A model or judge not in
  `models`, or a ranked model without battles, raises naming it."""
  index = {name: i for i, name in enumerate(models)}
  columns: dict[str, list] = {k: [] for k in ("a", "b", "r", "s", "q")}
  for n, record in enumerate(records):
    judge = record["judge"][0] if isinstance(record["judge"], (list, tuple)) else record["judge"]
    for role, name in (("model_1", record["model_1"]), ("model_2", record["model_2"]),
                       ("judge", judge)):
      if name not in index:
        raise ValueError(f"record {n}: {role} {name!r} is not a ranked model")
    columns["a"].append(index[record["model_1"]])
    columns["b"].append(index[record["model_2"]])
    columns["r"].append(index[judge])
    columns["s"].append(outcome(record["g1_winner"], record["g2_winner"]))
    columns["q"].append(int(record["question_id"]))
  battles = Battles(tuple(models), np.asarray(columns["a"], np.int32),
                    np.asarray(columns["b"], np.int32), np.asarray(columns["r"], np.int32),
                    np.asarray(columns["s"], np.float32), np.asarray(columns["q"], np.int32))
  seen = np.zeros(len(models), bool)
  seen[battles.model_a] = True
  seen[battles.model_b] = True
  missing = [models[i] for i in np.flatnonzero(~seen)]
  if missing:
    raise ValueError(f"ranked model(s) {missing} have no battles")
  return battles
