"""Timing helpers shared by the benchmark scripts (run by hand, never by the tests)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from jaxlab.core import config as config_lib
from jaxlab.core import host
from jaxlab.core import replicas as replicas_lib

RESULTS = pathlib.Path(__file__).resolve().parent / "RESULTS.md"
CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


BRIEF_HELP = ("a GPU smoke check: the same measurements and table shape on a cut workload "
              "(fewer timed steps and repeats, the smallest sizes), meant to finish in about "
              "30 s on an H200; implies --no-append, its numbers are not for publishing. A flag "
              "given explicitly wins over the value --brief would give it; the script's "
              "docstring says what it cuts.")


def add_brief_flag(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--brief", action="store_true", help=BRIEF_HELP)


def parse_args(parser: argparse.ArgumentParser, **brief_defaults) -> argparse.Namespace:
  """`parser.parse_args()` with `--brief` added; under `--brief` the flags named in
  `brief_defaults` default to those values instead (parsed twice, so a flag given explicitly
  still wins, wherever it stands on the command line)."""
  add_brief_flag(parser)
  args = parser.parse_args()
  if args.brief and brief_defaults:
    parser.set_defaults(**brief_defaults)
    args = parser.parse_args()
  return args


def writes_results(args: argparse.Namespace) -> bool:
  """Whether a run writes its tables into RESULTS.md: not under --no-append, nor under --brief
  (a smoke check's numbers are not results)."""
  return not (args.no_append or args.brief)


def cut(args: argparse.Namespace, full, to=2):
  """`full`, or `to` under --brief (by default 2 timed calls: a smoke check needs no stable median,
  and compiling, which `time_call`'s warm-up call does anyway, is what it checks)."""
  return to if args.brief else full


def brief_mark(args: argparse.Namespace) -> str:
  """Appended to a section's heading, so a brief run's printout is never mistaken for results."""
  return " [--brief smoke check, not results]" if args.brief else ""


def preset_command_line(slug: str, brief_preset: str = "smoke"
                        ) -> tuple[argparse.Namespace, ml_collections.ConfigDict]:
  """The command line of a benchmark that times one preset of configs/<slug>.py: `--preset`
  (default quick; `brief_preset` under --brief), `--no-append` and `--brief`; tunes the allocator
  and returns (args, config)."""
  parser = argparse.ArgumentParser()
  parser.add_argument("--preset", default="quick")
  parser.add_argument("--no-append", action="store_true")
  args = parse_args(parser, preset=brief_preset)
  host.tune_allocator()
  return args, config_lib.load_config(CONFIGS / f"{slug}.py", args.preset)


def time_call(fn, *args, repeats: int) -> float:
  """Median seconds per call after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2]


def seconds_per_update(update, state, batch, steps: int, windows: int = 1) -> float:
  """Steady-state seconds per call of a jitted `update(state, batch, key)` that
  donates its state: one warm-up call, then `steps` timed calls split into `windows` equal
  windows; the median window's rate (robust to a noisy shared machine)."""
  state, metrics = update(state, batch, jax.random.key(10_000))
  jax.block_until_ready(metrics)
  per_window = max(1, steps // windows)
  times = []
  for window in range(windows):
    start = time.perf_counter()
    for i in range(per_window):
      state, metrics = update(state, batch, jax.random.key(window * per_window + i))
    jax.block_until_ready(metrics)
    times.append((time.perf_counter() - start) / per_window)
  return sorted(times)[len(times) // 2]


def train_step_row(label: str, experiment, batch, rng, *, peak: float, repeats: int,
                   count_flops=None) -> str:
  """A `| label | steps/s | GFLOP/step | GFLOP/s | % of peak |` row for one jitted
  `experiment.update` on `batch`; `count_flops(fn, *args)` defaults to `xla_flops`."""
  state = experiment.init(rng)
  update = jax.jit(experiment.update)
  seconds = time_call(lambda: update(state, batch, rng)[1]["loss"], repeats=repeats)
  flops = (count_flops or xla_flops)(experiment.update, state, batch, rng)
  gflops = flops / seconds / 1e9
  return (f"| {label} | {1 / seconds:.1f} | {flops / 1e9:.3f} | {gflops:.1f} | "
          f"{100 * gflops / peak:.1f}% |\n")


def matmul_peak(dtype, size: int = 2048, repeats: int = 10) -> float:
  """GFLOP/s of a jitted size x size `jnp.dot`: the machine's practical peak."""
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  seconds = time_call(jax.jit(jnp.dot), a, a, repeats=repeats)
  return 2 * size**3 / seconds / 1e9


def xla_flops(fn, *args) -> float:
  """FLOPs of one call of `fn` as XLA's cost analysis counts them (a scan body counts once)."""
  return (jax.jit(fn).lower(*args).compile().cost_analysis() or {}).get("flops", float("nan"))


@contextlib.contextmanager
def unrolled_scans():
  """Every `jax.lax.scan` traced inside is fully unrolled, whatever `unroll` its caller passes
  (a `functools.partial` default would lose to the caller's own `unroll=` argument)."""
  original = jax.lax.scan

  def fully_unrolled(*args, **kwargs):
    kwargs["unroll"] = True
    return original(*args, **kwargs)

  jax.lax.scan = fully_unrolled
  try:
    yield
  finally:
    jax.lax.scan = original


def unrolled_flops(fn, *args) -> float:
  """`xla_flops` of `fn` traced afresh with every `jax.lax.scan` fully unrolled (XLA's cost
  analysis counts a rolled scan body once, whatever its length)."""
  with unrolled_scans():
    return xla_flops(lambda *a: fn(*a), *args)   # a new function: no cached (rolled) trace


@contextlib.contextmanager
def replicas_vmapped():
  """`core.replicas.map_replicas` traced inside is a vmap even on one CPU device, so that XLA's
  cost analysis counts every replica (a `lax.map` body, like a scan body, counts once)."""
  original = replicas_lib.runs_replicas_in_turn
  replicas_lib.runs_replicas_in_turn = lambda: False
  try:
    yield
  finally:
    replicas_lib.runs_replicas_in_turn = original


def all_replica_flops(fn, *args) -> float:
  """`xla_flops` of `fn` traced afresh with its replicas vmapped (see `replicas_vmapped`)."""
  with replicas_vmapped():
    return xla_flops(lambda *a: fn(*a), *args)


def perturbed(params, key, scale: float = 0.01):
  """`params` + scale N(0, 1) on every leaf (so no zero-initialised layer makes work trivial)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(tree, [p + scale * jax.random.normal(k, p.shape, p.dtype)
                                   for p, k in zip(leaves, keys)])


def machine() -> str:
  return (f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{jax.devices()[0].platform}, jax {jax.__version__}")


def block_markers(block: str) -> tuple[str, str]:
  """The comment lines that open and close block `block` in RESULTS.md (invisible when the
  markdown is rendered)."""
  if not block or block != block.strip() or "\n" in block or "--" in block:
    raise ValueError(f"a results block needs a one-line name without '--', got {block!r}")
  return f"<!-- benchmark: {block} -->", f"<!-- /benchmark: {block} -->"


def replace_block(results: str, block: str, section: str) -> str:
  """`results` (the text of RESULTS.md) with block `block` holding `section` instead of what it
  held, in the same place and with every byte outside it unchanged; a block not yet there is
  appended at the end. So RESULTS.md reads as one current table per method and kind, not a log."""
  start, end = block_markers(block)
  if "<!-- benchmark:" in section or "<!-- /benchmark:" in section:
    raise ValueError(f"the section for block {block!r} contains a block marker")
  body = section.strip("\n")
  new_block = f"{start}\n\n{body}\n\n{end}"
  # Whole lines only, so "precision_ls" never matches inside "precision_ls official".
  starts = [m.start() for m in re.finditer(f"^{re.escape(start)}$", results, re.MULTILINE)]
  ends = [m.end() for m in re.finditer(f"^{re.escape(end)}$", results, re.MULTILINE)]
  if not starts and not ends:
    before = results.rstrip("\n")
    return f"{before}\n\n{new_block}\n" if before else f"{new_block}\n"
  if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
    raise ValueError(f"RESULTS.md is malformed at block {block!r}: it has {len(starts)} "
                     f"{start!r} and {len(ends)} {end!r} lines, where one of each, in that "
                     "order, is needed; fix the file by hand")
  return results[:starts[0]] + new_block + results[ends[0]:]


def write_results(block: str, section: str, path: pathlib.Path = RESULTS) -> None:
  """Replaces block `block` of RESULTS.md (or `path`) by `section` (see `replace_block`)."""
  results = path.read_text(encoding="utf-8") if path.exists() else ""
  path.write_text(replace_block(results, block, section), encoding="utf-8")


def publish(lines: list[str], block: str, write: bool) -> None:
  """Prints a benchmark's markdown section and, if `write`, puts it in RESULTS.md as block
  `block` (replacing that block's previous run). A script's runs beside the official code go to
  their own block (e.g. "precision_ls official"), so each method keeps at most one table of
  ours alone and one side by side."""
  text = "".join(lines)
  print(text)
  if write:
    write_results(block, text)


def add_official_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--official", type=pathlib.Path, default=None,
                      help="a local checkout of the official repository: time its training "
                           "step beside ours, interleaved (nothing is downloaded)")
  parser.add_argument("--official-python", default=None,
                      help="the Python of an environment with the official code's "
                           "dependencies (default: this one)")
  parser.add_argument("--rounds", type=int, default=5,
                      help="side-by-side rounds: ours, official, ours, ... (at least 5)")
  parser.add_argument("--window", type=float, default=5.0,
                      help="seconds per timing window in side-by-side rounds")


class OfficialWorker:
  """A worker process that times the official code's step (the `*_official_worker.py`
  protocol: it prints {"ready": ...}, then answers `window SECONDS` with {"steps", "seconds"})."""

  def __init__(self, python: str, script: pathlib.Path, *args: str):
    self.process = subprocess.Popen([python, str(script), *args], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
    self.info = self._read()
    self.last_window: dict = {}   # the latest window's reply (with any details it carries)

  def _read(self) -> dict:
    line = self.process.stdout.readline()
    if not line:
      raise RuntimeError(f"the official worker exited ({self.process.wait()}); see its stderr")
    return json.loads(line)

  def steps_per_second(self, seconds: float) -> float:
    self.process.stdin.write(f"window {seconds}\n")
    self.process.stdin.flush()
    result = self.last_window = self._read()
    return result["steps"] / result["seconds"]

  def close(self) -> None:
    if self.process.poll() is None:
      self.process.stdin.write("quit\n")
      self.process.stdin.flush()
      self.process.wait(timeout=60)


def steps_per_second_for(step: Callable[[], object], seconds: float) -> float:
  """Whole calls of `step()` (each blocked on) for at least `seconds`: calls per second."""
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    jax.block_until_ready(step())
    count += 1
  return count / (time.perf_counter() - start)


@dataclasses.dataclass
class SideBySide:
  ours: list[float]         # steps/s per round
  official: list[float]
  loads: list[float]        # 1-minute load average before each window

  @property
  def ratio(self) -> float:
    """The median over rounds of ours / official (each round's two windows are adjacent)."""
    return statistics.median(o / f for o, f in zip(self.ours, self.official))

  @property
  def load_range(self) -> str:
    return f"{min(self.loads):.1f}-{max(self.loads):.1f}"

  def seconds_row(self, label: str, steps: float, digits: tuple[int, int] = (1, 1)) -> str:
    """A table row: label, our and the official median seconds per `steps` steps (with
    `digits` decimals), the ratio, the loads; printed as it is made (a long run shows progress)."""
    ours = steps / statistics.median(self.ours)
    official = steps / statistics.median(self.official)
    row = (f"| {label} | {ours:.{digits[0]}f} | {official:.{digits[1]}f} | {self.ratio:.1f}x | "
           f"{self.load_range} |\n")
    print(row, end="", flush=True)
    return row

  def row_cells(self) -> str:
    return (f"{statistics.median(self.ours):.2f} | {statistics.median(self.official):.2f} | "
            f"{self.ratio:.2f}x | {min(self.loads):.1f}-{max(self.loads):.1f}")


SIDE_BY_SIDE_COLUMNS = ("jaxlab steps/s (median) | official steps/s (median) | "
                        "ours / official (median of rounds) | load before windows")


def side_by_side(ours: Callable[[float], float], official: Callable[[float], float], *,
                 rounds: int, window: float) -> SideBySide:
  """Alternates windows of `ours(seconds)` and `official(seconds)` (each returns steps/s)."""
  if rounds < 5:
    raise ValueError(f"side-by-side timing needs at least 5 rounds, got {rounds}")
  result = SideBySide([], [], [])
  for _ in range(rounds):
    for timer, out in ((ours, result.ours), (official, result.official)):
      result.loads.append(os.getloadavg()[0])
      out.append(timer(window))
  return result


def beside_official(args: argparse.Namespace, worker_script: pathlib.Path,
                    worker_args: Sequence[str], make_ours: Callable[[], Callable[[float], float]]
                    ) -> tuple[SideBySide, dict]:
  """Starts the official worker (`--official`, `--official-python`, then `worker_args`), builds
  our timer (`make_ours()`: seconds -> steps/s, compiled before the first window), alternates
  their windows for `--rounds` rounds and stops the worker. Returns (result, the worker's info,
  with its last window's reply under "last_window")."""
  worker = OfficialWorker(args.official_python or sys.executable, worker_script,
                          f"--official={args.official}", *worker_args)
  try:
    ours = make_ours()
    result = side_by_side(ours, worker.steps_per_second, rounds=args.rounds, window=args.window)
    return result, {**worker.info, "last_window": worker.last_window}
  finally:
    worker.close()


def versions(extra: Sequence[str] = ()) -> str:
  return ", ".join([f"jax {jax.__version__}", *extra])
