"""Host-process settings that make CPU training steps fast.

XLA:CPU allocates a few megabytes of temporaries per step. glibc serves blocks above its mmap
threshold with fresh mmap/munmap calls, so every step pays page faults: measured on a 2-core
machine, a precision_ls step at batch 256 spent a third of its time in the kernel and ran at half
speed. Keeping such blocks on the heap (and not trimming it) removes that cost.

An experiment that trains several models of one architecture (seeds, tasks, ablation arms)
compiles the same step program once per model: a persistent compilation cache lets the later ones
load the first one's executable instead (`enable_compilation_cache`).

XLA:CPU runs a step as one device whose ops each split over every core. A small model's ops are
too small for that split to pay: measured on a 2-core machine, the precision_ls softmax step
(microbatched) ran 1.2-1.4x faster as two CPU devices, one shard of the data-parallel batch each,
than as one device using both cores (`use_cpu_devices`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024   # glibc's upper bound on 64-bit


def tune_allocator() -> bool:
  """Raises glibc's mmap and trim thresholds for this process; False where there is no glibc."""
  if not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  return all((
      mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1,
      mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1,
      mallopt(_M_TOP_PAD, 64 << 20) == 1,
  ))


# Compiles shorter than this are not worth a disk entry.
_MIN_CACHED_COMPILE_S = 1.0


def enable_compilation_cache(directory: str | os.PathLike) -> None:
  """Keeps compiled XLA executables under `directory` and reuses them for identical programs.

  Programs are keyed by their HLO, compile options and backend, so a changed model or config can
  never load a stale executable; the directory can be deleted at any time.
  """
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", os.fspath(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_CACHED_COMPILE_S)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def use_cpu_devices(count: int) -> None:
  """Makes the CPU backend `count` devices, so a data-parallel step runs one batch shard per
  device (e.g. one per core). Call it before JAX first uses a backend (JAX refuses it later)."""
  import jax  # pylint: disable=g-import-not-at-top
  if not isinstance(count, int) or count < 1:
    raise ValueError(f"the number of CPU devices must be a positive integer, got {count!r}")
  if jax.config.jax_num_cpu_devices != count:
    jax.config.update("jax_num_cpu_devices", count)
