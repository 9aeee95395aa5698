"""neural_spacetimes claims are decided by the measured numbers."""
from jaxlab.methods.neural_spacetimes import reproduction


def summary_with(nst_mean, nst_max, nst_direction=1.0):
  def cell(nst, mink, des):
    return {"nst": nst, "minkowski": mink, "de_sitter": des}

  stats = {
      "distortion_mean": {"synthetic_type1": {"2": cell(nst_mean, 3.0, -50.0),
                                              "10": cell(1.0 + (nst_mean - 1) / 4, 1.2, 9.0)}},
      "distortion_std": {"synthetic_type1": {"2": cell(0.1, 5.0, 900.0),
                                             "10": cell(0.05, 0.9, 500.0)}},
      "distortion_max": {"synthetic_type1": {"2": cell(nst_max, 80.0, None),
                                             "10": cell(1.2, 20.0, 1e4)}},
      "directionality": {"synthetic_type1": {"2": cell(nst_direction, 0.99, 0.98),
                                             "10": cell(1.0, 0.99, 0.98)}},
  }
  return stats


def test_claims_hold_when_nst_is_better_and_fail_when_not():
  claims, headline = reproduction.claims(summary_with(1.06, 2.1))
  by_name = {c["name"]: c for c in claims}
  assert by_name["nst_beats_closed_form_synthetic"]["holds"]
  assert by_name["distortion_approaches_one"]["holds"]
  assert "1.060" in headline["ours"]

  # A larger maximum than Minkowski's loses the setting at dim 2 (1 of 2 < 0.8).
  claims, _ = reproduction.claims(summary_with(1.06, 100.0))
  assert not {c["name"]: c for c in claims}["nst_beats_closed_form_synthetic"]["holds"]
  # So does a directionality more than 0.05 below the baselines'.
  claims, _ = reproduction.claims(summary_with(1.06, 2.1, nst_direction=0.9))
  assert not {c["name"]: c for c in claims}["nst_beats_closed_form_synthetic"]["holds"]
  # Distortion that moves away from 1 with the dimension fails the second claim.
  stats = summary_with(1.06, 2.1)
  stats["distortion_mean"]["synthetic_type1"]["10"]["nst"] = 1.5
  claims, _ = reproduction.claims(stats)
  assert not {c["name"]: c for c in claims}["distortion_approaches_one"]["holds"]


def test_with_seeds_a_setting_is_won_only_beyond_the_seed_spread():
  def seeded(nst_seeds, minkowski_seeds):
    stats = summary_with(1.06, 2.1)
    stats["distortion_mean"] = {"dream5_e_coli": {"4": {
        "nst": sum(nst_seeds) / 3, "minkowski": sum(minkowski_seeds) / 3, "de_sitter": -50.0}}}
    for stat in ("distortion_std", "distortion_max", "directionality"):
      stats[stat] = {"dream5_e_coli": {"4": stats[stat]["synthetic_type1"]["2"]}}
    stats["per_seed"] = {"distortion_mean": {"dream5_e_coli": {"4": {
        "nst": nst_seeds, "minkowski": minkowski_seeds, "de_sitter": [-50.0, None, 9.0]}}}}
    claim = {c["name"]: c for c in reproduction.claims(stats)[0]}["nst_beats_closed_form_dream5"]
    return claim
  # NST's error 0.0004 +- 0.0001 against Minkowski's 0.0025 +- 0.0001: won (the wild de Sitter
  # seeds, one of them diverged, lose on the log scale).
  won = seeded([0.9995, 1.0004, 1.0003], [1.0024, 1.0026, 1.0025])
  assert won["holds"] and won["paired"]["e_coli/4 vs minkowski"]["n"] == 3
  # The same seed means, but the seeds spread over the difference: not won.
  assert not seeded([0.9995, 1.0004, 1.0003], [1.0003, 1.0064, 1.0004])["holds"]
