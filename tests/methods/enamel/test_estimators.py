"""ENAMEL eff@k / pass@k: binomial closed forms, brute force over k-subsets, exact rationals, enam."""
import fractions
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.enamel import estimators


def random_efficiencies(rng, num_problems, num_samples):
  """[P, n] efficiencies like ENAMEL's: about a third failed (0), the rest spread over (0, 2)."""
  values = rng.uniform(0.0, 2.0, size=(num_problems, num_samples))
  return np.where(rng.uniform(size=values.shape) < 0.3, 0.0, values)


def brute_force_eff_at_k(row, k):
  """Mean over all k-subsets of the subset maximum."""
  maxima = [max(subset) for subset in itertools.combinations(row, k)]
  return math.fsum(maxima) / len(maxima)


def brute_force_pass_at_k(num_correct, num_samples, k):
  """Fraction of k-subsets of n samples (the first c correct) holding a correct one."""
  subsets = list(itertools.combinations(range(num_samples), k))
  return sum(any(i < num_correct for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n, k", [(1, 1), (5, 1), (5, 3), (5, 5), (12, 4), (40, 10), (200, 100)])
def test_eff_weights_are_the_binomial_ratios_and_sum_to_one(n, k):
  weights = estimators.eff_weights(n, k)
  assert weights.shape == (n,) and weights.dtype == jnp.float64
  expected = [math.comb(r - 1, k - 1) / math.comb(n, k) for r in range(1, n + 1)]
  np.testing.assert_allclose(np.asarray(weights), expected, rtol=1e-12, atol=1e-300)
  assert np.all(np.asarray(weights)[:k - 1] == 0.0)
  np.testing.assert_allclose(math.fsum(np.asarray(weights)), 1.0, rtol=1e-13)


@pytest.mark.parametrize("seed", range(4))
def test_eff_at_k_equals_brute_force_over_all_subsets(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 9))
  efficiencies = random_efficiencies(rng, 6, n)
  efficiencies[0, : n // 2] = efficiencies[0, -1]  # ties must not matter
  for k in range(1, n + 1):
    got = np.asarray(estimators.eff_at_k(efficiencies, k))
    expected = [brute_force_eff_at_k(row, k) for row in efficiencies]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_eff_at_k_does_not_depend_on_sample_order():
  rng = np.random.default_rng(7)
  efficiencies = random_efficiencies(rng, 5, 9)
  shuffled = rng.permuted(efficiencies, axis=1)
  for k in (1, 4, 9):
    np.testing.assert_array_equal(np.asarray(estimators.eff_at_k(efficiencies, k)),
                                  np.asarray(estimators.eff_at_k(shuffled, k)))


def test_eff_at_1_is_the_mean_and_eff_at_n_the_max():
  rng = np.random.default_rng(1)
  efficiencies = random_efficiencies(rng, 7, 25)
  np.testing.assert_allclose(np.asarray(estimators.eff_at_k(efficiencies, 1)),
                             efficiencies.mean(axis=1), rtol=1e-14)
  np.testing.assert_allclose(np.asarray(estimators.eff_at_k(efficiencies, 25)),
                             efficiencies.max(axis=1), rtol=1e-14)


def test_eff_at_k_grows_with_k():
  rng = np.random.default_rng(2)
  efficiencies = random_efficiencies(rng, 4, 30)
  scores = np.stack([np.asarray(estimators.eff_at_k(efficiencies, k)) for k in range(1, 31)])
  assert np.all(np.diff(scores, axis=0) >= -1e-15)


@pytest.mark.parametrize("n", [1, 3, 6, 8])
def test_pass_at_k_equals_brute_force_and_closed_form(n):
  num_correct = np.arange(n + 1)  # every c from 0 to n, so c = 0, c = n and n - c < k appear
  for k in range(1, n + 1):
    got = np.asarray(estimators.pass_at_k(num_correct, n, k))
    assert got.dtype == np.float64
    brute = [brute_force_pass_at_k(c, n, k) for c in num_correct]
    closed = [1 - math.comb(n - c, k) / math.comb(n, k) for c in num_correct]
    np.testing.assert_allclose(got, brute, rtol=0, atol=1e-13)
    np.testing.assert_allclose(got, closed, rtol=0, atol=1e-13)


def test_pass_at_k_edge_cases():
  n = 10
  assert np.asarray(estimators.pass_at_k(np.array([0]), n, 3))[0] == 0.0
  assert np.asarray(estimators.pass_at_k(np.array([n]), n, 3))[0] == 1.0
  # n - c = 2 < k = 3: every 3-subset holds a correct sample.
  assert np.asarray(estimators.pass_at_k(np.array([8]), n, 3))[0] == 1.0
  # n - c = k: exactly one subset (all wrong samples) misses.
  np.testing.assert_allclose(np.asarray(estimators.pass_at_k(np.array([7]), n, 3))[0],
                             1 - 1 / math.comb(10, 3), rtol=1e-15)
  np.testing.assert_allclose(np.asarray(estimators.pass_at_k(np.array([3]), n, 1))[0], 0.3,
                             rtol=1e-15)


def test_large_n_pass_at_k_matches_closed_form():
  n = 200
  num_correct = np.array([0, 1, 5, 50, 150, 190, 199, 200])
  for k in (1, 10, 100):
    closed = [1 - fractions.Fraction(math.comb(n - c, k), math.comb(n, k)) for c in num_correct]
    np.testing.assert_allclose(np.asarray(estimators.pass_at_k(num_correct, n, k)),
                               [float(value) for value in closed], rtol=0, atol=1e-13)


def test_float64_agrees_with_exact_rational_arithmetic():
  n, k = 100, 10
  rng = np.random.default_rng(3)
  efficiencies = random_efficiencies(rng, 3, n)
  # Called from ordinary (float32) code: the result must still be float64-accurate.
  assert not jax.config.jax_enable_x64
  got = estimators.eff_at_k(efficiencies, k)
  assert got.dtype == jnp.float64
  total = math.comb(n, k)
  for row, value in zip(efficiencies, np.asarray(got)):
    ascending = sorted(fractions.Fraction(float(e)) for e in row)
    exact = sum(fractions.Fraction(math.comb(r - 1, k - 1), total) * ascending[r - 1]
                for r in range(k, n + 1))
    assert abs(fractions.Fraction(float(value)) - exact) < 1e-13
  # Differences far below float32 resolution survive: only float64 can resolve 1 + 1e-12.
  tiny = np.full((1, n), 1.0)
  tiny[0, -1] = 1.0 + 1e-12
  assert np.asarray(estimators.eff_at_k(tiny, k))[0] - 1.0 == pytest.approx(k / n * 1e-12,
                                                                             rel=1e-2)


def test_works_when_the_caller_already_enabled_x64():
  rng = np.random.default_rng(4)
  efficiencies = random_efficiencies(rng, 3, 20)
  outside = np.asarray(estimators.eff_at_k(efficiencies, 5))
  with jax.enable_x64(True):
    inside = estimators.eff_at_k(jnp.asarray(efficiencies), 5)
    assert inside.dtype == jnp.float64
  np.testing.assert_array_equal(outside, np.asarray(inside))


def test_eff_at_k_accepts_a_float32_jax_array():
  rng = np.random.default_rng(5)
  efficiencies32 = jnp.asarray(random_efficiencies(rng, 2, 6), dtype=jnp.float32)
  got = estimators.eff_at_k(efficiencies32, 3)
  assert got.dtype == jnp.float64
  expected = [brute_force_eff_at_k(row, 3) for row in np.asarray(efficiencies32, np.float64)]
  np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-12)


def test_ks_to_report_keeps_the_ks_that_fit():
  assert estimators.ks_to_report(200) == [1, 10, 100]
  assert estimators.ks_to_report(100) == [1, 10, 100]
  assert estimators.ks_to_report(50) == [1, 10]
  assert estimators.ks_to_report(1) == [1]
  assert estimators.ks_to_report(20, ks=(5, 1, 30)) == [5, 1]


@pytest.mark.parametrize("call, message", [
    (lambda: estimators.eff_at_k(np.ones(5), 1), "2-D"),
    (lambda: estimators.eff_at_k(np.ones((2, 3, 4)), 1), "2-D"),
    (lambda: estimators.eff_at_k(np.ones((2, 5)), 0), "k must be >= 1"),
    (lambda: estimators.eff_at_k(np.ones((2, 5)), 6), "k must be <= the number of samples"),
    (lambda: estimators.eff_at_k(np.ones((2, 5)), 2.5), "k must be an integer"),
    (lambda: estimators.eff_at_k(np.array([[1.0, -0.1]]), 1), "must be >= 0"),
    (lambda: estimators.eff_at_k(np.array([[1.0, np.nan]]), 1), "finite"),
    (lambda: estimators.eff_weights(5, 0), "k must be >= 1"),
    (lambda: estimators.eff_weights(5, 6), "k must be <= the number of samples"),
    (lambda: estimators.pass_at_k(np.array([[1]]), 5, 1), "1-D"),
    (lambda: estimators.pass_at_k(np.array([1]), 5, 0), "k must be >= 1"),
    (lambda: estimators.pass_at_k(np.array([1]), 5, 6), "k must be <= the number of samples"),
    (lambda: estimators.pass_at_k(np.array([6]), 5, 1), r"in \[0, num_samples=5\]"),
    (lambda: estimators.pass_at_k(np.array([-1]), 5, 1), r"in \[0, num_samples=5\]"),
    (lambda: estimators.pass_at_k(np.array([1.5]), 5, 1), "whole-number"),
    (lambda: estimators.ks_to_report(0), "num_samples must be >= 1"),
    (lambda: estimators.ks_to_report(10, ks=(0, 1)), "every k must be >= 1"),
])
def test_invalid_input_raises_a_clear_error(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_agrees_with_the_official_enam_package():
  enam_evaluate = pytest.importorskip("enam.evaluate")
  calc_eff_at_k = enam_evaluate.calc_eff_at_k  # (e, k): one problem's efficiencies -> eff@k
  calc_pass_at_k = enam_evaluate.calc_pass_at_k  # (n, c, k) -> pass@k
  rng = np.random.default_rng(6)
  for n, ks in [(1, (1,)), (7, (1, 3, 7)), (20, (1, 5, 10, 20)), (100, (1, 10, 100)),
                (200, (1, 10, 100, 200))]:
    efficiencies = random_efficiencies(rng, 5, n)
    num_correct = rng.integers(0, n + 1, size=8)
    num_correct[:2] = (0, n)
    for k in ks:
      official_eff = [float(calc_eff_at_k(row.copy(), k)) for row in efficiencies]
      np.testing.assert_allclose(np.asarray(estimators.eff_at_k(efficiencies, k)), official_eff,
                                 rtol=0, atol=1e-10)
      official_pass = [float(calc_pass_at_k(n, int(c), k)) for c in num_correct]
      np.testing.assert_allclose(np.asarray(estimators.pass_at_k(num_correct, n, k)),
                                 official_pass, rtol=0, atol=1e-10)
