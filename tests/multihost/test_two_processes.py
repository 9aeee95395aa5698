"""A two-process "pod" on this machine: 2 JAX processes x 4 CPU devices, talking over localhost,
against 1 process x 8 devices."""
import json
import pathlib

import numpy as np
import pytest

from jaxlab.core import cli
from tests.multihost import launch

SLUGS = sorted(p.stem for p in (launch.ROOT / "configs").glob("[!_]*.py"))
# Metrics could differ across the two layouts by the order of floating-point reductions (the
# all-reduce over 8 devices is split over two processes); measured, they are equal. A pod's
# global batch is the one-process batch row for row (`grain_pipeline`), so per-row noise is too.
RTOL = 1e-6
# Experiments that refuse to run on several processes, and why; each must exit at start-up with
# `cli.SINGLE_PROCESS_STATUS` and say so. Every other experiment must give one process's metrics.
ONE_PROCESS_ONLY = {
    "enamel": "eff@k compares execution times, which must all be measured on one machine",
    "btbs_lns": "its methods are compared on wall-clock-limited solver runs on one machine",
    "metametrics": "Bayesian optimisation and XGBoost on one host; no JAX computation to share",
}
# Metrics that time the run rather than compute a result: they differ between any two runs.
TIMING_KEYS = ("wall_s", "infer_ms", "steps_per_sec", "seconds")


def numbers(metrics, prefix=""):
  out = {}
  for key, value in metrics.items():
    if any(timing in key for timing in TIMING_KEYS):
      continue
    if isinstance(value, dict):
      out.update(numbers(value, f"{prefix}{key}."))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      out[f"{prefix}{key}"] = float(value)
    elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
      out[f"{prefix}{key}"] = np.asarray(value, np.float64)
  return out


def assert_ran(processes):
  for p in processes:
    assert p.returncode == 0, f"process {p.process_id} exited {p.returncode}:\n{p.output[-3000:]}"


# One variant of the smoke preset (the generic train loop, a checkpoint, an evaluation): the
# whole smoke preset trains three and costs three times as long.
ONE_VARIANT = ("--config.run_variants=multiply_softmax",)


@pytest.fixture(scope="module")
def precision_ls_runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("precision_ls")
  single = launch.run_single("precision_ls", "smoke", root / "single", extra=ONE_VARIANT)
  assert single.returncode == 0, single.stderr[-3000:]
  pod = launch.launch("precision_ls", "smoke", root / "pod", extra=ONE_VARIANT,
                      env={"JAXLAB_RECORD_EXAMPLES": str(root / "examples")})
  assert_ran(pod)
  return root / "single", root / "pod"


def test_two_processes_give_the_metrics_of_one(precision_ls_runs):
  single_dir, pod_dir = precision_ls_runs
  assert "cpu x8" in json.loads((pod_dir / "results.json").read_text())["device"]
  assert_same_metrics(single_dir, pod_dir)


def assert_one_writer(pod_dir: pathlib.Path) -> None:
  """One workdir shared by both processes (as a bucket would be): exactly one copy of each
  output, written by process 0, and checkpoints that both processes finished."""
  assert (pod_dir / "results.json").exists()
  logs = sorted(pod_dir.rglob("metrics.jsonl"))
  assert logs
  for log in logs:
    records = [json.loads(line) for line in log.read_text().splitlines() if line]
    for kind in {tuple(sorted(r)) for r in records}:   # train and eval records log separately
      steps = [r["step"] for r in records if tuple(sorted(r)) == kind]
      assert steps == sorted(set(steps)), f"{log}: two writers interleaved {steps}"
  checkpoints = sorted(p for p in pod_dir.rglob("checkpoints") if p.is_dir())
  assert checkpoints and all(any(c.iterdir()) for c in checkpoints)


def test_only_process_0_writes_and_both_checkpoint(precision_ls_runs):
  assert_one_writer(precision_ls_runs[1])


@pytest.mark.slow
def test_one_process_dying_stops_the_other_with_an_error(tmp_path):
  # A long run, so the survivor is mid-training (inside a collective) when its peer dies.
  processes = launch.launch("precision_ls", "smoke,steps=2000", tmp_path / "pod", kill=(1, 25),
                            heartbeat_timeout_seconds=10, timeout=120)
  survivor = processes[0]
  assert survivor.returncode not in (None, 0), "the survivor finished or hung"
  assert survivor.elapsed < 110, "the survivor was still running when the launcher gave up"
  assert ("heartbeat timeout" in survivor.output or "Connection reset by peer" in
          survivor.output), survivor.output[-2000:]


def read_examples(directory):
  """{process: {source length: [example indices in reading order]}} from the pipeline's hook."""
  out = {}
  for path in sorted(directory.glob("process*.txt")):
    seen = out.setdefault(int(path.stem.removeprefix("process")), {})
    for line in path.read_text().splitlines():
      length, *indices = map(int, line.split())
      seen.setdefault(length, []).extend(indices)
  return out


def test_each_process_reads_a_disjoint_slice_of_every_split(precision_ls_runs):
  _, pod_dir = precision_ls_runs
  seen = read_examples(pod_dir.parent / "examples")
  assert sorted(seen) == [0, 1]
  assert seen[0].keys() == seen[1].keys() and len(seen[0]) >= 2   # train and test splits
  for length in seen[0]:
    first, second = seen[0][length], seen[1][length]
    # The smoke run reads less than one epoch of each split, so no index may repeat.
    assert len(set(first)) == len(first) and len(set(second)) == len(second)
    assert not set(first) & set(second), f"split of {length} examples read by both processes"
    assert len(first) == len(second)


@pytest.mark.slow
def test_a_killed_pod_resumes_and_ends_as_an_uninterrupted_one(tmp_path):
  arg = "smoke,steps=120"
  extra = ONE_VARIANT + ("--config.train.ckpt_every=20", "--config.train.log_every=10")
  assert_ran(launch.launch("precision_ls", arg, tmp_path / "whole", extra=extra))
  log = tmp_path / "killed" / "multiply_softmax" / "metrics.jsonl"

  def mid_run():   # past the second checkpoint, before the end
    if not log.exists():
      return False
    steps = [json.loads(line).get("step", 0) for line in log.read_text().splitlines() if line]
    return bool(steps) and 45 <= max(steps) < 120
  killed = launch.launch("precision_ls", arg, tmp_path / "killed", extra=extra,
                         kill_all_when=mid_run)
  assert all(p.returncode == -9 for p in killed), [p.returncode for p in killed]
  assert not (tmp_path / "killed" / "results.json").exists()
  assert_ran(launch.launch("precision_ls", arg, tmp_path / "killed", extra=extra))
  whole = json.loads((tmp_path / "whole" / "results.json").read_text())
  resumed = json.loads((tmp_path / "killed" / "results.json").read_text())
  expected, got = numbers(whole["metrics"]), numbers(resumed["metrics"])
  assert expected.keys() == got.keys()
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=RTOL, atol=1e-12, err_msg=key)


def assert_same_metrics(single_dir: pathlib.Path, pod_dir: pathlib.Path) -> None:
  single = json.loads((single_dir / "results.json").read_text())
  pod = json.loads((pod_dir / "results.json").read_text())
  assert "over 2 processes" in pod["device"]
  expected, got = numbers(single["metrics"]), numbers(pod["metrics"])
  assert expected and expected.keys() == got.keys()
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=RTOL, atol=1e-12, err_msg=key)
  assert [c["holds"] for c in pod["claims"]] == [c["holds"] for c in single["claims"]]


def test_a_one_process_experiment_refuses_a_pod_at_start_up(tmp_path):
  processes = launch.launch("enamel", "smoke", tmp_path / "pod", timeout=120)
  for p in processes:
    assert p.returncode == cli.SINGLE_PROCESS_STATUS, p.output[-2000:]
    assert "runs in one process only" in p.output and "eff@k" in p.output
  assert not (tmp_path / "pod" / "results.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("slug", SLUGS)
def test_every_experiment_gives_one_process_metrics_on_two(slug, tmp_path):
  """Each method's smoke preset on 2 processes x 4 devices against 1 x 8 (precision_ls also has
  the fast tests above; neural_spacetimes is the replica loop, enamel a one-process harness)."""
  if slug in ONE_PROCESS_ONLY:
    processes = launch.launch(slug, "smoke", tmp_path / "pod", timeout=120)
    assert all(p.returncode == cli.SINGLE_PROCESS_STATUS for p in processes), (
        ONE_PROCESS_ONLY[slug], [p.output[-1000:] for p in processes])
    return
  single = launch.run_single(slug, "smoke", tmp_path / "single", timeout=400)
  assert single.returncode == 0, single.stderr[-3000:]
  assert_ran(launch.launch(slug, "smoke", tmp_path / "pod", timeout=400))
  assert_same_metrics(tmp_path / "single", tmp_path / "pod")
  assert_one_writer(tmp_path / "pod")
