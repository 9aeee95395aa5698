"""The grain pipeline every method reuses, and helpers to build and read TFDS datasets.

    indices = range(N) -> shuffle(seed) -> repeat -> batch -> this process's block of rows
    batch   = collate(source[indices]) -> map(transform)

Shuffling and batching act on indices, and each batch is read from the source in one call: a
per-record pipeline costs ~0.2 ms a record through TFDS's decoder, which would starve a CPU
training step. The iterator is grain's, so its position checkpoints as a small JSON state.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

import grain
import numpy as np
import tensorflow_datasets as tfds

Batch = dict[str, np.ndarray]
DATA_DIR_ENV = "JAXLAB_DATA_DIR"
# A test hook: where set, every batch's example indices are appended to
# `$JAXLAB_RECORD_EXAMPLES/process<i>.txt` as `<source length> <index> ...` (one line a batch),
# so a multi-process test can check that the processes read disjoint slices.
RECORD_EXAMPLES_ENV = "JAXLAB_RECORD_EXAMPLES"


def default_data_dir() -> str:
  """`$JAXLAB_DATA_DIR`, else `~/.cache/jaxlab/tensorflow_datasets` (generated data only)."""
  return os.environ.get(DATA_DIR_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "jaxlab", "tensorflow_datasets")


@contextlib.contextmanager
def _file_lock(path: pathlib.Path):
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def build(builder_cls: type[tfds.core.GeneratorBasedBuilder], config: tfds.core.BuilderConfig,
          data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """The prepared (generated once, cached under `data_dir`) array_record builder of a config."""
  # TFDS refuses a config object that shares its name with a built-in one; pass the name then.
  builtin = {c.name: c for c in (builder_cls.BUILDER_CONFIGS or [])}
  chosen = config.name if builtin.get(config.name) == config else config
  return prepare(builder_cls(config=chosen, data_dir=data_dir or default_data_dir(),
                             file_format="array_record"))


def prepare(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  """Generates the dataset once (under a file lock, so parallel workers don't race)."""
  lock = pathlib.Path(builder.data_dir).parents[1] / f".{builder.builder_config.name}.lock"
  with _file_lock(lock):
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(verify_ssl=True))
  return builder


class InMemorySource:
  """A random-access source held as stacked numpy arrays (one read of the whole split)."""

  def __init__(self, columns: Mapping[str, np.ndarray]):
    lengths = {len(v) for v in columns.values()}
    if len(lengths) != 1:
      raise ValueError(f"columns have different lengths: {lengths}")
    self.columns = dict(columns)
    self._length = lengths.pop()

  @classmethod
  def from_source(cls, source: Any, chunk: int = 4096) -> "InMemorySource":
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(source), chunk):
      records = source.__getitems__(list(range(start, min(start + chunk, len(source)))))
      for name, value in collate(records).items():
        parts.setdefault(name, []).append(value)
    return cls({name: np.concatenate(values) for name, values in parts.items()})

  def __len__(self) -> int:
    return self._length

  def __getitems__(self, indices: Sequence[int]) -> Batch:
    index = np.asarray(indices)
    return {name: column[index] for name, column in self.columns.items()}


class IndexSource:
  """A virtual source of `length` examples whose only field is their index.

  For data generated inside the jitted step from each example's index (a fresh problem per
  index): the pipeline still shards, orders, checkpoints and records examples, at no I/O cost.
  """

  def __init__(self, length: int):
    self._length = int(length)

  def __len__(self) -> int:
    return self._length

  def __getitems__(self, indices: Sequence[int]) -> Batch:
    return {"example": np.asarray(indices, np.int64)}


def collate(records: Sequence[Mapping[str, Any]] | Batch) -> Batch:
  """A list of records -> a dict of stacked arrays (already-stacked dicts pass through)."""
  if isinstance(records, Mapping):
    return dict(records)
  return {name: np.stack([np.asarray(r[name]) for r in records]) for name in records[0]}


def data_source(builder: tfds.core.DatasetBuilder, split: str, *,
                in_memory: bool = True) -> Any:
  """The split of a prepared builder as a random-access source (no TensorFlow involved)."""
  source = builder.as_data_source(split=split)
  return InMemorySource.from_source(source) if in_memory else source


def _example_recorder(source_length: int,
                      process_index: int) -> Callable[[np.ndarray], None] | None:
  directory = os.environ.get(RECORD_EXAMPLES_ENV)
  if not directory:
    return None
  path = pathlib.Path(directory) / f"process{process_index}.txt"
  path.parent.mkdir(parents=True, exist_ok=True)
  def record(index: np.ndarray) -> None:
    with open(path, "a", encoding="utf-8") as f:
      f.write(" ".join(map(str, [source_length, *np.asarray(index).tolist()])) + "\n")
  return record


def grain_pipeline(source: Any, *, batch_size: int, seed: int, process_index: int = 0,
                   process_count: int = 1, shuffle: bool = True, num_epochs: int | None = None,
                   transform: Callable[[Batch], Batch] | None = None,
                   drop_remainder: bool = True) -> grain.DatasetIterator:
  """A checkpointable iterator of host-local batches of `batch_size // process_count` examples.

  `num_epochs=None` repeats forever (training); evaluation passes `num_epochs=1`,
  `shuffle=False`. Each epoch is reshuffled from `seed`.

  Process p reads the p-th contiguous block of rows of each global batch, so the global batch
  that `parallel.shard_batch` assembles from the processes' blocks (in process order) is the
  one-process batch, row for row: per-row randomness keyed by position (noise, dropout) is then
  the same on any number of hosts. Only indices are batched globally; each process reads its
  own rows. (A last partial batch, `drop_remainder=False`, must split evenly on a pod.)
  """
  if batch_size % process_count:
    raise ValueError(f"batch size {batch_size} is not divisible by {process_count} processes")
  indices = grain.MapDataset.range(len(source))
  if shuffle:
    indices = indices.shuffle(seed=seed)
  batches = indices.repeat(num_epochs).batch(batch_size, drop_remainder=drop_remainder)
  if process_count > 1:
    local = batch_size // process_count
    first = process_index * local
    batches = batches.map(lambda rows: rows[first:first + local])
  record = _example_recorder(len(source), process_index)
  def read(index: np.ndarray) -> Batch:
    if record is not None:
      record(index)
    return collate(source.__getitems__(index.tolist()))
  batches = batches.map(read)
  if transform is not None:
    batches = batches.map(transform)
  # One reader thread and a short queue: batches are cheap index lookups, and grain's defaults
  # (16 threads, 500 elements) would compete with XLA for a laptop's few cores.
  return iter(batches.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))
