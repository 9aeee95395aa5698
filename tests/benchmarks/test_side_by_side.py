"""Side-by-side timing: rows read seconds per unit of work from steps/s, the ratio per round."""
from benchmarks import common


def test_seconds_row_inverts_rates_and_takes_the_median_of_per_round_ratios():
  result = common.SideBySide(ours=[4.0, 5.0, 6.0, 5.0, 5.0], official=[1.0, 2.0, 2.0, 1.0, 2.0],
                             loads=[1.25, 1.5, 1.0, 1.5, 1.25, 1.5, 1.5, 1.0, 1.5, 1.5])
  # Per-round ratios 4, 2.5, 3, 5, 2.5: median 3 (not 5 / 2 from the medians of each side).
  assert result.ratio == 3.0
  assert result.seconds_row("jvf", 1000) == "| jvf | 200.0 | 500.0 | 3.0x | 1.0-1.5 |\n"
  assert result.seconds_row("nst", 1, digits=(3, 2)) == "| nst | 0.200 | 0.50 | 3.0x | 1.0-1.5 |\n"


def test_an_official_worker_reports_its_rate_and_the_details_of_its_last_call(tmp_path):
  """The worker protocol end to end: a worker script under `official_protocol.serve`, driven by
  `common.OfficialWorker` as the speed scripts drive the official code."""
  import pathlib  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  benchmarks_dir = pathlib.Path(common.__file__).resolve().parent
  script = tmp_path / "toy_worker.py"
  script.write_text(
      "import sys\n"
      f"sys.path.insert(0, {str(benchmarks_dir)!r})\n"
      "import official_protocol\n"
      "protocol = official_protocol.take_stdout()\n"
      "calls = []\n"
      "official_protocol.serve(lambda: calls.append(1), protocol,\n"
      "                        details=lambda: {'calls_so_far': len(calls)}, size=3)\n")
  worker = common.OfficialWorker(sys.executable, script)
  try:
    assert worker.info == {"ready": True, "size": 3}
    assert worker.steps_per_second(0.05) > 0
    first = worker.last_window["calls_so_far"]
    assert first == worker.last_window["steps"] >= 1
    worker.steps_per_second(0.05)
    assert worker.last_window["calls_so_far"] == first + worker.last_window["steps"]
  finally:
    worker.close()
  assert worker.process.returncode == 0
