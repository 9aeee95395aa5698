"""The ENAMEL problem set and sample files, shipped as package data (Apache-2.0, see data/).

`enamel.csv` holds 164 HumanEval problems with, for each, the prompt, an input generator, four
input sizes (levels), an expert reference solution, a checker and the entry point. The benchmark
scores 142 of them (`PROBLEMSET`). A sample file is JSON: a list with one list of complete
programs per problem (all 164, or only the 142 of the problem set, in order), or a dict from
problem index to a list of programs.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib
from typing import Any

DATA_DIR = pathlib.Path(__file__).with_name("data")
NUM_PROBLEMS = 164
EXCLUDED = frozenset({2, 23, 41, 45, 53, 60, 71, 92, 97, 99, 102, 123, 124, 135, 137, 138, 144,
                      148, 156, 157, 159, 160})
PROBLEMSET = tuple(i for i in range(NUM_PROBLEMS) if i not in EXCLUDED)
SAMPLE_FILES = ("humaneval-canonical", "humanevalplus-canonical", "enamel-references")


@dataclasses.dataclass(frozen=True)
class Problem:
  index: int
  task_id: str
  prompt: str
  input_generator: str
  levels: tuple[int, ...]       # input size of each level
  reference_solution: str       # a function body, appended to the prompt
  checker: str                  # defines __check(input, answer, output)
  entry_point: str

  @property
  def reference_program(self) -> str:
    return self.prompt + "\n" + self.reference_solution


def load_problems(path: str | os.PathLike | None = None) -> list[Problem]:
  """All 164 problems, in index order."""
  path = pathlib.Path(path or DATA_DIR / "enamel.csv")
  with open(path, newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  if len(rows) != NUM_PROBLEMS:
    raise ValueError(f"{path} has {len(rows)} problems, expected {NUM_PROBLEMS}")
  return [Problem(index=i, task_id=r["task_id"], prompt=r["prompt"],
                  input_generator=r["input_generator"],
                  levels=tuple(int(s) for s in r["input_levels"].split()),
                  reference_solution=r["reference_solution"], checker=r["checker"],
                  entry_point=r["entry_point"]) for i, r in enumerate(rows)]


def sample_file_path(name: str) -> pathlib.Path:
  """A shipped sample file by name (`SAMPLE_FILES`) or any path."""
  shipped = DATA_DIR / f"{name}.json"
  return shipped if shipped.exists() else pathlib.Path(name)


def load_samples(path: str | os.PathLike) -> dict[int, list[str]]:
  """{problem index: programs} for every problem of the problem set; clear errors otherwise."""
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"samples file {path} does not exist")
  try:
    raw: Any = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as error:
    raise ValueError(f"samples file {path} is not valid JSON: {error}") from None
  if isinstance(raw, list):
    if len(raw) == NUM_PROBLEMS:
      by_index = dict(enumerate(raw))
    elif len(raw) == len(PROBLEMSET):
      by_index = dict(zip(PROBLEMSET, raw))
    else:
      raise ValueError(f"samples file {path} lists {len(raw)} problems; expected "
                       f"{NUM_PROBLEMS} (all) or {len(PROBLEMSET)} (the problem set)")
  elif isinstance(raw, dict):
    try:
      by_index = {int(key): value for key, value in raw.items()}
    except ValueError:
      raise ValueError(f"samples file {path}: dict keys must be problem indices") from None
    missing = [i for i in PROBLEMSET if i not in by_index]
    if missing:
      raise ValueError(f"samples file {path} has no programs for problems {missing[:10]}"
                       + (" ..." if len(missing) > 10 else ""))
  else:
    raise ValueError(f"samples file {path} must hold a JSON list of lists or a dict of lists, "
                     f"not {type(raw).__name__}")
  samples = {}
  for index in PROBLEMSET:
    programs = by_index[index]
    if not isinstance(programs, list) or not programs:
      raise ValueError(f"samples file {path}: problem {index} needs a non-empty list of "
                       f"programs, got {type(programs).__name__}")
    bad = [j for j, p in enumerate(programs) if not isinstance(p, str)]
    if bad:
      raise ValueError(f"samples file {path}: problem {index}, samples {bad[:5]} are not "
                       "strings")
    samples[index] = programs
  return samples
