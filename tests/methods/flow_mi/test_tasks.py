"""The flow_mi benchmark tasks: ground truth, samplers, transforms, and their TFDS builder."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxlab.data import mi_tasks
from jaxlab.data import pipeline
from jaxlab.methods.flow_mi import tasks

# Ground truths published with the bmi benchmark (Czyż et al. 2023) and in the flow_mi notes.
PUBLISHED = {
    "normal-1x1": 0.413, "bimodal-1x1": 0.413, "wiggly-1x1": 0.413, "swissroll-2x1": 0.413,
    "additive-uniform-1x1-0.1": 1.709, "additive-uniform-1x1-0.75": 0.333,
    "dense-2x2": 0.294, "dense-3x3": 0.413, "dense-5x5": 0.593, "dense-25x25": 1.292,
    "sparse-2x2": 1.022, "sparse-3x3": 1.022, "sparse-5x5": 1.022,
    "half-cube-sparse-5x5": 1.022, "normal-cdf-sparse-5x5": 1.022, "spiral-sparse-3x3": 1.022,
    "student-1x1-df1": 0.224, "asinh-student-1x1-df1": 0.224, "student-2x2-df2": 0.193,
    "student-3x3-df2": 0.291, "student-5x5-df2": 0.448,
    "gaussian-5x5-rho0.95": 5.820, "gaussian-10x10-rho0.95": 11.640,
}
MC_SAMPLES = 100_000


def test_published_ground_truth():
  for name, value in PUBLISHED.items():
    assert tasks.get_task(name).mutual_information == pytest.approx(value, abs=5e-4), name
  # More of bmi's Student-t values, through the closed form directly.
  assert tasks.student_t_mi(2, 2, 1) == pytest.approx(0.432, abs=5e-4)
  assert tasks.student_t_mi(3, 3, 3) == pytest.approx(0.179, abs=5e-4)
  assert tasks.student_t_mi(5, 5, 3) == pytest.approx(0.299, abs=5e-4)
  for name in tasks.LARGE_MI_TASKS + tasks.TRANSFORMED_LARGE_MI_TASKS:
    task = tasks.get_task(name)
    rho = float(name.split("rho")[1])
    assert task.mutual_information == pytest.approx(-task.dim_x / 2 * math.log(1 - rho ** 2))


def test_groups_partition_the_registry():
  groups = tasks.BENCHMARK_TASKS + tasks.LARGE_MI_TASKS + tasks.TRANSFORMED_LARGE_MI_TASKS
  assert sorted(groups) == sorted(tasks.TASKS) and len(set(groups)) == len(groups) == 29
  assert all(task.name == name for name, task in tasks.TASKS.items())


def _unit_correlation(dim: int, pairs: dict[tuple[int, int], float]) -> np.ndarray:
  covariance = np.eye(dim)
  for (i, j), value in pairs.items():
    covariance[i, j] = covariance[j, i] = value
  return covariance


def _gaussian_pmi(covariance: np.ndarray, dim_x: int):
  def pmi(x, y):
    logpdf = lambda value, cov: stats.multivariate_normal(np.zeros(len(cov)), cov).logpdf(value)
    return (logpdf(np.concatenate([x, y], 1), covariance)
            - logpdf(x, covariance[:dim_x, :dim_x]) - logpdf(y, covariance[dim_x:, dim_x:]))
  return pmi


def _student_pmi(dim: int, df: int):
  def pmi(x, y):
    logpdf = lambda value: stats.multivariate_t(np.zeros(value.shape[1]), np.eye(value.shape[1]),
                                                df=df).logpdf(value)
    return logpdf(np.concatenate([x, y], 1)) - logpdf(x) - logpdf(y)
  return pmi


def _additive_uniform_pmi(epsilon: float):
  def pmi(x, y):
    # p(y | x) = 1 / (2 eps) on |y - x| < eps; p(y) is the trapezoid (overlap of [y - eps,
    # y + eps] with [0, 1]) / (2 eps): the 1 / (2 eps) cancels.
    y = y[:, 0]
    return -np.log(np.minimum(y + epsilon, 1) - np.maximum(y - epsilon, 0))
  return pmi


# Densities written here independently of the module's own covariance helpers.
POINTWISE_MI = {
    "normal-1x1": _gaussian_pmi(_unit_correlation(2, {(0, 1): 0.75}), 1),
    "dense-3x3": _gaussian_pmi(np.full((6, 6), 0.5) + 0.5 * np.eye(6), 3),
    "sparse-5x5": _gaussian_pmi(_unit_correlation(10, {(0, 5): 0.8, (1, 6): 0.8}), 5),
    "gaussian-5x5-rho0.95": _gaussian_pmi(
        _unit_correlation(10, {(i, 5 + i): 0.95 for i in range(5)}), 5),
    "student-1x1-df1": _student_pmi(1, 1),
    "student-2x2-df2": _student_pmi(2, 2),
    "additive-uniform-1x1-0.1": _additive_uniform_pmi(0.1),
    "additive-uniform-1x1-0.75": _additive_uniform_pmi(0.75),
}


@pytest.mark.parametrize("name", list(POINTWISE_MI))
def test_ground_truth_matches_monte_carlo(name):
  """E[log p(x, y) - log p(x) - log p(y)] over the task's own samples is its MI."""
  task = tasks.get_task(name)
  with jax.enable_x64(True):
    x, y = jax.device_get(task.sample(jax.random.key(7), MC_SAMPLES))
  assert x.dtype == np.float64
  pmi = POINTWISE_MI[name](x, y)
  standard_error = pmi.std() / math.sqrt(MC_SAMPLES)
  assert abs(pmi.mean() - task.mutual_information) < 4 * standard_error, (
      pmi.mean(), task.mutual_information, standard_error)


@pytest.fixture(scope="module")
def jitted_draws():
  """Every task's samples under one jit (one compile): keys 0, 0 again, and 1."""
  draw = jax.jit(lambda key: {name: task.sample(key, 64) for name, task in tasks.TASKS.items()})
  return jax.device_get([draw(jax.random.key(0)), draw(jax.random.key(0)),
                         draw(jax.random.key(1))])


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_samples_have_shapes_and_are_deterministic(jitted_draws, name):
  task = tasks.get_task(name)
  (x, y), (x_again, y_again), (x_other, _) = (draws[name] for draws in jitted_draws)
  assert x.shape == (64, task.dim_x) and y.shape == (64, task.dim_y)
  assert x.dtype == y.dtype == np.float32   # x64 is off by default
  assert np.isfinite(x).all() and np.isfinite(y).all()
  np.testing.assert_array_equal(x, x_again)
  np.testing.assert_array_equal(y, y_again)
  assert not np.array_equal(x, x_other)


def test_samplers_follow_x64():
  names = ("bimodal-1x1", "student-1x1-df1", "additive-uniform-1x1-0.1")
  with jax.enable_x64(True):
    draws = jax.jit(lambda key: {name: tasks.get_task(name).sample(key, 8) for name in names})(
        jax.random.key(0))
  for name, (x, y) in draws.items():
    assert x.dtype == y.dtype == jnp.float64, name


def test_elementwise_transforms_are_increasing():
  with jax.enable_x64(True):   # in float32, Phi(x) rounds to 1 well before x = 5
    grid = jnp.linspace(-5.0, 5.0, 4001)
    for transform in (tasks.half_cube, tasks.normal_cdf, tasks.cube, jnp.exp, jnp.arcsinh):
      assert (np.diff(np.asarray(transform(grid))) > 0).all(), transform
  wide = jnp.linspace(-30.0, 30.0, 20001)
  for transform, bound in ((tasks.wiggly_x, 0.161), (tasks.wiggly_y, 0.533)):
    derivative = np.asarray(jax.vmap(jax.grad(transform))(wide))
    assert derivative.min() >= bound - 1e-5, transform


def test_bimodal_quantile_inverts_the_mixture_cdf():
  mixture = tasks.BIMODAL_Y
  with jax.enable_x64(True):
    x = jnp.concatenate([jnp.linspace(-30.0, 30.0, 2001), jnp.asarray([-8.5, 8.5])])
    quantile = np.asarray(mixture.quantile_of_normal(x))
  x = np.asarray(x)
  cdf = sum(w * stats.norm.cdf(quantile, m, s)
            for w, m, s in zip(mixture.weights, mixture.means, mixture.scales))
  sf = sum(w * stats.norm.sf(quantile, m, s)
           for w, m, s in zip(mixture.weights, mixture.means, mixture.scales))
  # Relative accuracy in whichever tail x lies: F(q) = Phi(x) below 0, 1 - F(q) = Phi(-x) above.
  tail, expected = np.where(x <= 0, cdf, sf), stats.norm.cdf(-np.abs(x))
  np.testing.assert_allclose(tail, expected, rtol=1e-9)
  order = np.argsort(x)
  assert (np.diff(quantile[order]) > 0).all()


def _has_two_modes(values: np.ndarray) -> bool:
  """Two histogram bins with a bin between them holding under half of the lower of the two."""
  counts, _ = np.histogram(values, bins=30, range=tuple(np.percentile(values, [0.5, 99.5])))
  return any(counts[j] < 0.5 * min(counts[:j].max(), counts[j + 1:].max())
             for j in range(1, len(counts) - 1))


def test_bimodal_marginals_have_two_peaks():
  x, y = jax.device_get(tasks.get_task("bimodal-1x1").sample(jax.random.key(3), 20_000))
  assert _has_two_modes(x[:, 0]) and _has_two_modes(y[:, 0])
  normal_x, _ = jax.device_get(tasks.get_task("normal-1x1").sample(jax.random.key(3), 20_000))
  assert not _has_two_modes(normal_x[:, 0])


def test_spiral_and_swissroll_are_injective():
  @jax.jit
  def roll_and_unroll(x, line):
    rolled = tasks.spiral(x, (1, 2), 1 / 3)
    # Keeping the norm keeps the angle, so rotating back by it recovers x.
    return rolled, tasks.spiral(rolled, (1, 2), -1 / 3), tasks.swissroll(line)

  with jax.enable_x64(True):
    x = jax.random.normal(jax.random.key(0), (256, 3))
    line = jnp.linspace(-5.0, 5.0, 1001)[:, None]
    rolled, unrolled, swiss = jax.device_get(roll_and_unroll(x, line))
  x = np.asarray(x)
  np.testing.assert_allclose(np.linalg.norm(rolled, axis=1), np.linalg.norm(x, axis=1),
                             rtol=1e-12)
  np.testing.assert_allclose(unrolled, x, atol=1e-12)
  assert (np.diff(np.linalg.norm(swiss, axis=1)) > 0).all()   # radius t / 21, t increasing in x


def test_get_task_names_the_known_tasks():
  with pytest.raises(ValueError, match="dense-5x5.*Known tasks: normal-1x1, bimodal-1x1"):
    tasks.get_task("dense-5x6")
  with pytest.raises(ValueError, match="Known tasks"):
    tasks.get_task("nope")


def _expected_split(task, seed: int, split_index: int, count: int):
  """The base builder's key derivation: fold in the split, then the chunk's start (0 here)."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), split_index), 0)
  with jax.enable_x64(True):
    return jax.device_get(task.sample(key, count))


def _sorted_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """The (x, y) pairs in a canonical order: TFDS stores examples shuffled by their key's hash."""
  rows = np.concatenate([x, y], axis=1)
  return rows[np.lexsort(rows.T[::-1])]


def test_builder_round_trips_the_sampler_exactly(tmp_path):
  task = tasks.get_task("gaussian-5x5-rho0.95")   # a name with '-' and '.'
  config = mi_tasks.mi_task_config(task=task, num_train=64, num_test=32, seed=3)
  assert config.name == "gaussian-5x5-rho0.95_train64_test32_seed3"
  arrays = mi_tasks.load_arrays(task, 64, 32, seed=3, data_dir=str(tmp_path))
  for split_index, (split, count) in enumerate((("train", 64), ("test", 32))):
    x, y = arrays[split]
    expected_x, expected_y = _expected_split(task, 3, split_index, count)
    assert x.dtype == y.dtype == np.float64 and x.shape == y.shape == (count, 5)
    np.testing.assert_array_equal(_sorted_rows(x, y), _sorted_rows(expected_x, expected_y))
  source = pipeline.data_source(mi_tasks.load(config, str(tmp_path)), "train")
  np.testing.assert_array_equal(source.__getitems__([5])["y"][0], arrays["train"][1][5])
  other = mi_tasks.load_arrays(task, 64, 32, seed=4, data_dir=str(tmp_path))
  assert not np.array_equal(other["train"][0], arrays["train"][0])


def test_builder_config_needs_the_task_object():
  with pytest.raises(TypeError, match="get_task"):
    mi_tasks.mi_task_config(task="dense-5x5", num_train=4, num_test=4, seed=0)
