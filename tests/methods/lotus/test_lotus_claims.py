"""lotus: the detail-preserver claim is decided on paired training seeds."""
import pathlib

from jaxlab.core import config as config_lib
from jaxlab.core import results
from jaxlab.methods.lotus import reproduction

ROOT = pathlib.Path(__file__).resolve().parents[3]


def summary_with_edges(plain, detail):
  return {"depth": {}, "normal": {}, "edge_error": {"lotus_g": plain[0],
                                                    "lotus_g_detail": detail[0]},
          "detail_preserver": {"seeds": list(range(len(plain))),
                               "edge_error": {"lotus_g": plain, "lotus_g_detail": detail},
                               "paired": results.paired_comparison(detail, plain,
                                                                   lower_is_better=True)}}


def detail_claim(summary):
  claims, _ = reproduction.claims(summary)
  return next(c for c in claims if c["name"] == "detail_preserver_sharpens_edges")


def test_a_consistent_paired_improvement_holds_and_a_noisy_one_does_not():
  consistent = detail_claim(summary_with_edges([0.35, 0.36, 0.34], [0.33, 0.34, 0.325]))
  assert consistent["holds"] and consistent["paired"]["n"] == 3
  # Lower on average, but one seed goes the other way by as much: within the noise.
  noisy = detail_claim(summary_with_edges([0.35, 0.36, 0.34], [0.30, 0.40, 0.33]))
  assert noisy["paired"]["mean_better"] and not noisy["holds"]


def test_extra_seeds_train_only_when_both_arms_and_depth_run():
  config = config_lib.load_config(ROOT / "configs" / "lotus.py", "quick")
  assert reproduction.detail_seeds(config) == [config.seed + i for i in range(3)]
  without_detail = config_lib.with_overrides(config, {"variants": "x0_multi,lotus_g"})
  assert reproduction.detail_seeds(without_detail) == []
  normals_only = config_lib.with_overrides(config, {"tasks": "normal"})
  assert reproduction.detail_seeds(normals_only) == []
