"""results.json shape, status rules and the report builder."""
import json

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
  assert claim_row.count("|") - claim_row.count("\\|") == 7
