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
