"""flow_mi tails diagnostic: a few joint outliers decide Pearson, not Spearman."""
import numpy as np

from jaxlab.methods.flow_mi import tails


def test_joint_outliers_make_a_correlation_that_ranks_do_not_see():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(1000, 1)), rng.normal(size=(1000, 1))
  x[:3], y[:3] = 200.0, 200.0      # three jointly extreme pairs, as a shared chi-square scale makes
  profile = tails.dependence_profile(x[:500], y[:500], x[500:], y[500:])
  assert profile["pearson"] > 0.9
  assert abs(profile["spearman"]) < 0.1
  assert profile["extreme_share"] > 0.9
  # The outliers are in the first (train) half: only that half's Gaussian MI is inflated.
  assert profile["gaussian_mi_train_half"] > 1.0 > 0.01 > profile["gaussian_mi_test_half"]


def test_gaussian_mi_matches_the_closed_form_of_a_correlated_gaussian():
  rng = np.random.default_rng(1)
  rho = 0.8
  z = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=200_000)
  np.testing.assert_allclose(tails._gaussian_mi(z[:, :1], z[:, 1:]),
                             -0.5 * np.log(1 - rho ** 2), rtol=0.02)
