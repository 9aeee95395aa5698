"""The absl entry point every experiment shares.

  python -m experiments.<slug> --config=configs/<slug>.py:quick [--workdir=...] \
      [--config.train.steps=100] [--distributed] [--cpu_devices=2]

`experiments/<slug>.py` defines `main(config, workdir)` and ends with `cli.run(main)`. This module
parses the flags, starts multi-host JAX when asked (before any other JAX call), validates the config
against the devices, enables float64 if the config asks, and calls `main`.

A bad config (unknown preset or key, wrong type, a batch that does not divide over the devices)
prints one line, `config error: ...`, and exits with status 2 before anything compiles.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, NoReturn, Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from jaxlab.core import config as config_lib
from jaxlab.core import host
from jaxlab.core import parallel

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file and preset, e.g. configs/precision_ls.py:quick",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output directory (checkpoints, metrics.jsonl, results.json). A run "
    "restarted with the same workdir resumes. Default: workdirs/<slug>-<preset>.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Call jax.distributed.initialize() first (multi-host TPU/GPU pods; "
    "also enabled by JAXLAB_DISTRIBUTED=1). Without the three flags below JAX detects the "
    "cluster (TPU pods, Slurm, Kubernetes).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "With --distributed: host:port of process 0's coordinator.")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "With --distributed: how many processes take part.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "With --distributed: this process's id.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", None, "With --distributed: how long the others wait for a "
    "process that stopped answering before they fail (JAX's default: 100 s).")
_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices", None, "Run the CPU backend as this many devices (e.g. one per core): the "
    "data-parallel step then runs one batch shard per device, which is faster for small models "
    "than one device whose every op splits over the cores. Default: JAX's (one device).")
_COMPILATION_CACHE = flags.DEFINE_bool(
    "compilation_cache", True, "Keep compiled programs in <workdir>/xla_cache and reuse them "
    "(within the run: models of one architecture compile once; and when the run is resumed).")

ExperimentMain = Callable[[ml_collections.ConfigDict, str], Any]


def preset_changes(config_file: str, override_keys: Sequence[str]) -> list[str]:
  """What makes a run differ from its preset, so that it must not replace results/: each
  `--config.<key>` override and each `key=value` after the preset in `file.py:<preset>,...`
  (`:quick,steps=100` changes the preset as `--config.train.steps=100` does)."""
  return ([f"--config.{key}" for key in sorted(override_keys)]
          + [f"config argument {key}=" for key in config_lib.argument_keys(config_file)])


def default_workdir(config_path: str, preset: str) -> str:
  slug = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  return os.path.join("workdirs", f"{slug}-{preset}")


CONFIG_ERROR_STATUS = 2


def exit_with_config_error(error: BaseException | str) -> NoReturn:
  """Prints `config error: <one line>` to stderr and exits with status 2 (no traceback)."""
  message = " ".join(str(error).split())
  print(f"config error: {message}", file=sys.stderr)
  sys.exit(CONFIG_ERROR_STATUS)


def _config_arguments(argv: Sequence[str]) -> tuple[str | None, list[str]]:
  """The `--config` value and the keys named by `--config.<key>` overrides in `argv`."""
  spec, keys = None, []
  for i, arg in enumerate(argv[1:], start=1):
    if arg == "--":
      break
    name, has_value, value = arg.partition("=")
    if name in ("--config", "-config"):
      spec = value if has_value else (argv[i + 1] if i + 1 < len(argv) else None)
    for prefix in ("--config.", "-config.", "--noconfig.", "-noconfig."):
      if name.startswith(prefix):
        keys.append(name[len(prefix):])
  return spec, keys


def _check_config_arguments(argv: Sequence[str]) -> None:
  """Loads the config file and checks that every override names a key, with our own messages
  (absl's would be a traceback ending in ml_collections' AttributeError)."""
  spec, keys = _config_arguments(argv)
  if not spec:
    return
  path, _, arg = spec.partition(":")
  config = config_lib.load_config(path, arg or None)
  for key in keys:
    config_lib.get(config, key)


_FLAG_VALUE_ERROR = re.compile(r"flag --config\.(?P<key>[^=\s]+)=(?P<value>.*?): (?P<why>.*)",
                               re.DOTALL)


def _one_line_flag_error(error: BaseException) -> str:
  match = _FLAG_VALUE_ERROR.match(str(error))
  if match:
    return (f"config key {match['key']!r} cannot take {match['value']!r}: "
            f"{match['why'].strip()}")
  return str(error)


def _config_error_in(error: BaseException) -> config_lib.ConfigError | None:
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, config_lib.ConfigError):
      return error
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with config mistakes reported in one line (status 2)."""
  try:
    _check_config_arguments(argv)
    return flags.FLAGS(argv)
  except config_lib.ConfigError as e:
    exit_with_config_error(e)
  except flags.Error as e:
    cause = _config_error_in(e)
    if cause is not None or "--config" in str(e):
      exit_with_config_error(cause if cause is not None else _one_line_flag_error(e))
    print(f"flag error: {' '.join(str(e).split())}", file=sys.stderr)
    sys.exit(CONFIG_ERROR_STATUS)


# Exit status of an experiment that cannot run on several processes and was started on a pod.
SINGLE_PROCESS_STATUS = 3


def run(experiment_main: ExperimentMain, *, single_process: str | None = None) -> None:
  """Parses flags and runs `experiment_main(config, workdir)`.

  `single_process`: why this experiment must run in one process (e.g. a benchmark harness
  that times every item on one machine); started on several processes it then exits at once
  with that reason instead of running.
  """

  def _main(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
      # Library INFO logs (orbax, tfds) drown the progress bars; -v 0 brings them back.
      logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    explicit = dict(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
                    process_id=_PROCESS_ID.value, heartbeat_timeout_seconds=_HEARTBEAT.value)
    enabled = _DISTRIBUTED.value or None
    if any(v is not None for v in explicit.values()) and not (
        enabled or os.environ.get("JAXLAB_DISTRIBUTED") == "1"):
      raise app.UsageError("--coordinator_address, --num_processes, --process_id and "
                           "--heartbeat_timeout_seconds need --distributed")
    if _CPU_DEVICES.value is not None:
      try:
        host.use_cpu_devices(_CPU_DEVICES.value)
      except ValueError as e:
        raise app.UsageError(f"--cpu_devices: {e}") from e
    parallel.maybe_init_distributed(enabled, **explicit)
    import jax  # pylint: disable=g-import-not-at-top
    if single_process and jax.process_count() > 1:
      print(f"error: this experiment runs in one process only ({single_process}); it was started "
            f"on {jax.process_count()} processes: run it without --distributed",
            file=sys.stderr)
      sys.exit(SINGLE_PROCESS_STATUS)
    host.tune_allocator()
    config = _CONFIG.value
    if config is None:
      raise app.UsageError("--config is required, e.g. --config=configs/<slug>.py:quick")
    try:
      config_lib.validate(config, device_count=jax.device_count())
    except config_lib.ConfigError as e:
      exit_with_config_error(e)
    config_file = config_flags.get_config_filename(flags.FLAGS["config"])
    overridden = preset_changes(config_file,
                                config_flags.get_override_values(flags.FLAGS["config"]))
    if overridden:
      from jaxlab.core import results  # pylint: disable=g-import-not-at-top
      results.block_publishing(overridden)
      print(f"note: {overridden[0]}" + (f" and {len(overridden) - 1} more overrides change"
            if len(overridden) > 1 else " changes") + " the preset, so results/ is left as it "
            "is; this run's results.json stays in the workdir", file=sys.stderr)
    workdir = _WORKDIR.value or default_workdir(config_file, config.preset)
    if _COMPILATION_CACHE.value:
      host.enable_compilation_cache(os.path.join(workdir, "xla_cache"))
    logging.info("workdir %s; %s; %d process(es)", workdir, parallel.describe_devices(),
                 jax.process_count())
    from jaxlab.core import train_loop  # pylint: disable=g-import-not-at-top
    try:
      with train_loop.precision_scope(config):
        experiment_main(config, workdir)
    except config_lib.ConfigError as e:   # a method's own check (a variant name, a choice)
      exit_with_config_error(e)

  app.run(_main, flags_parser=parse_flags)
