"""jetformer: tokens, curriculum, the bits-per-dim loss, optimiser, seeds, sampling, claims."""
import math
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import train_loop
from jaxlab.data import digits
from jaxlab.methods.jetformer import sampling
from jaxlab.methods.jetformer import tokens
from jaxlab.methods.jetformer import training

CONFIG = pathlib.Path(__file__).resolve().parents[3] / "configs" / "jetformer.py"


def smoke_config(**overrides):
  config = config_lib.load_config(CONFIG, "smoke")
  return config_lib.with_overrides(config, overrides) if overrides else config


def test_patchify_round_trip_and_layout():
  images = jnp.arange(2 * 8 * 8).reshape(2, 8, 8, 1)
  patches = tokens.patchify(images, 2)
  assert patches.shape == (2, 16, 4)
  np.testing.assert_array_equal(patches[0, 0], [0, 1, 8, 9])     # top-left 2x2 patch
  np.testing.assert_array_equal(patches[0, 1], [2, 3, 10, 11])   # its right neighbour
  np.testing.assert_array_equal(tokens.unpatchify(patches, 2, 8, 8, 1), images)
  with pytest.raises(ValueError, match="not divisible"):
    tokens.patchify(images, 3)


def test_levels_dequantisation_and_back():
  levels = jnp.arange(17)
  x = tokens.dequantize(jax.random.key(0), levels, 17)
  assert float(x.min()) >= -1.0 and float(x.max()) < 1.0 + 1 / 8
  np.testing.assert_array_equal(tokens.unit_to_levels(x, 17), levels)


def test_curriculum_endpoints_and_monotone():
  std = tokens.curriculum_std(jnp.linspace(0, 1, 11), 4.0, 0.5)
  np.testing.assert_allclose([std[0], std[-1]], [4.0, 0.5], rtol=1e-6)
  assert np.all(np.diff(np.asarray(std)) <= 0)
  np.testing.assert_allclose(tokens.curriculum_std(jnp.asarray(0.5), 4.0), 2.0, rtol=1e-6)
  levels = jnp.full((1000,), 8)
  np.testing.assert_array_equal(tokens.add_curriculum_noise(jax.random.key(0), levels, 0.0),
                                levels)
  noisy = tokens.add_curriculum_noise(jax.random.key(0), levels, 3.0)
  assert 2.5 < float(jnp.std(noisy)) < 3.5


def test_curriculum_noise_is_not_clipped_so_zero_pixels_stay_zero_mean():
  zeros = jnp.zeros((20_000,), jnp.int32)
  noisy = tokens.add_curriculum_noise(jax.random.key(1), zeros, 4.0)
  assert noisy.min() < 0 and abs(float(noisy.mean())) < 0.1


def test_curriculum_has_its_own_length_and_the_clean_phase_is_measured():
  config = smoke_config(train={"steps": 1000, "curriculum_fraction": 0.6},
                        optim={"noise_std": 4.0})
  assert training.curriculum_steps(config) == 600
  np.testing.assert_allclose(training.noise_std_at(jnp.asarray(0), config), 4.0)
  assert float(training.noise_std_at(jnp.asarray(600), config)) == 0.0
  assert float(training.noise_std_at(jnp.asarray(900), config)) == 0.0
  phase = training.clean_phase(config)
  # std < 0.5 once cos(pi p / 0.6) < -0.75, i.e. from p ~ 0.46.
  assert 440 <= phase["first_step"] <= 480
  assert 0.0 < phase["lr_share"] < phase["step_share"] < 1.0
  longer = training.clean_phase(config_lib.with_overrides(
      config, {"train": {"curriculum_fraction": 1.0}}))
  assert longer["lr_share"] < phase["lr_share"]
  with pytest.raises(config_lib.ConfigError, match="curriculum_fraction"):
    training.make_experiment(config_lib.with_overrides(
        config, {"train": {"curriculum_fraction": 0.0}}))


def test_bits_per_dim_of_a_standard_normal_prior_through_the_loss():
  """Jet at initialisation is the identity, so flow_only's bpd is the N(0, 1) code length of the
  dequantised pixels, plus log2(bin_scale) bits for the bin width."""
  config = smoke_config(model={"use_decoder": False})
  model = training.make_model(config).module(training.make_model(config).init(jax.random.key(0)))
  arrays = training.train_arrays(config, "test")
  batch = {k: jnp.asarray(v[:40]) for k, v in arrays.items()}
  key = jax.random.key(3)
  _, metrics = training.loss_fn(model, batch, key, config=config, noise_std=jnp.zeros([]),
                                train=False)
  x = np.asarray(tokens.dequantize(jax.random.split(key, 6)[1], batch["image"], 17), np.float64)
  nats = (0.5 * x**2 + 0.5 * math.log(2 * math.pi)).reshape(40, -1).sum(1)
  expected = np.mean(nats / (64 * math.log(2)) + math.log2(8))
  np.testing.assert_allclose(float(metrics["bpd"]), expected, rtol=1e-5)


def test_sampling_and_understanding_shapes():
  config = smoke_config()
  functional = training.make_model(config)
  model = functional.module(functional.init(jax.random.key(0)))
  labels = jnp.array([0, 3, 9])
  levels, acceptance = sampling.sample_levels(
      model, jax.random.key(1), labels, temperature=0.9, cfg_weight=3.0, num_candidates=4,
      num_levels=17, patch=4, image_shape=digits.IMAGE_SHAPE)
  assert levels.shape == (3, 8, 8, 1) and levels.min() >= 0 and levels.max() <= 16
  assert 0.0 <= float(acceptance) <= 1.0
  predictions = sampling.predict_classes(model, levels, num_levels=17, patch=4)
  assert predictions.shape == (3,) and predictions.max() < 10


def test_class_prefix_is_repeated_in_offset_vocabularies():
  config = smoke_config(model={"class_repeats": 3})
  functional = training.make_model(config)
  model = functional.module(functional.init(jax.random.key(0)))
  vocab = model.vocab
  assert vocab.size == 3 * (10 + 3)
  np.testing.assert_array_equal(vocab.class_prefix(jnp.array([2, vocab.no_label])),
                                [[2, 15, 28], [10, 23, 36]])
  z_ar = jnp.zeros((2, model.num_tokens, model.ar_dim))
  hidden = model.hidden(jnp.array([1, 2]), z_ar, jnp.array([False, True]))
  assert hidden.shape[1] == model.num_tokens + 3 + 2 and model.prefix_length == 4


def test_class_embeddings_are_standard_normal():
  config = config_lib.load_config(CONFIG, "quick")
  params = training.make_model(config).init(jax.random.key(0))
  embedding = np.asarray(params["decoder"]["token_embed"]["embedding"])
  assert embedding.shape == (16 * 13, 64) and 0.9 < embedding.std() < 1.1


def test_weight_decay_on_kernels_only_and_not_scaled_by_the_learning_rate():
  config = smoke_config(optim={"weight_decay": 0.01, "lr": 1e-3, "warmup_fraction": 0.0},
                        train={"steps": 100})
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))},
            "norm": {"scale": jnp.ones((2,))}}
  optimizer = training.make_optimizer(config)
  zeros = jax.tree.map(jnp.zeros_like, params)
  _, state = optimizer.update(zeros, optimizer.init(params), params)   # warm-up step 0: x 0
  updates, _ = optimizer.update(zeros, state, params)
  # Step 1 ends the one-step warm-up, multiplier 1: the kernel moves by wd (not lr * wd).
  np.testing.assert_allclose(updates["dense"]["kernel"], -0.01, rtol=1e-5)
  np.testing.assert_array_equal(updates["dense"]["bias"], 0.0)
  np.testing.assert_array_equal(updates["norm"]["scale"], 0.0)


def test_input_noise_reaches_generation_examples_in_training_only():
  config = smoke_config(model={"input_noise_std": 0.3})
  quiet = smoke_config(model={"input_noise_std": 0.0})
  functional = training.make_model(config)
  model = functional.module(functional.init(jax.random.key(0)))
  arrays = training.train_arrays(config, "test")
  batch = {k: jnp.asarray(v[:16]) for k, v in arrays.items()}
  key = jax.random.key(5)
  run = lambda c, train: training.loss_fn(model, batch, key, config=c,
                                          noise_std=jnp.zeros([]), train=train)[0]
  noisy_train, quiet_train = jax.jit(lambda: (run(config, True), run(quiet, True)))()
  assert float(noisy_train) != float(quiet_train)
  z = jnp.ones((4, 3, 2))
  noisy = training.add_input_noise(jax.random.key(0), z, 0.3, jnp.array([True, False] * 2))
  np.testing.assert_array_equal(noisy[1], z[1])
  assert float(jnp.abs(noisy[0] - z[0]).max()) > 0


def test_factored_std_of_the_identity_flow_is_the_std_of_those_pixels():
  config = smoke_config()
  functional = training.make_model(config)
  model = functional.module(functional.init(jax.random.key(0)))   # Jet starts as the identity
  levels = jnp.asarray(training.train_arrays(config, "test")["image"][:50])
  key = jax.random.key(2)
  std = sampling.factored_std(model, key, levels, num_levels=17, patch=4)
  x = tokens.patchify(tokens.dequantize(key, levels, 17), 4)
  np.testing.assert_allclose(std, x[..., config.model.ar_dim:].std(), rtol=1e-5)
  no_factor = training.make_model(smoke_config(model={"ar_dim": 16}))
  assert np.isnan(sampling.factored_std(no_factor.module(no_factor.init(key)), key, levels,
                                        num_levels=17, patch=4))


def test_summary_decides_claims_over_seeds():
  from jaxlab.methods.jetformer import reproduction  # pylint: disable=g-import-not-at-top
  def outcome(bpd, accuracy):
    return {"test_bpd": bpd, "sample_accuracy": accuracy, "factored_std": [1.0] * 3,
            "cfg_acceptance": [0.9] * 3}
  per_variant = {
      "jetformer": outcome([2.5, 2.52, 2.49], [0.60, 0.62, 0.58]),
      "ar_raw_patches": outcome([2.8, 2.79, 2.81], [0.9, 0.9, 0.9]),
      "no_curriculum": outcome([2.4, 2.41, 2.39], [0.40, 0.45, 0.41]),
      "no_factor_out": outcome([2.45, 2.46, 2.44], [0.61, 0.59, 0.63]),
  }
  metrics, claims, _ = reproduction.summarize(per_variant, 0.95, samples_per_seed=200)
  verdicts = {c["name"]: c["holds"] for c in claims}
  assert verdicts == {"flow_beats_raw_patches": True,
                      "curriculum_trades_likelihood_for_samples": True,
                      "factoring_out_helps": False}
  assert all(c["paired"] for c in claims)
  np.testing.assert_allclose(metrics["sample_accuracy"]["jetformer"], 0.60)
  np.testing.assert_allclose(metrics["sample_accuracy_stderr"]["jetformer"],
                             np.std([0.6, 0.62, 0.58], ddof=1) / np.sqrt(3))
  with pytest.raises(config_lib.ConfigError, match="num_seeds"):
    reproduction.summarize({"jetformer": outcome([2.5], [0.6]),
                            "no_factor_out": outcome([2.4], [0.5])}, 0.95, samples_per_seed=200)


def test_train_step_compiles_once_and_trains_vmapped_seeds(tmp_path):
  config = smoke_config(train={"steps": 4, "eval_every": 4, "ckpt_every": 4, "log_every": 1,
                               "num_seeds": 2})
  experiment = training.make_experiment(config)
  traced = chex.assert_max_traces(experiment.update, n=1)
  experiment = train_loop.Experiment(init=experiment.init, update=traced,
                                     train_data=experiment.train_data,
                                     evaluate=experiment.evaluate, eval_data=experiment.eval_data)
  result = train_loop.run(experiment, config, tmp_path)
  assert result.step == 4 and np.isfinite(result.eval_metrics["eval/bpd"])
  kernel = result.state["params"]["read_in"]["kernel"]
  assert kernel.shape[0] == 2 and not np.allclose(kernel[0], kernel[1])
  seeds = [result.eval_metrics[f"eval/bpd_seed{r}"] for r in range(2)]
  assert seeds[0] != seeds[1]
  np.testing.assert_allclose(result.eval_metrics["eval/bpd"], np.mean(seeds), rtol=1e-5)


def test_guided_rejection_sampler_matches_the_closed_form_gaussian():
  """N(m_c, s_c)^(1+w) / N(m_u, s_u)^w is Gaussian when its precision is positive: precision
  (1+w)/s_c^2 - w/s_u^2, mean ((1+w) m_c/s_c^2 - w m_u/s_u^2) / precision."""
  n, w = 40_000, 2.0
  shape = (n,)
  m_c, s_c, m_u, s_u = 0.5, 1.0, -0.5, 1.5
  full = lambda v: jnp.full(shape, v)
  draws, found = sampling.guided_gaussian_sample(
      jax.random.key(0), full(m_c), full(s_c), full(m_u), full(s_u), w, num_candidates=64)
  draws = np.asarray(draws)
  assert float(found.mean()) > 0.999
  precision = (1 + w) / s_c**2 - w / s_u**2
  mean = ((1 + w) * m_c / s_c**2 - w * m_u / s_u**2) / precision
  assert abs(draws.mean() - mean) < 0.02 and abs(draws.std() - precision**-0.5) < 0.02
  plain = np.asarray(sampling.guided_gaussian_sample(
      jax.random.key(1), full(m_c), full(s_c), full(m_u), full(s_u), 0.0,
      num_candidates=64)[0])
  assert abs(plain.mean() - m_c) < 0.02 and abs(plain.std() - s_c) < 0.02
