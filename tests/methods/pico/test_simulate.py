"""pico simulated peer review: shapes, determinism, the judging rate, the consistency assumption,
and the calibration to the real file."""
import dataclasses

import numpy as np
import pytest

from jaxlab.methods.pico import data
from jaxlab.methods.pico import simulate


@pytest.fixture(scope="module")
def default_set():
  return simulate.simulate(simulate.SimulationSpec(), seed=0)


def agreement_with_ability(simulated):
  """[M] per reviewer: the share of its decisive battles won by the abler model (lower index)."""
  decisive = simulated.score_a != 0.5
  abler_won = np.where(simulated.model_a < simulated.model_b, simulated.score_a == 1,
                       simulated.score_a == 0)
  return np.array([abler_won[decisive & (simulated.reviewer == r)].mean()
                   for r in range(simulated.num_models)])


def test_shapes_and_ranges(default_set):
  spec = simulate.SimulationSpec()
  sim = default_set
  assert sim.models == data.true_order()
  for array in (sim.model_a, sim.model_b, sim.reviewer, sim.question):
    assert array.dtype == np.int32 and array.shape == (sim.num_battles,)
  assert sim.score_a.dtype == np.float32
  assert set(np.unique(sim.score_a).tolist()) == {0.0, 0.5, 1.0}
  assert np.all(sim.model_a != sim.model_b)
  assert set(np.unique(sim.reviewer).tolist()) == set(range(15))
  assert sim.question.min() == 0 and sim.question.max() == spec.num_questions - 1
  # Each (question, pair, reviewer) at most once; each unordered pair at most once per question.
  keys = np.stack([sim.question, sim.model_a, sim.model_b, sim.reviewer], axis=1)
  assert len(np.unique(keys, axis=0)) == sim.num_battles
  pairs = np.unique(np.stack([sim.question, np.minimum(sim.model_a, sim.model_b),
                              np.maximum(sim.model_a, sim.model_b)], axis=1), axis=0)
  assert len(np.unique(np.stack([sim.question, sim.model_a, sim.model_b], axis=1),
                       axis=0)) == len(pairs)
  # Every model met at least its own 4 opponents in every question (most judged, p = 0.85).
  opponents = np.zeros((spec.num_questions, 15), int)
  np.add.at(opponents, (pairs[:, 0], pairs[:, 1]), 1)
  np.add.at(opponents, (pairs[:, 0], pairs[:, 2]), 1)
  assert opponents.min() >= spec.opponents
  # Both orientations occur: model_1 is not always the lower index.
  assert 0.4 < np.mean(sim.model_a < sim.model_b) < 0.6
  assert sim.num_battles == pytest.approx(simulate.expected_battles(spec), rel=0.03)
  assert simulate.expected_battles(spec) == pytest.approx(52457, abs=1)


def test_same_seed_same_data_other_seed_other_data(default_set):
  again = simulate.simulate(simulate.SimulationSpec(), seed=0)
  for field in ("model_a", "model_b", "reviewer", "score_a", "question"):
    np.testing.assert_array_equal(getattr(again, field), getattr(default_set, field))
  other = simulate.simulate(simulate.SimulationSpec(), seed=1)
  assert other.num_battles != default_set.num_battles or not np.array_equal(
      other.score_a, default_set.score_a)


def test_judge_probability(default_set):
  spec = simulate.SimulationSpec(judge_probability=0.5)
  sim = simulate.simulate(spec, seed=0)
  for p, battles in ((0.85, default_set), (0.5, sim)):
    num_pairs = len(np.unique(np.stack([battles.question, battles.model_a, battles.model_b],
                                       axis=1), axis=0))
    assert battles.num_battles / (num_pairs * 15) == pytest.approx(p, abs=0.01)
  # The judging draw is its own stream: a lower p keeps a subset of the same battles.
  full = simulate.simulate(dataclasses.replace(spec, judge_probability=1.0), seed=0)
  assert full.num_battles > default_set.num_battles > sim.num_battles


def test_weak_reviewers_agree_less_only_when_the_assumption_holds(default_set):
  default = agreement_with_ability(default_set)
  violated_set = simulate.simulate(simulate.SimulationSpec(family="violated"), seed=0)
  violated = agreement_with_ability(violated_set)
  default_gap = default[:5].mean() - default[-5:].mean()
  violated_gap = violated[:5].mean() - violated[-5:].mean()
  assert default_gap > 0.04
  # Under `violated` only self-preference favours strong reviewers (their own answer is usually
  # the better one): a small gap remains.
  assert abs(violated_gap) < 0.03 and default_gap > violated_gap + 0.03
  noise = simulate.SimulationSpec().reviewer_noise()
  assert np.all(np.diff(noise) > 0)
  assert noise[-1] == pytest.approx(6 * noise[0])
  np.testing.assert_allclose(simulate.SimulationSpec(family="violated").reviewer_noise(),
                             noise.mean())
  # Same pairs and answers for both families (common random numbers).
  np.testing.assert_array_equal(violated_set.model_a, default_set.model_a)


def test_calibration_reaches_the_real_rates():
  real = data.disagreement_rate()
  bias, sigma = simulate.calibrate_top_reviewer(real)
  spec = simulate.SimulationSpec()
  # The shipped defaults are this fit.
  assert bias == pytest.approx(spec.position_bias, abs=0.005)
  assert sigma == pytest.approx(spec.sigma_top, abs=0.005)
  assert bias == simulate.calibrate_top_reviewer(real)[0]  # deterministic
  fitted = dataclasses.replace(spec, position_bias=bias, sigma_top=sigma)
  for seed in (0, 1):
    rates = simulate.simulated_rates(fitted, seed=seed, reviewer=0)
    assert rates["disagree"] == pytest.approx(real["disagree"], abs=0.03)
    assert rates["first_position"] == pytest.approx(real["first_position"], abs=0.03)
  # Another target moves the fit: more contradictions need a stronger position bias.
  stronger, _ = simulate.calibrate_top_reviewer({"disagree": 0.6, "first_position": 0.55})
  assert stronger > bias


def test_bad_specs_raise():
  with pytest.raises(ValueError, match="family"):
    simulate.SimulationSpec(family="strict")
  with pytest.raises(ValueError, match="opponents"):
    simulate.SimulationSpec(opponents=15)
  with pytest.raises(ValueError, match="judge_probability"):
    simulate.SimulationSpec(judge_probability=0.0)
  with pytest.raises(ValueError, match="reviewer"):
    simulate.simulated_rates(simulate.SimulationSpec(num_questions=2), seed=0, reviewer=15)
