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
# Experiments that train nothing (a benchmark harness) keep no orbax checkpoint: they resume unit
# by unit (`train.steps` units), logging each finished unit to a metrics.jsonl under this name.
EVALUATION_ONLY = {"enamel": "eval/efficiency", "metametrics": "eval/tau_test_gp"}
# Experiments that finish in about a minute keep nothing to resume from; semantix keeps no orbax
# checkpoint: its prior resumes from the prior cache (outside the workdir), its tuning and each
# method's outputs from stage files (tested in tests/methods/semantix).
# btbs_lns resumes by stage: labels, policies and every finished run are files in the workdir.
NOTHING_TO_RESUME = {"pico", "semantix", "btbs_lns"}


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


def run_smoke(slug, workdir):
  """Runs the smoke preset into `workdir`; checks results.json and the final checkpoints."""
  config = config_lib.load_config(ROOT / "configs" / f"{slug}.py", "smoke")
  steps = config.train.steps
  run_main(slug, config, workdir)
  payload = json.loads((workdir / "results.json").read_text())
  assert payload["slug"] == slug and payload["preset"] == "smoke"
  assert payload["metrics"] and isinstance(payload["claims"], list)
  if slug in EVALUATION_ONLY or slug in NOTHING_TO_RESUME:
    return config
  dirs = checkpoint_dirs(workdir)
  assert dirs, "the smoke run saved no checkpoint"
  for directory in dirs:
    assert checkpoint.latest_step(directory) == steps
    losses = [r["train/loss"] for r in metrics.read_jsonl(directory.parent)
              if "train/loss" in r]
    assert losses and np.all(np.isfinite(losses))
  return config


@pytest.mark.parametrize("slug", SLUGS)
def test_smoke_train_and_checkpoint(slug, tmp_path):
  run_smoke(slug, tmp_path)


# Slow (`make test-all`): the resumed run re-evaluates everything, about 40% of a smoke test's
# time; `make test` keeps the resume logic's own tests (core/test_train_loop, core/test_replicas
# and each method's resumed-fit test).
@pytest.mark.slow
@pytest.mark.parametrize("slug", SLUGS)
def test_smoke_train_checkpoint_resume(slug, tmp_path):
  config = run_smoke(slug, tmp_path)
  steps = config.train.steps
  if slug in NOTHING_TO_RESUME:
    return
  if slug in EVALUATION_ONLY:
    check_unit_resume(slug, config, tmp_path)
    return
  dirs = checkpoint_dirs(tmp_path)
  longer = config_lib.override(config, {"train.steps": steps + 1})
  run_main(slug, longer, tmp_path)
  for directory in dirs:
    assert checkpoint.latest_step(directory) == steps + 1
    logged = [r["step"] for r in metrics.read_jsonl(directory.parent) if "train/loss" in r]
    assert logged == sorted(set(logged)) and logged[-1] == steps + 1, (
        f"{directory.parent.name} retrained instead of resuming: {logged}")


def check_unit_resume(slug, config, workdir):
  name = EVALUATION_ONLY[slug]
  logs = sorted(workdir.rglob("metrics.jsonl"))
  assert logs, "the smoke run logged no unit"
  steps = config.train.steps
  for log in logs:
    assert [r["step"] for r in metrics.read_jsonl(log) if name in r] == list(range(1, steps + 1))
  run_main(slug, config_lib.override(config, {"train.steps": steps + 1}), workdir)
  for log in logs:
    logged = [r["step"] for r in metrics.read_jsonl(log) if name in r]
    assert logged == list(range(1, steps + 2)), f"{log} re-evaluated instead of resuming: {logged}"
