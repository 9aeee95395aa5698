"""The absl entry point every experiment shares.

  python -m experiments.<slug> --config=configs/<slug>.py:quick [--workdir=...] \
      [--config.train.steps=100] [--distributed]

`experiments/<slug>.py` defines `main(config, workdir)` and ends with `cli.run(main)`. This module
parses the flags, starts multi-host JAX when asked (before any other JAX call), validates the config
against the devices, enables float64 if the config asks, and calls `main`.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

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
    "also enabled by JAXLAB_DISTRIBUTED=1).")

ExperimentMain = Callable[[ml_collections.ConfigDict, str], Any]


def default_workdir(config_path: str, preset: str) -> str:
  slug = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  return os.path.join("workdirs", f"{slug}-{preset}")


def run(experiment_main: ExperimentMain) -> None:
  """Parses flags and runs `experiment_main(config, workdir)`."""

  def _main(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
      # Library INFO logs (orbax, tfds) drown the progress bars; -v 0 brings them back.
      logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    parallel.maybe_init_distributed(_DISTRIBUTED.value or None)
    host.tune_allocator()
    config = _CONFIG.value
    if config is None:
      raise app.UsageError("--config is required, e.g. --config=configs/<slug>.py:quick")
    import jax  # pylint: disable=g-import-not-at-top
    try:
      config_lib.validate(config, device_count=jax.device_count())
    except config_lib.ConfigError as e:
      logging.error("%s", e)
      sys.exit(f"config error: {e}")
    workdir = _WORKDIR.value or default_workdir(config_flags.get_config_filename(
        flags.FLAGS["config"]), config.preset)
    logging.info("workdir %s; %s; %d process(es)", workdir, parallel.describe_devices(),
                 jax.process_count())
    from jaxlab.core import train_loop  # pylint: disable=g-import-not-at-top
    with train_loop.precision_scope(config):
      experiment_main(config, workdir)

  app.run(_main)
