"""sg_unlearn auditor: the attacker's optimum, its implicit gradient, batched solves, folds."""
import math

import jax
import jax.numpy as jnp
import numpy as np
from sklearn import linear_model
from sklearn import model_selection

from jaxlab.methods.sg_unlearn import auditor

L2 = 0.05


def membership_data(n, f, seed, shift=0.8):
  """Scores [n, f] whose members are shifted by `shift`, members [n] and their +-1 labels."""
  rng = np.random.default_rng(seed)
  members = rng.random(n) < 0.5
  scores = rng.normal(size=(n, f)) + shift * members[:, None]
  return scores, members, np.where(members, 1.0, -1.0)


def two_class_masks(n, seed):
  """Classes 0/1 alternating, so each (class, fold) attacker sees both labels (asserted)."""
  _, members, _ = membership_data(n, 1, seed)
  classes = np.arange(n) % 2
  train, test = auditor.fold_masks(classes, members, num_classes=2, seed=seed)
  assert train.sum(axis=2).min() > 0 and test.sum(axis=2).min() > 0
  return train, test


def attacker_logits(params, scores):
  return np.asarray(auditor.attacker_features(jnp.asarray(scores)) @ params)


def test_optimum_is_stationary_and_matches_sklearn():
  scores, members, labels = membership_data(80, 3, seed=0)
  mask = np.random.default_rng(1).random(80) < 0.6
  with jax.enable_x64(True):
    fit = jax.jit(lambda x, y, w, bias_l2: auditor.fit_attacker(
        x, y, w, l2=L2, newton_steps=25, bias_l2=bias_l2))
    for bias_l2 in (0.0, auditor.BIAS_L2):
      params = fit(scores, labels, mask.astype(np.float64), bias_l2)
      gradient = jax.grad(auditor.attacker_objective)(params, jnp.asarray(scores), labels,
                                                      mask.astype(np.float64), l2=L2,
                                                      bias_l2=bias_l2)
      np.testing.assert_allclose(gradient, 0.0, atol=1e-13)
  # With an unpenalised bias the objective is sklearn's (times C): C = 1 / (l2 * n_fitted).
  reference = linear_model.LogisticRegression(C=1.0 / (L2 * mask.sum()), tol=1e-12,
                                              solver="newton-cholesky", max_iter=100)
  reference.fit(scores[mask], members[mask])
  with jax.enable_x64(True):
    params = np.asarray(fit(scores, labels, mask.astype(np.float64), 0.0))
  np.testing.assert_allclose(params[:-1], reference.coef_[0], rtol=1e-7)
  np.testing.assert_allclose(params[-1], reference.intercept_[0], rtol=1e-7)


def test_damping_converges_where_plain_newton_diverges():
  # Five samples whose magnitudes span 0.1..100 and a weak penalty: plain Newton from zero
  # diverges here (its iterates reach |w| ~ 1e3 with the gradient still ~10); the damped
  # iteration must reach the stationary point.
  rng = np.random.default_rng(899)
  n, f = int(rng.integers(2, 8)), int(rng.integers(1, 3))
  scores = rng.normal(size=(n, f)) * 10**rng.uniform(-1, 2, size=(n, 1))
  labels = np.where(rng.random(n) < 0.5, 1.0, -1.0)
  l2 = float(10**rng.uniform(-6, -1))
  with jax.enable_x64(True):
    params = auditor.fit_attacker(scores, labels, jnp.ones(n), l2=l2, newton_steps=40)
    gradient = jax.grad(auditor.attacker_objective)(params, jnp.asarray(scores), labels,
                                                    jnp.ones(n), l2=l2)
  np.testing.assert_allclose(gradient, 0.0, atol=1e-12)
  assert np.abs(np.asarray(params)).max() < 20


def test_utility_gradient_matches_central_differences():
  scores, _, labels = membership_data(20, 2, seed=3)
  train, test = two_class_masks(20, seed=3)
  with jax.enable_x64(True):
    utility = jax.jit(lambda x: auditor.attacker_utility(x, labels, train, test, l2=L2,
                                                         newton_steps=30))
    gradient = np.asarray(jax.grad(utility)(scores))
    eps = 1e-6
    for i, j in [(0, 0), (3, 1), (7, 0), (12, 1), (16, 0), (19, 1)]:
      bump = np.zeros_like(scores)
      bump[i, j] = eps
      central = (float(utility(scores + bump)) - float(utility(scores - bump))) / (2 * eps)
      np.testing.assert_allclose(gradient[i, j], central, rtol=1e-5, atol=1e-10)
  assert np.abs(gradient).max() > 1e-3


def test_gradient_is_implicit_not_unrolled():
  scores, _, labels = membership_data(20, 2, seed=4)
  train_mask = np.arange(20) < 14
  test_mask = (~train_mask).astype(np.float64)
  with jax.enable_x64(True):
    weights = jnp.asarray(train_mask, jnp.float64)

    def held_out_loss(params, x):
      margins = labels * (auditor.attacker_features(x) @ params)
      return jnp.sum(test_mask * jax.nn.softplus(-margins))

    def loss_at_optimum(x, steps):
      return held_out_loss(auditor.fit_attacker(x, labels, weights, l2=L2, newton_steps=steps), x)

    # A traced step count makes the Newton loop a while_loop, which reverse mode cannot
    # differentiate: that grad works at all means nothing backpropagates through the solve.
    grad = jax.jit(jax.grad(loss_at_optimum))
    np.testing.assert_allclose(grad(scores, 10), grad(scores, 30), rtol=1e-12, atol=1e-15)

    # After one Newton step w1 is not optimal. custom_root still applies the implicit function
    # theorem at w1: dL/dx = d_x L(w1, x) - d_x <optimality(w1, x), H(w1)^-1 d_w L(w1, x)>.
    @jax.jit
    def implicit_formula_and_unrolled(x):
      w1 = jax.lax.stop_gradient(auditor.fit_attacker(x, labels, weights, l2=L2, newton_steps=1))
      optimality = lambda w, x: jax.grad(auditor.attacker_objective)(w, x, labels, weights, l2=L2)
      adjoint = jnp.linalg.solve(jax.jacobian(optimality)(w1, x),
                                 jax.grad(held_out_loss)(w1, x))
      implicit = (jax.grad(held_out_loss, argnums=1)(w1, x)
                  - jax.grad(lambda x: optimality(w1, x) @ adjoint)(x))
      penalty = jnp.asarray([L2, L2, auditor.BIAS_L2])
      newton = auditor._newton_solve  # pylint: disable=protected-access
      unrolled = jax.grad(lambda x: held_out_loss(
          newton(auditor.attacker_features(x), labels, weights, penalty, 1), x))(x)
      return implicit, unrolled, optimality(w1, x)

    implicit, unrolled, residual = implicit_formula_and_unrolled(scores)
    assert np.abs(np.asarray(residual)).max() > 1e-4  # w1 really is not converged
    np.testing.assert_allclose(grad(scores, 1), implicit, rtol=1e-10, atol=1e-14)
    # Backpropagating through that one step gives something else, so the check above can fail.
    assert np.abs(np.asarray(unrolled - implicit)).max() > 1e-6


def test_vmapped_fits_equal_a_loop_over_classes_and_folds():
  scores, _, labels = membership_data(30, 2, seed=5)
  train, test = two_class_masks(30, seed=5)
  with jax.enable_x64(True):
    batched = np.asarray(auditor.fit_attackers(scores, labels, train, l2=L2, newton_steps=20))
    fit_one = jax.jit(lambda w: auditor.fit_attacker(scores, labels, w, l2=L2, newton_steps=20))
    looped = np.stack([np.stack([np.asarray(fit_one(train[c, k])) for k in range(3)])
                       for c in range(2)])
    np.testing.assert_allclose(batched, looped, rtol=1e-8, atol=1e-12)
    # The utility is minus the held-out log-loss of those attackers, over N.
    held_out = sum(np.sum(test[c, k] * np.logaddexp(0.0, -labels * attacker_logits(
        looped[c, k], scores))) for c in range(2) for k in range(3))
    utility = auditor.attacker_utility(scores, labels, train, test, l2=L2, newton_steps=20)
    np.testing.assert_allclose(utility, -held_out / 30, rtol=1e-8)
  assert len({tuple(np.round(p, 6)) for p in looped.reshape(6, 3)}) == 6  # distinct problems


def test_fold_masks():
  rng = np.random.default_rng(6)
  # Classes 0-3 with both labels, class 4 all members, class 5 a single sample, class 6 absent.
  classes = np.concatenate([np.repeat(np.arange(4), 40), np.full(12, 4), [5]])
  members = np.concatenate([rng.random(160) < 0.5, np.ones(12, bool), [False]])
  order = rng.permutation(len(classes))
  classes, members = classes[order], members[order]
  train, test = auditor.fold_masks(classes, members, num_classes=7, seed=7)
  assert train.shape == test.shape == (7, 3, len(classes))
  assert train.dtype == test.dtype == np.float32
  assert set(np.unique(train)) | set(np.unique(test)) <= {0.0, 1.0}
  assert np.all(train + test <= 1.0)
  assert np.all(train.sum(axis=0) + test.sum(axis=0) <= 1.0)  # one class row per sample
  for c in range(7):
    assert np.all(train[c][:, classes != c] == 0) and np.all(test[c][:, classes != c] == 0)
  for c in (4, 5, 6):  # one label only, fewer than 2 samples, no samples
    assert train[c].sum() == 0 and test[c].sum() == 0
  for c in range(4):
    in_class = classes == c
    np.testing.assert_array_equal((train[c] + test[c])[:, in_class], 1.0)
    held_out = test[c].sum(axis=1) / in_class.sum()
    np.testing.assert_allclose(held_out, 0.3, atol=0.05)
  # Over the samples that can be stratified, each fold holds out ceil(0.3 n) (sklearn's rule)
  # and the folds are sklearn's, drawn over those samples.
  kept = np.flatnonzero(classes != 5)
  folds = model_selection.StratifiedShuffleSplit(3, test_size=0.3, random_state=7).split(
      kept, classes[kept])
  for k, (_, test_part) in enumerate(folds):
    assert len(test_part) == math.ceil(0.3 * len(kept))
    in_valid_class = kept[test_part][classes[kept[test_part]] < 4]
    np.testing.assert_array_equal(np.flatnonzero(test[:, k].sum(axis=0)), np.sort(in_valid_class))


def test_samples_masked_everywhere_do_not_change_the_utility():
  scores, members, labels = membership_data(24, 2, seed=8)
  classes = np.arange(24) % 2
  classes[[5, 11]] = 2  # a class with both labels is still stratified; make it one label only
  members[[5, 11]] = True
  labels = np.where(members, 1.0, -1.0)
  classes[17] = 3  # a single-sample class
  train, test = auditor.fold_masks(classes, members, num_classes=4, seed=8)
  unused = np.flatnonzero((train + test).sum(axis=(0, 1)) == 0)
  np.testing.assert_array_equal(unused, [5, 11, 17])
  assert test.sum() > 0
  with jax.enable_x64(True):
    utility = jax.jit(lambda x: auditor.attacker_utility(x, labels, train, test, l2=L2,
                                                         newton_steps=20))
    moved = scores.copy()
    moved[unused] = np.random.default_rng(9).normal(size=(3, 2)) * 50.0
    np.testing.assert_allclose(utility(moved), utility(scores), rtol=1e-13)
    np.testing.assert_array_equal(np.asarray(jax.grad(utility)(scores))[unused], 0.0)


def test_fold_masks_with_a_single_attacker_keep_the_class_stratified_folds():
  classes = np.repeat(np.arange(5), 30)
  members = classes == 2
  per_class_train, per_class_test = auditor.fold_masks(classes, members, num_classes=5, seed=1)
  train, test = auditor.fold_masks(classes, members, num_classes=5, seed=1, per_class=False)
  assert train.shape == test.shape == (1, 3, len(classes))
  # Per class, no class holds both labels, so every attacker is void; the single one is not,
  # and it sees the same folds.
  assert per_class_train.sum() == 0 and per_class_test.sum() == 0
  folds = model_selection.StratifiedShuffleSplit(3, test_size=0.3, random_state=1).split(
      classes, classes)
  for k, (train_part, test_part) in enumerate(folds):
    np.testing.assert_array_equal(np.flatnonzero(train[0, k]), np.sort(train_part))
    np.testing.assert_array_equal(np.flatnonzero(test[0, k]), np.sort(test_part))
