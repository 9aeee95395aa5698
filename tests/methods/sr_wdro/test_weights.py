"""SR-WDRO's KL worst-case weights: the bisection against cvxpy's exponential-cone optimum."""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.sr_wdro import weights

RADII = (0.05, 0.1, 0.3, 1.0)
# KL(u || p) is measured in float64 from the float32 weights, which sum to 1 only to ~B * eps / 2;
# a total of 1 - delta raises the measured KL by delta (seen: up to 1.2e-7), hence this absolute
# slack on top of the relative one.
KL_ABSOLUTE_SLACK = 1e-6
KL_RELATIVE_SLACK = 1e-4
OBJECTIVE_RELATIVE_TOLERANCE = 1e-5

jitted_weights = jax.jit(weights.kl_worst_case_weights)


def cross_entropy_like(num_examples: int, seed: int) -> np.ndarray:
  """Per-example losses shaped like a batch's cross-entropies: many small, a heavy right tail."""
  rng = np.random.default_rng(seed)
  return rng.gamma(0.7, 1.2, num_examples).astype(np.float32)


def kl_in_float64(p) -> float:
  p = np.asarray(p, np.float64)
  return float(-np.mean(np.log(len(p) * p)))


def assert_matches_reference(losses: np.ndarray, r: float):
  p = np.asarray(jitted_weights(losses, r))
  assert np.all(np.isfinite(p)) and np.all(p > 0)
  np.testing.assert_allclose(p.sum(), 1.0, atol=1e-6)
  reference = weights.cvxpy_reference_weights(losses, r)
  losses64 = losses.astype(np.float64)
  optimum = reference @ losses64
  assert p @ losses64 == pytest.approx(optimum, rel=OBJECTIVE_RELATIVE_TOLERANCE)
  assert kl_in_float64(p) <= r * (1 + KL_RELATIVE_SLACK) + KL_ABSOLUTE_SLACK
  return p


@pytest.mark.parametrize("num_examples", [8, 32, 128])
def test_objective_and_constraint_match_cvxpy(num_examples):
  for seed in range(3):
    losses = cross_entropy_like(num_examples, seed)
    for r in RADII:
      assert_matches_reference(losses, r)


def test_exponential_losses_and_a_wide_range_of_radii_match_cvxpy():
  losses = np.random.default_rng(7).exponential(0.5, 64).astype(np.float32)
  for r in (1e-4, 3.0, 10.0):
    assert_matches_reference(losses, r)


def test_zero_radius_and_equal_losses_give_exactly_uniform_weights():
  losses = cross_entropy_like(16, 0)
  uniform = np.full(16, 1 / 16, np.float32)
  np.testing.assert_array_equal(jitted_weights(losses, 0.0), uniform)
  np.testing.assert_array_equal(jitted_weights(np.full(16, 2.5, np.float32), 0.3), uniform)
  np.testing.assert_array_equal(jitted_weights(np.zeros(16, np.float32), 0.3), uniform)


def test_kl_from_uniform():
  assert float(weights.kl_from_uniform(jnp.full(8, 1 / 8))) == pytest.approx(0.0, abs=1e-7)
  p = jnp.asarray([0.5, 0.25, 0.25])
  expected = -np.mean(np.log(3 * np.asarray([0.5, 0.25, 0.25])))
  assert float(weights.kl_from_uniform(p)) == pytest.approx(expected, rel=1e-6)
  batch = jnp.stack([p, jnp.full(3, 1 / 3)])
  assert weights.kl_from_uniform(batch).shape == (2,)


def test_no_gradient_flows_through_the_weights():
  losses = jnp.asarray(cross_entropy_like(32, 1))
  r = 0.3
  weighted_loss = lambda l: jnp.sum(weights.kl_worst_case_weights(l, r) * l)
  gradient = jax.jit(jax.grad(weighted_loss))(losses)
  np.testing.assert_array_equal(gradient, jitted_weights(losses, r))
  # Nor through the radius.
  radius_gradient = jax.grad(lambda r: jnp.sum(weights.kl_worst_case_weights(losses, r) * losses))
  assert float(radius_gradient(0.3)) == 0.0


def test_ties_at_the_top_share_their_weight_and_match_cvxpy():
  losses = cross_entropy_like(16, 2)
  losses[[3, 7, 11]] = losses.max() + 0.5
  losses[[0, 1]] = losses[5]
  for r in (0.1, 1.0):
    p = assert_matches_reference(losses, r)
    np.testing.assert_allclose(p[[3, 7, 11]], p[3], rtol=1e-6)
    np.testing.assert_allclose(p[[0, 1, 5]], p[5], rtol=1e-6)


def test_one_huge_outlier_stays_finite_and_matches_cvxpy():
  losses = cross_entropy_like(32, 3)
  losses[10] = 1e4 * losses.max()
  for r in RADII:
    p = assert_matches_reference(losses, r)
    assert np.argmax(p) == 10


def test_tiny_spreads_stay_finite_and_normalised():
  noise = np.random.default_rng(4).standard_normal(32)
  for scale in (1e-7, 1e-6, 1e-5):
    losses = (2.0 + scale * noise).astype(np.float32)
    for r in RADII:
      p = np.asarray(jitted_weights(losses, r))
      assert np.all(np.isfinite(p)) and np.all(p > 0), (scale, r)
      np.testing.assert_allclose(p.sum(), 1.0, atol=1e-6)
      assert kl_in_float64(p) <= r * (1 + KL_RELATIVE_SLACK) + KL_ABSOLUTE_SLACK
      if scale >= 1e-6:  # several ulps of 2.0 apart: a real ranking, so not uniform
        assert np.argmax(p) == np.argmax(losses) and p.max() > 1.5 / 32


def test_jit_and_vmap_over_losses_and_radii_agree_with_a_loop():
  batch = np.stack([cross_entropy_like(24, seed) for seed in range(4)])
  radii = np.asarray([0.0, 0.05, 0.3, 1.0], np.float32)
  looped = np.stack([weights.kl_worst_case_weights(l, r) for l, r in zip(batch, radii)])
  np.testing.assert_allclose(jax.vmap(weights.kl_worst_case_weights)(batch, radii), looped,
                             rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(jax.jit(jax.vmap(weights.kl_worst_case_weights))(batch, radii),
                             looped, rtol=1e-6, atol=1e-9)
  over_radii = jax.jit(jax.vmap(weights.kl_worst_case_weights, in_axes=(None, 0)))(batch[1], radii)
  for r, p in zip(radii, over_radii):
    np.testing.assert_allclose(p, jitted_weights(batch[1], r), rtol=1e-6, atol=1e-9)


def test_larger_radius_weights_the_largest_loss_more():
  losses = cross_entropy_like(32, 5)
  radii = np.asarray([0.0, 0.01, 0.05, 0.1, 0.3, 1.0, 3.0], np.float32)
  p = np.asarray(jax.vmap(weights.kl_worst_case_weights, in_axes=(None, 0))(losses, radii))
  top_weight = p[:, np.argmax(losses)]
  objective = p @ losses.astype(np.float64)
  assert np.all(np.diff(top_weight) > 0) and np.all(np.diff(objective) > 0)
  kl = [kl_in_float64(row) for row in p]
  np.testing.assert_allclose(kl[1:], radii[1:], rtol=1e-4)


def test_reference_names_cvxpy_as_a_test_dependency(monkeypatch):
  monkeypatch.setitem(sys.modules, "cvxpy", None)  # makes `import cvxpy` raise ImportError
  with pytest.raises(ImportError, match="test-only dependency"):
    weights.cvxpy_reference_weights(np.ones(4), 0.1)
