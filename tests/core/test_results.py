"""results.json shape, status rules and the report builder."""
import json

import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import results


def test_write_results_shape(tmp_path):
  c = config_lib.finalize(config_lib.base_config(preset="smoke"))
  claims = [results.claim("c", "a claim", ours=1.0, holds=True, baselines={"b": 2.0},
                          paper=1.5)]
  payload = results.write_results(tmp_path, slug="toy", config=c, metrics={"m": {"x": 1.0}},
                                  claims=claims, headline_metric=results.headline(
                                      "x", ours=1.0, paper=2.0), wall_s=1.23)
  on_disk = json.loads((tmp_path / "results.json").read_text())
  assert on_disk == json.loads(json.dumps(payload))
  for key in ("slug", "preset", "commit", "wall_s", "device", "seeds", "metrics", "claims"):
    assert key in on_disk
  assert on_disk["claims"][0]["holds"] is True
  assert not (results.RESULTS_DIR / "toy.json").exists()   # smoke runs are not published


def test_status_rules():
  assert results.status_of(None) == "not started"
  assert results.status_of({"claims": [{"holds": True}, {"holds": False}]}) == "partial"
  assert results.status_of({"claims": [{"holds": True}]}) == "reproduced"
  assert results.status_of({"claims": []}) == "partial"


def test_format_number():
  assert results.format_number(1.5e-13) == "1.50e-13"
  assert results.format_number(0.25) == "0.25"
  assert results.format_number(None) == "—"


def test_rebuild_writes_report_and_readme_table(tmp_path):
  results_dir = tmp_path / "results"
  results_dir.mkdir()
  payload = {"slug": "toy", "preset": "quick", "commit": "abc", "wall_s": 1.0, "device": "cpu",
             "seeds": [0], "headline": {"name": "err", "ours": 1e-9, "paper": 1e-13},
             "metrics": {"a": {"b": 2.0}},
             "claims": [{"name": "c", "statement": "toy claim", "ours": 1.0, "baselines": {},
                         "paper": None, "holds": True, "comparison": "x"}]}
  (results_dir / "toy.json").write_text(json.dumps(payload))
  readme = tmp_path / "README.md"
  readme.write_text(f"intro\n{results.TABLE_BEGIN}\nold\n{results.TABLE_END}\nrest\n")
  results.rebuild([("toy", "A toy"), ("other", "Not built")], readme, results_dir)
  text = readme.read_text()
  assert "old" not in text and text.startswith("intro") and text.rstrip().endswith("rest")
  assert "| `toy` | A toy | reproduced | 1.00e-09 (err) | 1.00e-13 |" in text
  assert "| `other` | Not built | not started |" in text
  report = (results_dir / "REPORT.md").read_text()
  assert "toy claim" in report


def test_method_results_block_lists_claims_and_metrics():
  block = results.method_results_block({
      "slug": "toy", "preset": "quick", "commit": "abc", "wall_s": 2.0, "device": "cpu",
      "metrics": {"grad": {"x": 0.5}}, "claims": []})
  assert "| `grad.x` | 0.5 |" in block


def test_pipes_in_names_do_not_split_table_cells():
  payload = {"slug": "m", "headline": {"name": "mean |error|", "ours": 0.5, "paper": None},
             "claims": [results.claim("c", "a |b| claim", ours=1.0, holds=True,
                                      comparison="|x| < |y|")]}
  row = results.methods_table([("m", "M")], {"m": payload}).splitlines()[-1]
  assert row.count("|") - row.count("\\|") == 7   # 6 columns, as in the header
  claim_row = results.claims_table(payload)[-1]
  assert claim_row.count("|") - claim_row.count("\\|") == 8   # 7 columns


def test_paired_comparison_identical_arms_are_not_better():
  values = np.array([0.3, 0.5, 0.7, 0.2])
  for lower in (True, False):
    paired = results.paired_comparison(values, values, lower_is_better=lower)
    assert paired["difference"] == 0 and paired["stderr"] == 0 and paired["n"] == 4
    assert not paired["better"] and not paired["mean_better"]


def test_paired_comparison_constant_shift_is_decided_by_direction():
  baseline = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
  ours = baseline + 0.1
  higher = results.paired_comparison(ours, baseline, lower_is_better=False)
  assert higher["better"] and higher["mean_better"]
  assert np.isclose(higher["difference"], 0.1) and higher["stderr"] < 1e-12
  lower = results.paired_comparison(ours, baseline, lower_is_better=True)
  assert not lower["better"] and not lower["mean_better"]
  assert results.paired_comparison(baseline, ours, lower_is_better=True)["better"]
  # A shift that does not exceed the minimum effect is not a win.
  assert not results.paired_comparison(ours, baseline, lower_is_better=False,
                                       min_effect=0.2)["better"]


def test_paired_comparison_pure_noise_is_not_significant():
  rng = np.random.default_rng(0)
  verdicts = []
  for _ in range(200):
    baseline = rng.normal(size=5)
    ours = baseline + rng.normal(size=5)
    verdicts.append(results.paired_comparison(ours, baseline, lower_is_better=False)["better"])
  # One-sided at 2 standard errors of 5 pairs (t with 4 dof): a false win ~6% of the time.
  assert np.mean(verdicts) < 0.12


def test_paired_comparison_pairing_removes_shared_variance():
  rng = np.random.default_rng(1)
  seed_effect = rng.normal(scale=10.0, size=6)   # seeds differ a lot, both arms alike
  baseline = seed_effect + rng.normal(scale=0.01, size=6)
  ours = seed_effect + 0.1 + rng.normal(scale=0.01, size=6)
  paired = results.paired_comparison(ours, baseline, lower_is_better=False)
  assert paired["better"] and paired["stderr"] < 0.02


def test_paired_comparison_refuses_one_pair_and_mismatched_arms():
  with pytest.raises(ValueError, match="n=1"):
    results.paired_comparison([1.0], [0.5], lower_is_better=True)
  with pytest.raises(ValueError, match="same pairs"):
    results.paired_comparison([1.0, 2.0], [0.5, 0.1, 0.2], lower_is_better=True)


def test_paired_comparison_nonfinite_is_never_a_win():
  paired = results.paired_comparison([1.0, np.nan, 3.0], [0.0, 0.0, 0.0],
                                     lower_is_better=False)
  assert not paired["better"] and paired["nonfinite"] == 1


def test_paired_claim_reaches_results_json_and_report(tmp_path):
  paired = results.paired_comparison([0.5, 0.6, 0.55], [0.45, 0.58, 0.5], lower_is_better=False)
  c = results.claim("gain", "ours beats the baseline", ours=0.55, holds=paired["better"],
                    comparison="paired over seeds", paired=paired)
  config = config_lib.finalize(config_lib.base_config(preset="smoke"))
  payload = results.write_results(tmp_path, slug="toy", config=config, metrics={},
                                  claims=[c], headline_metric=None, wall_s=1.0)
  on_disk = json.loads((tmp_path / "results.json").read_text())
  assert on_disk["claims"][0]["paired"]["n"] == 3
  assert on_disk["claims"][0]["comparison"] == "paired over seeds"
  row = results.claims_table(payload)[-1]
  assert f"{results.format_number(paired['difference'])} +- " in row and "(n=3" in row
  assert results.format_paired(paired).endswith("(n=3)") == paired["better"]


def _payload(slug, preset, claims, headline=None):
  return {"slug": slug, "preset": preset, "commit": "abc", "wall_s": 1.0, "device": "cpu",
          "seeds": [0, 1, 2], "headline": headline, "metrics": {"x": 1.0},
          "claims": [{"name": n, "statement": f"claim {n}", "ours": 1.0, "baselines": {},
                      "paper": None, "holds": h} for n, h in claims]}


def test_long_results_replace_quick_claims_of_the_same_name():
  quick = _payload("m", "quick", [("a", True), ("converged", False)])
  long = _payload("m", "long", [("converged", True), ("extra", True)])
  assert [c["name"] for c in results.merged_claims(quick, long)] == ["a", "converged", "extra"]
  assert results.status_of(quick) == "partial"
  assert results.status_of(quick, long) == "reproduced"
  assert results.status_of(None, long) == "reproduced"
  assert results.status_of(quick, _payload("m", "long", [("a", False)])) == "partial"


def test_report_puts_long_results_under_quick_and_marks_the_headline(tmp_path):
  results_dir = tmp_path / "results"
  results_dir.mkdir()
  quick = _payload("m", "quick", [("converged", False)],
                   {"name": "err", "ours": 0.5, "paper": 1e-13})
  long = _payload("m", "long", [("converged", True)],
                  {"name": "err", "ours": 2e-13, "paper": 1e-13})
  (results_dir / "m.json").write_text(json.dumps(quick))
  (results_dir / "m_long.json").write_text(json.dumps(long))
  for name in ("m_curve.png", "m_long_curve.png"):
    (results_dir / name).write_bytes(b"")
  readme = tmp_path / "README.md"
  readme.write_text(f"{results.TABLE_BEGIN}\n{results.TABLE_END}\n")
  results.rebuild([("m", "M")], readme, results_dir)
  row = [line for line in readme.read_text().splitlines() if line.startswith("| `m`")][0]
  assert "reproduced" in row and "2.00e-13 (err; `long` preset)" in row
  assert "configs/m.py:quick" in row and "configs/m.py:long" in row
  report = (results_dir / "REPORT.md").read_text()
  quick_at, long_at = report.index("results/m.json"), report.index("results/m_long.json")
  assert quick_at < report.index("### `long` preset") < long_at
  assert report.index("(m_curve.png)") < long_at < report.index("(m_long_curve.png)")
  assert report.count("(m_long_curve.png)") == 1


def test_long_preset_results_are_published_with_the_suffix(tmp_path, monkeypatch):
  monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "published")
  c = config_lib.base_config(preset="long")
  config_lib.finalize(c)
  results.write_results(tmp_path / "run", slug="toy", config=c, metrics={}, claims=[],
                        headline_metric=None, wall_s=1.0)
  assert (tmp_path / "published" / "toy_long.json").exists()
  assert not (tmp_path / "published" / "toy.json").exists()


def test_overridden_presets_are_not_published(tmp_path, monkeypatch):
  monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "published")
  monkeypatch.setattr(results, "_publish_blocked_by", [])
  c = config_lib.base_config(preset="quick")
  config_lib.finalize(c)
  results.block_publishing(["data.tasks"])
  results.write_results(tmp_path / "run", slug="toy", config=c, metrics={}, claims=[],
                        headline_metric=None, wall_s=1.0)
  assert (tmp_path / "run" / "results.json").exists()
  assert not (tmp_path / "published").exists()
  results.write_results(tmp_path / "run", slug="toy", config=c, metrics={}, claims=[],
                        headline_metric=None, wall_s=1.0, publish=True)
  assert (tmp_path / "published" / "toy.json").exists()


def test_standard_error_of_the_mean():
  np.testing.assert_allclose(results.standard_error([1.0, 2.0, 3.0, 4.0]),
                             np.std([1, 2, 3, 4], ddof=1) / 2)
  assert np.isnan(results.standard_error([1.0]))


def test_save_figure_writes_the_png_and_closes_the_figure(tmp_path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config(preset="smoke")
  figure, axis = plt.subplots()
  axis.plot([0, 1], [1, 0])
  results.save_figure(figure, tmp_path, "line.png", "demo", config, publish=False)
  assert (tmp_path / "line.png").stat().st_size > 0
  assert not plt.fignum_exists(figure.number)
