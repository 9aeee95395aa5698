"""`make reproduce` (`python -m experiments.report --run`): presets checked per config,
failures reported, a summary table at the end."""
import pytest

from experiments import report


def test_has_preset_knows_which_configs_define_long():
  assert report.has_preset("precision_ls", "quick")
  assert report.has_preset("precision_ls", "long")
  assert not report.has_preset("enamel", "long")


def test_summary_table_counts_claims_and_time():
  outcomes = [report.Outcome("a", "quick", "ok", wall_s=12.34, results_wall_s=50.0,
                                held=2, tested=3),
              report.Outcome("b", "quick", "failed (exit 1)", wall_s=1.0),
              report.Outcome("c", "long", "skipped (no long preset)")]
  table = report.summary_table(outcomes, total_s=13.4).splitlines()
  assert table[2] == "| `a` | quick | 12.3 | 50 | 2 / 3 | ok |"
  assert table[3] == "| `b` | quick | 1.0 | — | — | failed (exit 1) |"
  assert table[4] == "| `c` | long | — | — | — | skipped (no long preset) |"
  assert table[5] == "| **total** | | 13.4 | | 2 / 3 | 1 ok |"


@pytest.fixture
def fake_runs(monkeypatch):
  ran, rebuilt = [], []
  def run_one(slug, preset, python):
    ran.append((slug, preset))
    status = "failed (exit 1)" if slug == "enamel" else "ok"
    return report.Outcome(slug, preset, status, wall_s=1.0, held=1, tested=1)
  monkeypatch.setattr(report, "run_one", run_one)
  monkeypatch.setattr(report.results, "rebuild", lambda *a, **k: rebuilt.append(a) or [])
  return ran, rebuilt


def test_long_skips_configs_without_it_and_a_failure_does_not_stop_the_others(
    fake_runs, monkeypatch, capsys):
  ran, rebuilt = fake_runs
  monkeypatch.setattr(report, "has_preset", lambda slug, preset: slug != "lotus")
  status = report.main(["--run", "--preset=long"])
  assert status == 1                                    # enamel failed
  assert ("lotus", "long") not in ran and ("enamel", "long") in ran
  assert len(ran) == len(report.config_slugs()) - 1  # every other config still ran
  assert rebuilt
  out = capsys.readouterr().out
  assert "| `lotus` | long | — | — | — | skipped (no long preset) |" in out
  assert "| **total** |" in out


def test_only_a_config_without_the_preset_is_an_error(fake_runs):
  with pytest.raises(SystemExit) as exit_info:
    report.main(["--run", "--preset=long", "--only=enamel"])
  assert exit_info.value.code == 2
  with pytest.raises(SystemExit):
    report.main(["--run", "--only=not_a_method"])
  assert fake_runs[0] == []
