"""flow_mi estimators: closed forms against brute force, the training loop, the public API."""
import math

import chex
import jax
import jax.numpy as jnp
from jax import test_util as jax_test_util
import numpy as np
import pytest
from scipy import special
from scipy import stats

from jaxlab.core import metrics as metrics_lib
from jaxlab.methods.flow_mi import boed
from jaxlab.methods.flow_mi import bounds
from jaxlab.methods.flow_mi import estimators
from jaxlab.methods.flow_mi import fitting
from jaxlab.methods.flow_mi import gaussian
from jaxlab.methods.flow_mi import ksg
from jaxlab.methods.flow_mi import models
from jaxlab.methods.flow_mi import objectives
from jaxlab.zoo import functional

FAST = dict(num_bins=8, eval_every=50)


def correlated(n, d, rho, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d))
  y = rho * x + math.sqrt(1 - rho**2) * rng.normal(size=(n, d))
  return x, y, -0.5 * d * math.log(1 - rho**2)


def test_gaussian_entropy_and_mi_match_closed_forms():
  with jax.enable_x64(True):
    cov = np.array([[2.0, 0.6, 0.3], [0.6, 1.0, 0.2], [0.3, 0.2, 1.5]])
    expected = stats.multivariate_normal(cov=cov).entropy()
    np.testing.assert_allclose(gaussian.gaussian_entropy(jnp.asarray(cov)), expected, rtol=1e-12)
    rho = 0.7
    joint = np.array([[1.0, rho], [rho, 1.0]])
    np.testing.assert_allclose(gaussian.gaussian_mi_of_covariance(jnp.asarray(joint), 1),
                               -0.5 * math.log(1 - rho**2), rtol=1e-12)


def brute_force_ksg(x, y, k):
  n = len(x)
  total = 0.0
  for i in range(n):
    dx = np.array([np.max(np.abs(x[i] - x[j])) for j in range(n)])
    dy = np.array([np.max(np.abs(y[i] - y[j])) for j in range(n)])
    dz = np.maximum(dx, dy)
    others = [j for j in range(n) if j != i]
    eps = sorted(dz[others])[k - 1]
    nx = sum(1 for j in others if dx[j] < eps)
    ny = sum(1 for j in others if dy[j] < eps)
    total += special.digamma(nx + 1) + special.digamma(ny + 1)
  return special.digamma(k) + special.digamma(n) - total / n


def test_ksg_equals_brute_force():
  x, y, _ = correlated(90, 2, 0.6, seed=3)
  with jax.enable_x64(True):
    ours = float(ksg.ksg(jnp.asarray(x), jnp.asarray(y), k=4, row_block=16))
  np.testing.assert_allclose(ours, brute_force_ksg(x, y, 4), rtol=1e-10)


def test_ksg_counts_tied_neighbours_with_multiplicity():
  x, y, _ = correlated(70, 1, 0.6, seed=4)
  x, y = np.round(x * 2) / 2, np.round(y * 2) / 2
  with jax.enable_x64(True):
    ours = float(ksg.ksg(jnp.asarray(x), jnp.asarray(y), k=3, row_block=32))
  np.testing.assert_allclose(ours, brute_force_ksg(x, y, 3), rtol=1e-10)


def test_critic_bounds_equal_their_definitions_on_a_full_score_matrix():
  with jax.enable_x64(True):
    critic = functional.Functional(lambda rngs: models.PairCritic(2, 3, hidden=(5, 4),
                                                                  rngs=rngs))
    params = critic.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (37, 2), jnp.float64)
    y = jax.random.normal(jax.random.key(2), (37, 3), jnp.float64)
    module = critic.module(params)
    full = np.asarray(jax.vmap(lambda xi: jax.vmap(lambda yj: module(xi, yj))(y))(x))
    np.testing.assert_allclose(np.asarray(module.pairwise(x, y)), full, rtol=1e-12)
    stats_ = bounds.score_statistics(module.pairwise, x, y, row_block=8)
    n = len(full)
    off = full[~np.eye(n, dtype=bool)]
    diag = np.diag(full)
    np.testing.assert_allclose(bounds.infonce(stats_), np.mean(
        diag - special.logsumexp(full, axis=1)) + math.log(n), rtol=1e-10)
    np.testing.assert_allclose(bounds.nwj(stats_), diag.mean() - np.mean(np.exp(off - 1)),
                               rtol=1e-10)
    np.testing.assert_allclose(bounds.donsker_varadhan(stats_),
                               diag.mean() - np.log(np.mean(np.exp(off))), rtol=1e-10)


def test_neural_variational_conditional_log_density_matches_scipy():
  with jax.enable_x64(True):
    model = functional.Functional(lambda rngs: models.NeuralVariational(
        3, 2, use_flow=False, head_hidden=(16, 8), rngs=rngs))
    params = jax.tree.map(lambda p: p + 0.3, model.init(jax.random.key(0)))
    module = model.module(params)
    y = jax.random.normal(jax.random.key(1), (4, 2), jnp.float64)
    u = jax.random.normal(jax.random.key(2), (4, 3), jnp.float64)
    mean, cov = module.conditional(y)
    ours = objectives.gaussian_log_prob(u, mean, cov)
    np.testing.assert_allclose(objectives.factor_log_prob(u, *module.conditional_moments(y)),
                               ours, rtol=1e-10)
    for i in range(4):
      assert np.all(np.linalg.eigvalsh(np.asarray(cov[i])) > 0)
      np.testing.assert_allclose(ours[i], stats.multivariate_normal(
          np.asarray(mean[i]), np.asarray(cov[i])).logpdf(np.asarray(u[i])), rtol=1e-10)


@pytest.mark.parametrize("dim", [1, 4, 7])
def test_factor_log_prob_unrolled_and_lapack_paths_agree_with_scipy(dim):
  # dim 7 takes the LAPACK path, 1 and 4 the unrolled one; gradients are checked against
  # finite differences on the unrolled path.
  with jax.enable_x64(True):
    keys = jax.random.split(jax.random.key(dim), 3)
    rows, cols = np.tril_indices(dim)
    entries = jax.random.normal(keys[0], (3, len(rows)), jnp.float64)
    entries = jnp.where(jnp.asarray(rows == cols), 0.5 + jnp.abs(entries), entries)
    cov = models.covariance_of_factor(entries, dim)
    mean = jax.random.normal(keys[1], (3, dim), jnp.float64)
    u = jax.random.normal(keys[2], (3, dim), jnp.float64)
    ours = objectives.factor_log_prob(u, mean, entries)
    for i in range(3):
      np.testing.assert_allclose(ours[i], stats.multivariate_normal(
          np.asarray(mean[i]), np.asarray(cov[i])).logpdf(np.asarray(u[i])), rtol=1e-10)
    np.testing.assert_allclose(ours, objectives.gaussian_log_prob(u, mean, cov), rtol=1e-10)
    if dim <= objectives.UNROLLED_MAX_DIM:
      jax_test_util.check_grads(lambda u, m, e: objectives.factor_log_prob(u, m, e).sum(),
                                (u, mean, entries), order=1, modes=["rev"])


def test_jvf_at_initialisation_is_jvg_and_its_loss_is_the_gaussian_joint_entropy():
  x, y, _ = correlated(300, 3, 0.8)
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  options = estimators.Options(num_bins=8)
  trainable = estimators.trainable("jvf", 3, 3, options)
  params = trainable.model.init(jax.random.key(0))
  loss, mi = trainable.test_metrics(params, x, y)
  np.testing.assert_allclose(mi, gaussian.gaussian_mi(x, y), rtol=1e-5)
  joint = gaussian.covariance(jnp.concatenate([x, y], axis=1))
  np.testing.assert_allclose(loss, gaussian.gaussian_entropy(joint), rtol=1e-5)


# NWJ, DV and NVG share the loop and the critic / heads tested here and above.
# One estimator in `make test`; the others (about 20 s each) in `make test-all`.
@pytest.mark.parametrize("method", ["jvf", *(pytest.param(m, marks=pytest.mark.slow)
                                             for m in ("nvf", "infonce", "mine"))])
def test_trained_estimators_converge_on_a_gaussian(method):
  x, y, truth = correlated(1200, 1, 0.8, seed=1)
  value = estimators.estimate(x, y, method, seed=0, steps=300, batch_size=128, **FAST)
  assert abs(value - truth) < 0.12, (method, value, truth)


@pytest.mark.parametrize("method", ["jvg", "cca", "ksg"])
def test_closed_form_estimators_on_a_gaussian(method):
  x, y, truth = correlated(2000, 2, 0.8, seed=2)
  assert abs(estimators.estimate(x, y, method) - truth) < 0.08


def test_flows_fix_the_gaussian_bias_under_a_marginal_transform():
  x, y, truth = correlated(4000, 1, 0.9, seed=4)
  x, y = x**3, np.exp(y)
  jvg = estimators.estimate(x, y, "jvg")
  jvf = estimators.estimate(x, y, "jvf", steps=600, **FAST)
  assert abs(jvf - truth) < 0.5 * abs(jvg - truth), (jvf, jvg, truth)


def test_training_chunk_compiles_once_across_chunks_and_resume(tmp_path, monkeypatch):
  traced = chex.assert_max_traces(fitting._one_seed_chunk, n=1)
  monkeypatch.setattr(fitting, "_one_seed_chunk", traced)
  fitting._chunk_function.cache_clear()
  x, y, _ = correlated(600, 2, 0.5)
  options = estimators.Options(num_bins=8, steps=25, eval_every=10, batch_size=64)
  trainable = estimators.trainable("jvf", 2, 2, options)
  data = jax.tree.map(lambda a: jnp.stack([a, a]), estimators.split(
      jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), jax.random.key(0), 0.5, True))
  keys = jax.random.split(jax.random.key(0), 2)
  fitting.fit(trainable, data, keys, options.schedule(), workdir=tmp_path, progress=False)
  longer = estimators.Options(num_bins=8, steps=33, eval_every=10, batch_size=64)
  fitting.fit(trainable, data, keys, longer.schedule(), workdir=tmp_path, progress=False)
  assert estimators.trainable("jvf", 2, 2, longer) is trainable
  fitting._chunk_function.cache_clear()


def test_resumed_fit_matches_an_uninterrupted_one(tmp_path):
  x, y, _ = correlated(600, 2, 0.5)
  data = jax.tree.map(lambda a: a[None], estimators.split(
      jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), jax.random.key(0), 0.5, True))
  keys = jax.random.split(jax.random.key(3), 1)
  full_options = estimators.Options(num_bins=8, steps=20, eval_every=5, batch_size=64)
  trainable = estimators.trainable("nvf", 2, 2, full_options)
  whole = fitting.fit(trainable, data, keys, full_options.schedule(), workdir=tmp_path / "a",
                      progress=False)
  half = fitting.Schedule(steps=10, batch_size=64, eval_every=5, ckpt_every=2500)
  fitting.fit(trainable, data, keys, half, workdir=tmp_path / "b", progress=False)
  resumed = fitting.fit(trainable, data, keys, full_options.schedule(),
                        workdir=tmp_path / "b", progress=False)
  assert [h["step"] for h in resumed.history] == [15, 20]
  np.testing.assert_array_equal(resumed.best_mi, whole.best_mi)
  np.testing.assert_array_equal(resumed.final_mi, whole.final_mi)


def test_non_finite_steps_are_skipped_and_reported():
  x, y, _ = correlated(600, 1, 0.5)
  with pytest.raises(metrics_lib.NonFiniteError, match="no finite held-out estimate"):
    estimators.estimate(x, y, "nwj", steps=20, eval_every=10, critic_lr=1e30)


@pytest.mark.parametrize("x_shape,y_shape,kwargs,message", [
    ((100, 2), (90, 2), {}, "same number of samples"),
    ((600, 2), (600, 2), {"method": "jvff"}, "did you mean 'jvf'"),
    ((600, 2), (600, 2), {"stepz": 3}, "unknown estimator option 'stepz'"),
    ((100, 2), (100, 2), {}, "too few"),
    ((600, 2, 1), (600, 2), {}, r"\[N, dx\]"),
])
def test_estimate_rejects_bad_input(x_shape, y_shape, kwargs, message):
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match=message):
    estimators.estimate(rng.normal(size=x_shape), rng.normal(size=y_shape), **kwargs)


def test_estimate_rejects_nans():
  x = np.random.default_rng(0).normal(size=(600, 2))
  y = x.copy()
  y[3, 1] = np.nan
  with pytest.raises(ValueError, match="y contains 1 NaN"):
    estimators.estimate(x, y, "cca")


def test_boed_oracle_information_gain_prefers_informative_designs():
  model = boed.LocationFinding()
  particles = jax.random.normal(jax.random.key(0), (4000, 2))
  designs = jnp.array([[0.0, 0.0], [30.0, 30.0]])
  gains = boed.oracle_information_gain(model, jax.random.key(1), particles, jnp.zeros(4000),
                                       designs, 2000)
  # Far from every plausible source the signal is the constant background: nothing to learn.
  assert gains[0] > 0.3 and abs(float(gains[1])) < 0.02, gains
  assert boed.candidate_grid(3, 1.0).shape == (9, 2)
  assert boed.spearman(np.array([1, 2, 3]), np.array([10, 20, 30])) == pytest.approx(1.0)
