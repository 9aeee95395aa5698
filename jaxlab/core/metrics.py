"""Metrics: a JSONL writer (process 0 only), a progress bar, and the NaN/Inf guard.

`workdir/metrics.jsonl` holds one JSON object per logged step: `{"step": 100, "train/loss": ...}`.
`read_jsonl` loads it back for plots and notebooks.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from typing import Any, Iterator, Mapping

from absl import logging
import jax
import numpy as np
from tqdm import auto as tqdm_auto


class NonFiniteError(FloatingPointError):
  """A logged metric was NaN or Inf; the message names the step and the metric."""


def to_python(value: Any) -> Any:
  """Numpy/JAX scalars and arrays -> plain Python values that `json` can write."""
  if isinstance(value, Mapping):
    return {str(k): to_python(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_python(v) for v in value]
  if isinstance(value, (jax.Array, np.ndarray, np.generic)):
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array.tolist()
  return value


def check_finite(metrics: Mapping[str, Any], step: int) -> None:
  """Raises NonFiniteError if any scalar metric is NaN or Inf."""
  for name, value in metrics.items():
    array = np.asarray(value)
    if array.dtype.kind in "fc" and not np.all(np.isfinite(array)):
      raise NonFiniteError(
          f"non-finite {name} = {array.tolist()} at step {step}; the last checkpoint before this "
          "step is intact (lower the learning rate or check the inputs)")


class MetricWriter:
  """Appends JSON lines to `workdir/metrics.jsonl`; other processes only log."""

  def __init__(self, workdir: str | os.PathLike, filename: str = "metrics.jsonl"):
    self.path = os.path.join(os.fspath(workdir), filename)
    self._file = None
    if jax.process_index() == 0:
      os.makedirs(os.fspath(workdir), exist_ok=True)
      self._file = open(self.path, "a", encoding="utf-8")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    record = {"step": int(step), **to_python(dict(metrics))}
    if self._file is not None:
      self._file.write(json.dumps(record) + "\n")
      self._file.flush()
    logging.info("step %d: %s", step, _format(metrics))

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
  """An open temporary file beside `path`, renamed onto it when the block ends without error: a
  run killed mid-write leaves the old file or none, never half of one (resumable stages)."""
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp"
  try:
    with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
      yield f
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  os.replace(tmp, path)


def write_json(path: str | os.PathLike, payload: Mapping[str, Any]) -> None:
  """Writes a JSON file on process 0 (config.json, results.json, resumable stages) through
  `atomic_file`."""
  if jax.process_index() != 0:
    return
  with atomic_file(path) as f:
    json.dump(to_python(dict(payload)), f, indent=2, sort_keys=False, allow_nan=False)
    f.write("\n")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The records of a metrics.jsonl file (or of `workdir/metrics.jsonl` given a directory)."""
  path = os.fspath(path)
  if os.path.isdir(path):
    path = os.path.join(path, "metrics.jsonl")
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def series(records: list[dict[str, Any]], name: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of one metric from `read_jsonl` records."""
  pairs = [(r["step"], r[name]) for r in records if name in r]
  if not pairs:
    return np.zeros(0, int), np.zeros(0)
  steps, values = zip(*pairs)
  return np.asarray(steps), np.asarray(values, dtype=float)


class Progress:
  """A tqdm bar with the latest loss and steps/s; silent on processes other than 0.

  The bar shows when stderr is a terminal or in a notebook; otherwise (CI logs) it stays off and
  the MetricWriter's log lines carry the same information.
  """

  def __init__(self, total: int, initial: int = 0, desc: str = "train",
               enabled: bool = True, show_rate: bool = True):
    show = enabled and jax.process_index() == 0 and (
        sys.stderr.isatty() or "ipykernel" in sys.modules or
        os.environ.get("JAXLAB_PROGRESS") == "1")
    self._bar = tqdm_auto.tqdm(total=total, initial=initial, desc=desc, disable=not show,
                               dynamic_ncols=True, leave=True)
    # Without a bar (logs, CI), print a plain line per update on process 0 instead.
    self._plain = enabled and not show and jax.process_index() == 0
    self._desc, self._total, self._show_rate = desc, total, show_rate
    self._last_time = time.perf_counter()
    self._last_step = initial
    self.steps_per_sec = math.nan

  def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
    now = time.perf_counter()
    if step > self._last_step:
      self.steps_per_sec = (step - self._last_step) / max(now - self._last_time, 1e-9)
    self._bar.update(step - self._bar.n)
    postfix = {"steps/s": f"{self.steps_per_sec:.1f}"} if self._show_rate else {}
    if metrics:
      for name in ("train/loss", "loss"):
        if name in metrics:
          value = np.asarray(metrics[name], np.float64)
          # Per-replica records carry a list: the bar shows their mean.
          postfix["loss" if value.size == 1 else "mean loss"] = f"{value.mean():.3e}"
          break
    self._bar.set_postfix(postfix, refresh=False)
    if self._plain:
      print(f"{self._desc}: {step}/{self._total} " +
            " ".join(f"{k}={v}" for k, v in postfix.items()), file=sys.stderr, flush=True)
    self._last_time, self._last_step = now, step

  def close(self) -> None:
    self._bar.close()


def progress_iter(items: list[Any], desc: str, enabled: bool = True) -> Iterator[Any]:
  """A progress bar over a short list of sub-runs (variants, seeds, tasks)."""
  bar = Progress(total=len(items), desc=desc, enabled=enabled, show_rate=False)
  try:
    for i, item in enumerate(items):
      yield item
      bar.update(i + 1)
  finally:
    bar.close()


def _format(metrics: Mapping[str, Any]) -> str:
  parts = []
  for name, value in metrics.items():
    array = np.asarray(value)
    if array.dtype.kind in "biuf" and array.size == 1:
      parts.append(f"{name}={array.item():.4g}")
    elif array.size == 1:
      parts.append(f"{name}={str(array.item())[:40]}")
    else:
      parts.append(f"{name}=<{array.shape}>")
  return " ".join(parts)
