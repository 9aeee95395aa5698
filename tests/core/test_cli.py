"""The command line fails fast, naming the bad key, before anything compiles."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_cli(*args, tmp_path):
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="8")
  return subprocess.run(
      [sys.executable, "-m", "experiments.precision_ls",
       "--config=configs/precision_ls.py:smoke", f"--workdir={tmp_path}", *args],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_unknown_override_key_is_named(tmp_path):
  result = run_cli("--config.train.stepz=3", tmp_path=tmp_path)
  assert result.returncode != 0
  assert "stepz" in result.stderr and "steps" in result.stderr
  assert not (tmp_path / "checkpoints").exists()


def test_batch_not_divisible_by_devices_is_named(tmp_path):
  result = run_cli("--config.train.batch_size=12", tmp_path=tmp_path)
  assert result.returncode != 0
  assert "train.batch_size" in result.stderr and "8 devices" in result.stderr
  assert not any(tmp_path.rglob("checkpoints"))
