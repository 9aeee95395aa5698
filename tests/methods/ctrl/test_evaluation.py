"""CTRL's evaluation numbers against closed forms and constructed cases."""
import numpy as np
import pytest
from scipy import special

from jaxlab.methods.ctrl import evaluation


def test_frechet_distance_of_two_gaussians_is_the_closed_form():
  rng = np.random.default_rng(0)
  a = rng.normal(size=(200_000, 2)) * [1.0, 2.0]
  b = rng.normal(size=(200_000, 2)) * [2.0, 1.0] + [1.0, 0.0]
  # |dmu|^2 + sum (s_a - s_b)^2 for diagonal covariances: 1 + (1 - 2)^2 + (2 - 1)^2 = 3.
  assert evaluation.frechet_distance(a, b) == pytest.approx(3.0, rel=0.02)
  assert evaluation.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)


def test_energy_distance_is_zero_for_one_law_and_positive_for_two():
  rng = np.random.default_rng(1)
  same = evaluation.energy_distance(rng.normal(size=(1500, 2)), rng.normal(size=(1500, 2)))
  shifted = evaluation.energy_distance(rng.normal(size=(1500, 2)),
                                       rng.normal(size=(1500, 2)) + 1.0)
  assert abs(same) < 0.02 and shifted > 0.5


def test_macro_f1_and_binomial_se():
  assert evaluation.macro_f1(np.array([0, 1, 1, 2]), np.array([0, 1, 2, 2]), 3) == pytest.approx(
      np.mean([1.0, 2 / 3, 2 / 3]))
  assert evaluation.binomial_se(0.5, 100) == pytest.approx(0.05)


def test_temperature_scaling_recovers_the_temperature_and_fixes_calibration():
  rng = np.random.default_rng(2)
  true_logits = rng.normal(size=(20_000, 5)) * 2.0
  probs = special.softmax(true_logits, -1)
  labels = np.array([rng.choice(5, p=p) for p in probs])
  overconfident = 3.0 * true_logits
  temperature = evaluation.fit_temperature(overconfident, labels)
  assert temperature == pytest.approx(3.0, rel=0.05)
  raw = evaluation.expected_calibration_error(special.softmax(overconfident, -1), labels)
  scaled = evaluation.expected_calibration_error(
      special.softmax(overconfident / temperature, -1), labels)
  assert scaled < 0.02 < raw
