"""A character corpus that every CPython ships: the Python Language Reference topics.

`pydoc_data.topics.topics` holds the text `help()` shows for each language topic (~465k
characters, ~100 distinct on CPython 3.11). It needs no download and no dependency, but it
changes between Python releases, so `describe()` records the interpreter, the length and a
sha256 next to any result trained on it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import sys

import numpy as np


def corpus_text() -> str:
  """The topics' values concatenated in sorted-key order."""
  from pydoc_data.topics import topics   # imported late: ~0.5 MB of text
  return "".join(topics[key] for key in sorted(topics))


def describe(text: str) -> dict[str, object]:
  return {"python": sys.version.split()[0], "chars": len(text),
          "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


@dataclasses.dataclass(frozen=True)
class CharCorpus:
  """The corpus as character ids: the first `train_fraction` for training, the rest validation."""
  vocabulary: str
  train: np.ndarray
  validation: np.ndarray
  info: dict

  @property
  def vocab_size(self) -> int:
    return len(self.vocabulary)

  def decode(self, ids: np.ndarray) -> str:
    return "".join(self.vocabulary[i] for i in np.asarray(ids).ravel())


def char_corpus(train_fraction: float = 0.9) -> CharCorpus:
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
  text = corpus_text()
  vocabulary = "".join(sorted(set(text)))
  lookup = {c: i for i, c in enumerate(vocabulary)}
  ids = np.fromiter((lookup[c] for c in text), dtype=np.int32, count=len(text))
  split = int(round(train_fraction * len(ids)))
  return CharCorpus(vocabulary, ids[:split], ids[split:], describe(text))


def windows(ids: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
  """[len(starts), length + 1] windows (inputs and their next-character targets)."""
  starts = np.asarray(starts)
  if starts.size and (starts.min() < 0 or starts.max() + length + 1 > len(ids)):
    raise ValueError(f"a window of {length + 1} from the given starts leaves the "
                     f"{len(ids)} characters")
  return ids[starts[:, None] + np.arange(length + 1)[None, :]]


def evenly_spaced_windows(ids: np.ndarray, count: int, length: int) -> np.ndarray:
  """`count` non-overlapping windows spread evenly over `ids` (a fixed evaluation set)."""
  span = len(ids) - (length + 1)
  if count < 1 or count * (length + 1) > len(ids):
    raise ValueError(f"{count} windows of {length + 1} characters do not fit in {len(ids)}")
  return windows(ids, np.linspace(0, span, count).astype(np.int64), length)


def random_windows(ids: np.ndarray, count: int, length: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return windows(ids, rng.integers(0, len(ids) - length, size=count), length)
