"""The worker side of side-by-side timing: what `*_official_worker.py` scripts run.

Imports nothing beyond the standard library, so it runs under the official code's own Python
(without jaxlab or JAX). The parent (`common.OfficialWorker`) reads one JSON object per line:
{"ready": ..., **info} once, then {"steps": n, "seconds": t} for each stdin line
`window SECONDS` (whole calls of `step()` lasting at least SECONDS, or, with `serve_measured`,
one run of the official loop sized to last about SECONDS, timed by the official code itself);
`quit` ends it.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Callable, TextIO


def take_stdout() -> TextIO:
  """The protocol's stream; afterwards `print` (the official code's too) goes to stderr."""
  protocol, sys.stdout = sys.stdout, sys.stderr
  return protocol


def serve(step: Callable[[], object], protocol: TextIO, *,
          details: Callable[[], dict] | None = None, **info) -> None:
  """`details()`, if given, is merged into each window's reply (what the last call found)."""
  print(json.dumps({"ready": True, **info}), file=protocol, flush=True)
  for line in sys.stdin:
    command = line.split()
    if not command or command[0] == "quit":
      break
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < float(command[1]):
      step()
      calls += 1
    reply = {"steps": calls, "seconds": time.perf_counter() - start}
    print(json.dumps({**(details() if details else {}), **reply}), file=protocol, flush=True)


def serve_measured(measure: Callable[[float], tuple[int, float]], protocol: TextIO,
                   **info) -> None:
  """As `serve`, for official code that times its own loop: `measure(seconds)` runs it for about
  `seconds` and returns (steps run, seconds the official timer measured)."""
  print(json.dumps({"ready": True, **info}), file=protocol, flush=True)
  for line in sys.stdin:
    command = line.split()
    if not command or command[0] == "quit":
      break
    steps, seconds = measure(float(command[1]))
    print(json.dumps({"steps": steps, "seconds": seconds}), file=protocol, flush=True)
