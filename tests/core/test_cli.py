"""The command line fails fast, naming the bad key, before anything compiles."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_cli(*args, tmp_path, config="configs/precision_ls.py:smoke"):
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="8")
  return subprocess.run(
      [sys.executable, "-m", "experiments.precision_ls", f"--config={config}",
       f"--workdir={tmp_path}", *args],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def assert_one_line_config_error(result, expected):
  """Status 2, no traceback: stderr is the one line `config error: <expected>`."""
  assert result.returncode == 2, result.stderr
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines() == [f"config error: {expected}"], result.stderr


def test_unknown_override_key_is_one_line_with_a_suggestion(tmp_path):
  result = run_cli("--config.train.stepz=3", tmp_path=tmp_path)
  assert_one_line_config_error(
      result, "unknown key 'train.stepz' (did you mean 'train.steps'?)")
  assert not (tmp_path / "checkpoints").exists()


def test_unknown_preset_is_one_line(tmp_path):
  result = run_cli(tmp_path=tmp_path, config="configs/precision_ls.py:smok")
  assert_one_line_config_error(
      result, "unknown preset 'smok' (did you mean 'smoke'?); this config has smoke, quick, "
              "paper, long")
  # A config without the optional long preset says so (the entry point is any experiment's).
  result = run_cli(tmp_path=tmp_path, config="configs/enamel.py:long")
  assert_one_line_config_error(
      result, "unknown preset 'long'; this config has smoke, quick, paper")


def test_wrong_value_type_is_one_line(tmp_path):
  result = run_cli("--config.train.steps=many", tmp_path=tmp_path)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  line, = result.stderr.strip().splitlines()
  assert line.startswith("config error: config key 'train.steps' cannot take 'many'")


def test_batch_not_divisible_by_devices_is_named(tmp_path):
  result = run_cli("--config.train.batch_size=12", tmp_path=tmp_path)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(
      "config error: config key 'train.batch_size' = 12 is not divisible by the 8 devices")
  assert not any(tmp_path.rglob("checkpoints"))


def test_cpu_devices_flag_sets_the_devices_the_config_is_checked_against(tmp_path):
  result = run_cli("--cpu_devices=3", tmp_path=tmp_path)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert "is not divisible by the 3 devices" in result.stderr.strip().splitlines()[-1]
  result = run_cli("--cpu_devices=0", tmp_path=tmp_path)
  assert result.returncode != 0 and "--cpu_devices: the number of CPU devices must be a " \
      "positive integer, got 0" in result.stderr


def test_config_arguments_after_the_preset_block_publishing_as_overrides_do():
  from jaxlab.core import cli  # pylint: disable=g-import-not-at-top
  assert cli.preset_changes("configs/jetformer.py:quick", []) == []
  assert cli.preset_changes("configs/jetformer.py", []) == []
  assert cli.preset_changes("configs/jetformer.py:preset=long", []) == []
  assert cli.preset_changes("configs/jetformer.py:quick,steps=100", ["train.seed"]) == [
      "--config.train.seed", "config argument steps="]
  assert cli.preset_changes("configs/flow_mi.py:steps=5,ablation=x", []) == [
      "config argument steps=", "config argument ablation="]
