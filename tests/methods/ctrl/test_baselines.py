"""ctrl.baselines: CFG's combination and fine-tuning, and the two guidances on an exact prior.

Prior N(0, 1): its exact eps-denoiser is sqrt(1 - alpha_bar_t) x_t. Guiding it towards a
Gaussian reward must move the samples' mean towards the reward's centre.
"""
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.diffusion import sampling
from jaxlab.diffusion import schedules
from jaxlab.methods.ctrl import baselines
from jaxlab.zoo import functional
from jaxlab.zoo import residual_mlp

SCHEDULE = schedules.cosine_schedule(100)
MEAN = 1.5


def _rows(t, x):
  """t per row: CTRL's chains hand the denoiser a scalar t (`Settings.shared_time`)."""
  return jnp.broadcast_to(jnp.asarray(t), x.shape[:1])


def exact_eps(x, t):
  return jnp.sqrt(1.0 - SCHEDULE.alphas_cumprod[_rows(t, x)])[:, None] * x


def guided_mean(guidance):
  keys = jax.random.split(jax.random.key(0), 25)
  x_T = jax.random.normal(jax.random.key(1), (4000, 1))
  x0 = sampling.ddim_sample(exact_eps, SCHEDULE, x_T, keys, num_steps=25, eta=1.0,
                            guidance=guidance)
  return float(jnp.mean(x0))


def test_both_guidances_pull_the_prior_towards_the_reward():
  labels = jnp.zeros((4000,), jnp.int32)
  reward = lambda x, y: -jnp.square(x[:, 0] - MEAN) / 2
  unguided = guided_mean(None)
  reconstruction = guided_mean(baselines.reconstruction_guidance(exact_eps, SCHEDULE, reward,
                                                                 labels, 1.0, weighting="none"))
  # p(y | x_t, t) for the same reward: x_t's own Gaussian likelihood of MEAN (variance 1 + 1).
  noisy = lambda x, t, y: -jnp.square(x[:, 0] - MEAN) / 4
  classifier = guided_mean(baselines.classifier_guidance(noisy, SCHEDULE, labels, 1.0))
  assert abs(unguided) < 0.05
  # The exact tilt N(0, 1) x N(MEAN, 1) has mean MEAN / 2.
  for value in (reconstruction, classifier):
    assert 0.3 * MEAN < value < 0.8 * MEAN, value


def test_cfg_denoiser_combines_conditional_and_null_outputs():
  apply = lambda p, x, t, y: x * (y[:, None] + 1.0)
  labels = jnp.array([0, 1])
  x, t = jnp.ones((2, 3)), jnp.zeros((2,), jnp.int32)
  np.testing.assert_allclose(baselines.cfg_denoiser(apply, None, labels, 4, 0.0)(x, t),
                             apply(None, x, t, labels))
  # w = 2: 3 f(y) - 2 f(null = 4), f(null) = 5 x.
  np.testing.assert_allclose(baselines.cfg_denoiser(apply, None, labels, 4, 2.0)(x, t),
                             3 * apply(None, x, t, labels) - 10 * x)


def test_cfg_finetune_trains_the_label_table_per_seed():
  base = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=2, out_features=2, width=8, num_blocks=1, rngs=rngs))
  labelled = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=2, out_features=2, width=8, num_blocks=1, num_embeddings=3, rngs=rngs))
  params = baselines.labelled_params(base.init(jax.random.key(0)), 2)
  rng = np.random.default_rng(0)
  images = rng.normal(size=(64, 2)).astype(np.float32)
  labels = (images[:, 0] > 0).astype(np.int32)
  tuned = baselines.cfg_finetune(lambda p, x, t, y: labelled.apply(p, x, t, y), params, SCHEDULE,
                                 images, labels, 2, baselines.CfgSettings(steps=20, batch_size=16,
                                                                          lr=1e-2),
                                 jax.random.key(1), num_seeds=2)
  table = np.asarray(tuned["label_embedding"]["embedding"])
  assert table.shape == (2, 3, 8)
  assert np.abs(table).max() > 0 and not np.allclose(table[0], table[1])


def test_weighted_reconstruction_guidance_gives_the_tilt_and_survives_a_biased_denoiser():
  """On DDPM's linear T = 1,000 schedule: with the exact denoiser the weighted rule lands near
  the exact tilt's mean (MEAN / 2); with a denoiser whose eps is 10% too large, the plain rule's
  x0_hat error (times 1 / sqrt(alpha_bar_t), ~160 at t = 999) blows the chain up, the weighted
  rule's does not."""
  schedule = schedules.linear_schedule(1000)
  labels = jnp.zeros((2000,), jnp.int32)
  reward = lambda x, y: -jnp.square(x[:, 0] - MEAN) / 2

  def guided(eps_scale, weighting):
    eps = lambda x, t: eps_scale * jnp.sqrt(1.0 - schedule.alphas_cumprod[_rows(t, x)])[:, None] * x
    guidance = baselines.reconstruction_guidance(eps, schedule, reward, labels, 1.0,
                                                 weighting=weighting)
    x_T = jax.random.normal(jax.random.key(1), (2000, 1))
    x0 = sampling.ddim_sample(eps, schedule, x_T, jax.random.split(jax.random.key(0), 25),
                              num_steps=25, eta=1.0, guidance=guidance)
    return float(jnp.mean(x0)), float(jnp.std(x0))

  mean, _ = guided(1.0, "sqrt_alpha_bar")
  assert 0.4 * MEAN < mean < 0.6 * MEAN, mean
  assert guided(1.1, "none")[1] > 100.0
  assert guided(1.1, "sqrt_alpha_bar")[1] < 1.0


def test_unknown_reconstruction_weighting_is_rejected():
  with np.testing.assert_raises_regex(ValueError, "weighting"):
    baselines.reconstruction_guidance(exact_eps, SCHEDULE, lambda x, y: x[:, 0], jnp.zeros(2),
                                      1.0, weighting="alpha")
