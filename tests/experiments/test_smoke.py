"""Every experiment runs its smoke preset, checkpoints, and resumes where it stopped."""
import importlib
import json
import pathlib

import numpy as np
import pytest

from jaxlab.core import checkpoint
from jaxlab.core import config as config_lib
from jaxlab.core import metrics
from jaxlab.core import train_loop

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLUGS = sorted(p.stem for p in (ROOT / "configs").glob("[!_]*.py"))


def checkpoint_dirs(workdir: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in workdir.rglob("checkpoints") if p.is_dir())


def run_main(slug: str, config, workdir: pathlib.Path):
  module = importlib.import_module(f"experiments.{slug}")
  with train_loop.precision_scope(config):
    module.main(config, str(workdir))


def test_every_method_has_config_experiment_and_notebook():
  assert SLUGS, "no configs found"
  for slug in SLUGS:
    assert (ROOT / "experiments" / f"{slug}.py").exists()
    assert (ROOT / "notebooks" / f"{slug}.ipynb").exists()
    assert (ROOT / "jaxlab" / "methods" / slug / "README.md").exists()


@pytest.mark.parametrize("slug", SLUGS)
def test_smoke_train_checkpoint_resume(slug, tmp_path):
  config = config_lib.load_config(ROOT / "configs" / f"{slug}.py", "smoke")
  steps = config.train.steps
  run_main(slug, config, tmp_path)

  payload = json.loads((tmp_path / "results.json").read_text())
  assert payload["slug"] == slug and payload["preset"] == "smoke"
  assert payload["metrics"] and isinstance(payload["claims"], list)
  dirs = checkpoint_dirs(tmp_path)
  assert dirs, "the smoke run saved no checkpoint"
  for directory in dirs:
    assert checkpoint.latest_step(directory) == steps
    losses = [r["train/loss"] for r in metrics.read_jsonl(directory.parent)
              if "train/loss" in r]
    assert losses and np.all(np.isfinite(losses))

  longer = config_lib.override(config, {"train.steps": steps + 1})
  run_main(slug, longer, tmp_path)
  for directory in dirs:
    assert checkpoint.latest_step(directory) == steps + 1
    logged = [r["step"] for r in metrics.read_jsonl(directory.parent) if "train/loss" in r]
    assert logged == sorted(set(logged)) and logged[-1] == steps + 1, (
        f"{directory.parent.name} retrained instead of resuming: {logged}")
