"""The shipped MQM judgments of the WMT21 TED-talks test suite (Apache-2.0, see data/LICENSE).

Freitag et al. (2021) had professional raters mark every error of 13 MT systems and the human
references on 529 TED-talk segments, zh-en and en-de, one rater per item. An item's human score
is minus its weighted error count (`segment_score`); it equals the shipped `avg_seg_scores` files.

- `load_pair(pair)`: the 6,877 scored MT outputs of a pair (13 systems x 529 segments), each with
  its plain translation, the reference (system `ref`) and the MQM score.
- `split_by_source(seg_ids, seed)`: a 50/50 split in which no source segment is on both sides.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import pathlib
import re
from typing import Iterable, Mapping, Sequence

import numpy as np

DATA_DIR = pathlib.Path(__file__).with_name("data")
PAIRS = ("en-de", "zh-en")
TARGET_LANGUAGE = {"en-de": "de", "zh-en": "en"}
REFERENCE_SYSTEM = "ref"
# Human translations that were rated too; neither is a candidate (refB is a second reference).
REFERENCE_SYSTEMS = ("ref", "refB")
# The `avg_seg_scores` files name the two references differently from the rating files.
AVG_FILE_SYSTEM_NAMES = {"ref-A": "ref", "ref-B": "refB"}

# Google's MQM weighting (the data README): Non-translation 25, Major 5, Minor 1, except a Minor
# punctuation error 0.1; No-error rows add nothing.
NON_TRANSLATION_WEIGHT = 25.0
MAJOR_WEIGHT = 5.0
MINOR_WEIGHT = 1.0
MINOR_PUNCTUATION_WEIGHT = 0.1

_SPAN_MARK = re.compile(r"</?v>")


def _file_stem(pair: str) -> str:
  if pair not in PAIRS:
    raise ValueError(f"pair must be one of {', '.join(PAIRS)}; got {pair!r}")
  return "mqm_ted_" + pair.replace("-", "")


def read_error_rows(pair: str, data_dir: pathlib.Path | None = None) -> list[dict[str, str]]:
  """One dict per annotated error row (or `No-error` row) of `mqm_ted_<pair>.tsv`."""
  path = pathlib.Path(data_dir or DATA_DIR) / f"{_file_stem(pair)}.tsv"
  if not path.exists():
    raise FileNotFoundError(f"{path} is missing; the package ships it under "
                            f"jaxlab/methods/metametrics/data/ (reinstall jaxlab)")
  # Fields contain bare quotes: without QUOTE_NONE the csv module would join rows.
  with open(path, encoding="utf-8", newline="") as file:
    return list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))


def strip_span_marks(target: str) -> str:
  """The plain translation: the raters' `<v>...</v>` error-span marks removed."""
  return _SPAN_MARK.sub("", target)


def error_weight(category: str, severity: str) -> float:
  """The penalty of one annotated error row."""
  if category.startswith("Non-translation"):
    return NON_TRANSLATION_WEIGHT
  if severity == "Major":
    return MAJOR_WEIGHT
  if severity == "Minor":
    return MINOR_PUNCTUATION_WEIGHT if category == "Fluency/Punctuation" else MINOR_WEIGHT
  return 0.0


def segment_score(rows: Iterable[Mapping[str, str]]) -> float:
  """Minus the summed error weights of one item's rows (0 = no error)."""
  return -sum(error_weight(r["category"], r["severity"]) for r in rows)


def read_avg_seg_scores(pair: str, data_dir: pathlib.Path | None = None
                        ) -> dict[tuple[str, int], float | None]:
  """The shipped `avg_seg_scores` file: (system, seg_id) -> score, None where the item was not
  rated; systems named as in the rating files (`ref-A` is `ref`)."""
  path = pathlib.Path(data_dir or DATA_DIR) / f"{_file_stem(pair)}.avg_seg_scores.tsv"
  out = {}
  with open(path, encoding="utf-8") as file:
    next(file)  # header
    for line in file:
      system, rest = line.rstrip("\n").split("\t")
      score, seg_id = rest.split(" ")
      system = AVG_FILE_SYSTEM_NAMES.get(system, system)
      out[(system, int(seg_id))] = None if score == "None" else float(score)
  return out


@dataclasses.dataclass(frozen=True)
class Items:
  """The scored MT outputs of one language pair, one entry per (system, segment)."""
  pair: str
  system: tuple[str, ...]
  seg_id: np.ndarray           # [N] int, the source segment (1..529)
  source: tuple[str, ...]
  hypothesis: tuple[str, ...]  # the system's plain translation
  reference: tuple[str, ...]   # system `ref`'s translation of the same segment
  mqm: np.ndarray              # [N] float64, minus the weighted error count

  @property
  def language(self) -> str:
    """The target language (what the metrics tokenise)."""
    return TARGET_LANGUAGE[self.pair]

  def __len__(self) -> int:
    return len(self.system)

  def take(self, indices: Sequence[int] | np.ndarray) -> "Items":
    indices = np.asarray(indices)
    pick = lambda values: tuple(values[i] for i in indices)
    return Items(self.pair, pick(self.system), self.seg_id[indices], pick(self.source),
                 pick(self.hypothesis), pick(self.reference), self.mqm[indices])


def item_scores(rows: Iterable[Mapping[str, str]]
                ) -> dict[tuple[str, int], tuple[float, str, str]]:
  """(system, seg_id) -> (MQM score, plain translation, source) over all rows of a file."""
  grouped: dict[tuple[str, int], list[Mapping[str, str]]] = {}
  for row in rows:
    grouped.setdefault((row["system"], int(row["seg_id"])), []).append(row)
  out = {}
  for key, item_rows in grouped.items():
    translations = {strip_span_marks(r["target"]) for r in item_rows}
    if len(translations) != 1:
      raise ValueError(f"item {key} has {len(translations)} different translations after "
                       "removing the span marks; expected one")
    out[key] = (segment_score(item_rows), translations.pop(), item_rows[0]["source"])
  return out


@functools.lru_cache(maxsize=None)
def load_pair(pair: str) -> Items:
  """Every MT output of `pair` except the references, with its reference and MQM score, sorted
  by (segment, system)."""
  scored = item_scores(read_error_rows(pair))
  references = {seg: text for (system, seg), (_, text, _) in scored.items()
                if system == REFERENCE_SYSTEM}
  keys = sorted((k for k in scored if k[0] not in REFERENCE_SYSTEMS), key=lambda k: (k[1], k[0]))
  missing = sorted({seg for _, seg in keys} - set(references))
  if missing:
    raise ValueError(f"{pair}: segments {missing[:5]} have no '{REFERENCE_SYSTEM}' translation")
  return Items(pair=pair,
               system=tuple(k[0] for k in keys),
               seg_id=np.asarray([k[1] for k in keys], np.int64),
               source=tuple(scored[k][2] for k in keys),
               hypothesis=tuple(scored[k][1] for k in keys),
               reference=tuple(references[k[1]] for k in keys),
               mqm=np.asarray([scored[k][0] for k in keys], np.float64))


def split_by_source(seg_ids: np.ndarray, seed: int, train_fraction: float = 0.5) -> np.ndarray:
  """A boolean train mask over items: a seeded `train_fraction` of the source segments (rounded)
  with all of their systems; the rest is the test half. No segment is on both sides."""
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
  segments = np.unique(np.asarray(seg_ids))
  if segments.size < 2:
    raise ValueError(f"a split needs >= 2 source segments, got {segments.size}")
  count = int(np.clip(round(train_fraction * segments.size), 1, segments.size - 1))
  chosen = np.random.default_rng(seed).permutation(segments)[:count]
  return np.isin(seg_ids, chosen)
