"""benchmarks/gpu_check.sh, the one command for a lent GPU machine, run here without a GPU: it
says so, runs the smoke part on the CPU (going on after a failure) and writes its table."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The cheapest smoke preset, and a name with no experiment (a failure the check must survive).
CHEAP_METHOD = "enamel"


def test_gpu_check_without_a_gpu_runs_the_smoke_part_and_writes_the_table(tmp_path):
  env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path),
             WHEEL_DIR=str(tmp_path / "no-wheels"), JAX_DISABLE_MOST_OPTIMIZATIONS="1",
             JAX_COMPILATION_CACHE_DIR=str(pathlib.Path.home() / ".cache" / "jaxlab-jax-tests"))
  env.pop("JAX_NUM_CPU_DEVICES", None)
  result = subprocess.run(
      ["bash", "benchmarks/gpu_check.sh", f"--methods=not_a_method,{CHEAP_METHOD}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert result.returncode == 1, result.stdout + result.stderr   # one of the two failed
  assert "no GPU found" in result.stdout and "benchmarks skipped" in result.stdout
  report = (tmp_path / "RESULTS_gpu.md").read_text()
  assert "| smoke | `not_a_method` | **failed** (exit 1) |" in report
  assert f"| smoke | `{CHEAP_METHOD}` | ok |" in report
  assert "1 failed of 2." in report and "benchmark" not in report.split("|---|")[-1]
  assert (tmp_path / "gpu_check_logs.txt").exists()


def test_gpu_check_refuses_unknown_arguments():
  result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--fast"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
  assert result.returncode == 2 and "unknown argument --fast" in result.stderr
