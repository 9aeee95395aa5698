"""Runs one experiment as N JAX processes on localhost: a simulated pod (or multi-node GPU job).

Each process gets `devices_per_process` CPU devices and the same workdir; they meet at a
coordinator on a free local port. `launch` waits for all of them with a timeout and kills the
whole group (SIGKILL on each process group) when one fails or time runs out.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Process:
  process_id: int
  returncode: int | None
  output: str
  elapsed: float = 0.0


def _environment(devices: int) -> dict[str, str]:
  # As the root conftest does in-process: fewer XLA optimisations and the tests' compile cache.
  env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), JAX_PLATFORMS="cpu",
             PYTHONUNBUFFERED="1", JAX_DISABLE_MOST_OPTIMIZATIONS="1",
             JAX_COMPILATION_CACHE_DIR=str(pathlib.Path.home() / ".cache" / "jaxlab-jax-tests"))
  env.pop("JAXLAB_DISTRIBUTED", None)
  return env


def command(slug: str, config_arg: str, workdir: pathlib.Path, *extra: str) -> list[str]:
  return [sys.executable, "-m", f"experiments.{slug}",
          f"--config=configs/{slug}.py:{config_arg}", f"--workdir={workdir}", *extra]


def launch(slug: str, config_arg: str, workdir: pathlib.Path, *, num_processes: int = 2,
           devices_per_process: int = 4, timeout: float = 180, extra: tuple[str, ...] = (),
           kill: tuple[int, float] | None = None,
           heartbeat_timeout_seconds: int | None = None,
           env: dict[str, str] | None = None,
           kill_all_when: Callable[[], bool] | None = None) -> list[Process]:
  """Starts the processes, waits for all of them (at most `timeout` s) and returns each
  process's exit status and output. `kill=(i, s)` SIGKILLs process i after s seconds (a host
  that dies); the others must then fail by themselves. `kill_all_when()` becoming true SIGKILLs
  every process (a pod preempted mid-run). Every process still running at the end is killed."""
  port = free_port()
  distributed = ["--distributed", f"--coordinator_address=127.0.0.1:{port}",
                 f"--num_processes={num_processes}"]
  if heartbeat_timeout_seconds is not None:
    distributed.append(f"--heartbeat_timeout_seconds={heartbeat_timeout_seconds}")
  logs = [workdir.parent / f"{workdir.name}.process{i}.log" for i in range(num_processes)]
  procs = []
  for i, log in enumerate(logs):
    log.parent.mkdir(parents=True, exist_ok=True)
    procs.append(subprocess.Popen(
        command(slug, config_arg, workdir, *distributed, f"--process_id={i}", *extra),
        cwd=ROOT, env={**_environment(devices_per_process), **(env or {})},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT, start_new_session=True))
  start = time.monotonic()
  deadline = start + timeout
  try:
    while time.monotonic() < deadline:
      if kill is not None and time.monotonic() - start > kill[1] and (
          procs[kill[0]].poll() is None):
        os.killpg(procs[kill[0]].pid, signal.SIGKILL)
      if kill_all_when is not None and kill_all_when():
        break
      codes = [p.poll() for p in procs]
      if all(c is not None for c in codes):
        break
      if any(c not in (None, 0) for c in codes) and kill is None:
        # One failed: give the others a moment to notice, then stop waiting.
        _wait_all(procs, min(30.0, max(0.0, deadline - time.monotonic())))
        break
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
  return [Process(i, p.returncode, log.read_text(), elapsed=time.monotonic() - start)
          for i, (p, log) in enumerate(zip(procs, logs))]


def _wait_all(procs: list[subprocess.Popen], seconds: float) -> None:
  end = time.monotonic() + seconds
  while time.monotonic() < end and any(p.poll() is None for p in procs):
    time.sleep(0.2)


def run_single(slug: str, config_arg: str, workdir: pathlib.Path, *, devices: int = 8,
               timeout: float = 180, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
  """The same experiment as one process with `devices` CPU devices (the reference)."""
  return subprocess.run(command(slug, config_arg, workdir, *extra), cwd=ROOT,
                        env=_environment(devices), capture_output=True, text=True,
                        timeout=timeout)
