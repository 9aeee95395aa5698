"""8 simulated devices; one data-parallel update equals the same update on one device."""
import chex
import jax
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import parallel
from jaxlab.data import least_squares
from jaxlab.methods.precision_ls import training

import pathlib

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "precision_ls.py"


def test_8_devices_present():
  assert jax.device_count() == 8, "conftest.py must set jax_num_cpu_devices=8 before JAX starts"


def one_update(mesh, config):
  experiment = training.make_experiment(config)
  replicated = parallel.replicated(mesh)
  state = jax.jit(experiment.init, out_shardings=replicated)(jax.random.key(0))
  raw = jax.device_get(least_squares.sample_problems(jax.random.key(1), 16, config.data.n,
                                                     config.data.d, dtype=np.float32))
  batch = parallel.shard_batch(raw, mesh)
  update = jax.jit(experiment.update, out_shardings=(replicated, replicated))
  state, metrics = update(state, batch, jax.random.key(2))
  return jax.device_get(state), jax.device_get(metrics)


def test_data_parallel_update_matches_single_device():
  config = config_lib.with_overrides(config_lib.load_config(CONFIG, "smoke"),
                                     {"precision": "float32", "optim": {"schedule": "step"},
                                      "data": {"fresh": False}})
  state8, metrics8 = one_update(parallel.make_mesh(), config)
  state1, metrics1 = one_update(parallel.make_mesh(devices=jax.devices()[:1]), config)
  assert state8["params"]["read_in"]["kernel"].shape == state1["params"]["read_in"]["kernel"].shape
  chex.assert_trees_all_close(state8["params"], state1["params"], atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(metrics8["loss"], metrics1["loss"], rtol=1e-6)
  # The update moved the parameters (so the comparison is not between two copies of the init).
  init = jax.device_get(training.make_experiment(config).init(jax.random.key(0)))
  assert not np.allclose(init["params"]["read_in"]["kernel"],
                         state8["params"]["read_in"]["kernel"])


def test_batches_are_sharded_over_the_data_axis():
  mesh = parallel.make_mesh()
  batch = parallel.shard_batch({"x": np.zeros((16, 3))}, mesh)
  assert batch["x"].sharding.spec == parallel.data_sharded(mesh).spec
  assert len(batch["x"].addressable_shards) == 8
  assert batch["x"].addressable_shards[0].data.shape == (2, 3)


def test_flow_mi_fit_over_8_devices_equals_one_device():
  """The datasets of a flow_mi fit are split over the data axis; the estimates do not change."""
  from jaxlab.methods.flow_mi import estimators  # pylint: disable=g-import-not-at-top
  from jaxlab.methods.flow_mi import fitting  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = rng.normal(size=(8, 300, 2)).astype(np.float32)
  y = (0.7 * x + 0.5 * rng.normal(size=(8, 300, 2))).astype(np.float32)
  data = fitting.FitData(x[:, :150], y[:, :150], x[:, 150:], y[:, 150:])
  options = estimators.Options(num_bins=4, steps=6, eval_every=3, batch_size=32)
  trainable = estimators.trainable("jvf", 2, 2, options)
  keys = jax.random.split(jax.random.key(0), 8)
  results = [fitting.fit(trainable, data, keys, options.schedule(), progress=False,
                         mesh=parallel.make_mesh(devices=devices)).best_mi
             for devices in (jax.devices()[:1], jax.devices())]
  np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_a_batch_mesh_takes_the_most_devices_that_divide_the_batch():
  assert parallel.batch_mesh(4).devices.size == 4
  assert parallel.batch_mesh(12).devices.size == 4
  assert parallel.batch_mesh(16).devices.size == 8
  assert parallel.batch_mesh(3).devices.size == 1
  assert parallel.batch_mesh(16, ml_collections.ConfigDict(dict(data=2))).devices.size == 2
