"""metametrics.calibration: Kendall against a brute-force pair count, a hidden nonnegative
combination recovered by gp, xgb and the baselines fitting, and the input checks."""
import itertools
import time

import numpy as np
import pytest

from jaxlab.methods.metametrics import calibration
from jaxlab.methods.metametrics import study
from jaxlab.methods.metametrics import data


def brute_force_tau_b(x, y):
  concordant = discordant = tied_x = tied_y = 0
  for i, j in itertools.combinations(range(len(x)), 2):
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    if dx == 0 and dy == 0:
      continue
    if dx == 0:
      tied_x += 1
    elif dy == 0:
      tied_y += 1
    elif dx == dy:
      concordant += 1
    else:
      discordant += 1
  return (concordant - discordant) / np.sqrt(
      (concordant + discordant + tied_x) * (concordant + discordant + tied_y))


@pytest.mark.parametrize("seed", range(3))
def test_kendall_equals_a_brute_force_pair_count_with_ties(seed):
  rng = np.random.default_rng(seed)
  human = rng.integers(-3, 1, 40).astype(float)       # many ties, as MQM scores have
  pred = np.round(human + rng.normal(0, 1.5, 40))    # ties in the prediction too
  assert calibration.kendall(pred, human) == pytest.approx(brute_force_tau_b(pred, human),
                                                           abs=1e-12)


def test_grouped_kendall_skips_groups_with_constant_human_scores():
  human = np.asarray([0, -1, -2, 0, 0, 0.0])
  pred = np.asarray([3, 2, 1, 5, 1, 2.0])
  groups = np.asarray([1, 1, 1, 2, 2, 2])
  assert calibration.grouped_kendall(pred, human, groups) == pytest.approx(1.0)


def hidden_combination(seed=0, n=400):
  """Four noisy views of a hidden quality; the human score is a nonnegative mix of them."""
  rng = np.random.default_rng(seed)
  quality = rng.normal(size=n)
  scores = {f"m{k}": 1 / (1 + np.exp(-(quality * s + rng.normal(0, 1.0, n))))
            for k, s in enumerate((1.0, 0.8, 0.6, 0.0))}
  weights = np.asarray([0.6, 0.3, 0.1, 0.0])
  matrix = np.stack(list(scores.values()), axis=1)
  human = np.round(4 * (matrix @ weights), 1)    # coarse, so it has ties
  return scores, human


def test_gp_recovers_a_hidden_nonnegative_combination():
  scores, human = hidden_combination()
  train = np.arange(human.size) < 200
  take = lambda mask: {m: v[mask] for m, v in scores.items()}
  fitted = calibration.calibrate(take(train), human[train], "gp", seed=0, init_points=5,
                                 n_iter=10)
  assert fitted.weights.shape == (4,) and np.all((fitted.weights >= 0) & (fitted.weights <= 1))
  held_out = calibration.kendall(fitted.predict(take(~train)), human[~train])
  singles = [calibration.kendall(v[~train], human[~train]) for v in scores.values()]
  assert held_out > max(singles) + 0.03, (held_out, singles)
  assert fitted.info["evaluations"] == 15
  assert fitted.num_unused == int(np.sum(fitted.weights < calibration.SPARSE_WEIGHT))


def test_an_all_zero_weight_vector_is_redrawn():
  rng = np.random.default_rng(0)
  redrawn = calibration.redraw_if_all_zero(np.zeros(5), rng)
  assert np.all((redrawn >= 0.01) & (redrawn <= 1.0))
  kept = np.asarray([0.0, 0.2])
  assert calibration.redraw_if_all_zero(kept, rng) is kept


def test_xgb_linear_and_uniform_fit_and_predict():
  scores, human = hidden_combination(n=120)
  fits = {method: calibration.calibrate(scores, human, method, seed=0, **options)
          for method, options in (("xgb", dict(n_iter=2, cv=2)), ("linear", {}),
                                  ("uniform", {}))}
  for method, fitted in fits.items():
    prediction = fitted.predict(scores)
    assert prediction.shape == human.shape and np.all(np.isfinite(prediction))
    assert calibration.kendall(prediction, human) > 0.3, method
    assert (fitted.weights is None) == (method == "xgb")
  fitted = fits["xgb"]
  assert set(fitted.info["best_params"]) == {"n_estimators", "learning_rate"}
  assert fitted.model.get_params()["max_depth"] == 5   # the fixed settings are applied
  assert fitted.model.get_params()["reg_alpha"] == 0.1


def test_bad_inputs_fail_naming_the_argument():
  scores, human = hidden_combination(n=20)
  with pytest.raises(ValueError, match="pred and human"):
    calibration.kendall(np.ones(3), np.ones(4))
  with pytest.raises(ValueError, match="human is constant"):
    calibration.kendall(np.arange(4.0), np.zeros(4))
  with pytest.raises(ValueError, match="human is constant"):
    calibration.calibrate(scores, np.zeros(20), "linear")
  with pytest.raises(ValueError, match="pred has a non-finite"):
    calibration.kendall(np.asarray([1.0, np.nan]), np.asarray([0.0, 1.0]))
  with pytest.raises(ValueError, match=r"scores\['m0'\] has a non-finite"):
    calibration.calibrate({**scores, "m0": np.full(20, np.nan)}, human, "linear")
  with pytest.raises(ValueError, match="method must be one of"):
    calibration.calibrate(scores, human, "adam")
  with pytest.raises(ValueError, match="unknown option 'n_iters'"):
    calibration.calibrate(scores, human, "gp", n_iters=3)
  with pytest.raises(ValueError, match="human has 19 items"):
    calibration.calibrate(scores, human[:19], "linear")
  with pytest.raises(ValueError, match="same number of items"):
    calibration.calibrate({**scores, "m0": np.ones(19)}, human, "linear")
  fitted = calibration.calibrate(scores, human, "uniform")
  with pytest.raises(ValueError, match="no metric 'm3'"):
    fitted.predict({m: v for m, v in scores.items() if m != "m3"})


def test_run_split_chooses_the_best_single_metric_on_the_training_half():
  scores, human = hidden_combination(n=104)
  seg_id = np.repeat(np.arange(8), 13)
  items = data.Items("en-de", ("s",) * 104, seg_id, ("",) * 104, ("",) * 104, ("",) * 104, human)
  train = data.split_by_source(seg_id, 0)
  record = study.run_split(scores, items, train, ("linear", "uniform"), {}, seed=0)
  best = max(record["single"], key=lambda m: record["single"][m]["tau_train"])
  assert record["best_single"] == best
  summary = study.summarise([record, record], ("linear", "uniform"))
  assert summary["linear"]["tau_test"]["per_split"] == [record["linear"]["tau_test"]] * 2
