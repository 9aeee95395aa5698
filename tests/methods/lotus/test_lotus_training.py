"""lotus: the fine-tuning step compiles once, variants behave as specified."""
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import train_loop
from jaxlab.methods.lotus import training
from jaxlab.methods.lotus import variants

ROOT = pathlib.Path(__file__).resolve().parents[3]


def smoke_config(**overrides):
  config = config_lib.load_config(ROOT / "configs" / "lotus.py", "smoke")
  return config_lib.with_overrides(config, overrides) if overrides else config


def test_finetune_step_compiles_once_and_starts_from_the_given_params(tmp_path):
  config = smoke_config(train={"steps": 4, "ckpt_every": 4, "log_every": 1})
  prior = training.widen_prior(training.make_model(config, prior=True).init(jax.random.key(3)))
  experiment = training.make_experiment(config, variant="lotus_g_detail", task="depth",
                                        init_params=prior)
  chex.assert_trees_all_equal(experiment.init(jax.random.key(0))["params"], prior)
  traced = chex.assert_max_traces(experiment.update, n=1)
  experiment = train_loop.Experiment(init=experiment.init, update=traced,
                                     train_data=experiment.train_data)
  result = train_loop.run(experiment, config, tmp_path)
  assert result.step == 4


def test_detail_preserver_adds_the_reconstruction_loss():
  config = smoke_config()
  model = training.make_model(config)
  params = jax.tree.map(lambda p: p + 0.05, model.init(jax.random.key(0)))
  batch = {"image": jnp.ones((2, 16, 16, 3)) * 0.3, "target": jnp.zeros((2, 16, 16, 3))}
  schedule = training.make_schedule(config)
  plain, plain_metrics = training.finetune_loss(model.module(params), schedule,
                                                variants.VARIANTS["lotus_g"], batch,
                                                jax.random.key(1))
  detail, metrics = training.finetune_loss(model.module(params), schedule,
                                           variants.VARIANTS["lotus_g_detail"], batch,
                                           jax.random.key(1))
  assert "reconstruction_mse" in metrics and "reconstruction_mse" not in plain_metrics
  np.testing.assert_allclose(detail, plain + metrics["reconstruction_mse"], rtol=1e-5)
  # The stacked call's reconstruction half is the network switched to RGB on the same input.
  eps = jax.random.normal(jax.random.split(jax.random.key(1))[1], batch["target"].shape)
  t = jnp.full((2,), schedule.num_steps - 1, jnp.int32)
  alone = model.module(params)(jnp.concatenate([batch["image"], eps], -1), t,
                               jnp.full((2,), variants.RECONSTRUCTION, jnp.int32))
  np.testing.assert_allclose(metrics["reconstruction_mse"],
                             jnp.mean(jnp.square(alone - batch["image"])), rtol=1e-5)


def test_lotus_d_ignores_the_noise_and_lotus_g_does_not():
  config = smoke_config()
  params = jax.tree.map(lambda p: p + 0.05,
                        training.make_model(config).init(jax.random.key(0)))
  image = jax.random.uniform(jax.random.key(2), (2, 16, 16, 3)) * 2 - 1
  for name, deterministic in (("lotus_d", True), ("lotus_g", False)):
    predict = training.predictor(config, name)
    first = predict(params, image, jax.random.key(0))
    second = predict(params, image, jax.random.key(1))
    assert first.shape == image.shape
    assert np.allclose(first, second) == deterministic, name


def test_depth_normalisation_is_per_image():
  depth = np.stack([np.linspace(1, 3, 16).reshape(4, 4), np.linspace(5, 50, 16).reshape(4, 4)])
  normalised = training.normalise_depth(depth)
  np.testing.assert_allclose(normalised.min(axis=(1, 2)), -1)
  np.testing.assert_allclose(normalised.max(axis=(1, 2)), 1)


def test_fine_tuning_starts_from_the_prior_on_its_image_and_target_channels():
  """The widened prior on [x, x] is the prior on x: the image channels start pretrained, not
  random (the official conv_in initialisation)."""
  config = smoke_config()
  prior_model = training.make_model(config, prior=True)
  prior = jax.tree.map(lambda p: p + 0.05, prior_model.init(jax.random.key(0)))
  widened = training.widen_prior(prior)
  x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  t = jnp.array([3, 40])
  labels = jnp.zeros((2,), jnp.int32)
  expected = prior_model.module(prior)(x, t, labels)
  got = training.make_model(config).module(widened)(jnp.concatenate([x, x], -1), t, labels)
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
  kernel = widened["input_conv"]["kernel"]
  np.testing.assert_allclose(kernel[:, :, :3], prior["input_conv"]["kernel"] / 2)
  np.testing.assert_allclose(kernel[:, :, 3:], prior["input_conv"]["kernel"] / 2)


def test_every_task_trains_on_batches_of_one_structure():
  """Depth and normal batches have the same keys and shapes (one compiled step for both tasks);
  the target is the task's own annotation."""
  config = smoke_config()
  depth, normal = (training.training_arrays(config, task) for task in training.TASKS)
  assert jax.tree.map(np.shape, depth) == jax.tree.map(np.shape, normal)
  arrays = training.task_arrays(config, "train")
  np.testing.assert_array_equal(depth["target"], arrays["depth_target"])
  np.testing.assert_array_equal(normal["target"], arrays["normal_target"])
  assert set(training.training_arrays(config, None)) == {"image"}
