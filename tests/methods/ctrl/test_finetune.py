"""CTRL's fine-tuning on cases with known answers.

Analytic case: data N(0, 1), whose exact eps-denoiser is eps_hat = sqrt(1 - alpha_bar_t) x_t, and
a Gaussian log-reward r(x) = -(x - m)^2 / (2 s^2). The KL-regularised optimum's terminal law is the
untrained chain's reweighted by exp(r / alpha) (the strided chain's own law, which is slightly
narrower than N(0, 1)); the policy here adds a free affine correction per step to the exact eps,
so it can represent that optimum up to the fixed per-step noise.
"""
import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import schedules
from jaxlab.methods.ctrl import finetune
from jaxlab.zoo import residual_mlp
from jaxlab.zoo import unet
from jaxlab.zoo import functional

T, STEPS, MEAN, SCALE = 100, 25, 1.0, 1.0
# Cosine: alpha_bar at T is ~0, so x_T carries nothing of x0 and the whole tilt is reachable by
# the policy (the start noise is not controlled).
SCHEDULE = schedules.cosine_schedule(T)


def _rows(t, x):
  """t per row: CTRL's chains hand the denoiser a scalar t (`Settings.shared_time`)."""
  return jnp.broadcast_to(jnp.asarray(t), x.shape[:1])


def exact_eps(x, t):
  return jnp.sqrt(1.0 - SCHEDULE.alphas_cumprod[_rows(t, x)])[:, None] * x


def policy_apply(params, x, t, label):
  del label
  t = _rows(t, x)
  return exact_eps(x, t) + params["w1"][t][:, None] * x + params["w0"][t][:, None]


def reference_apply(params, x, t):
  del params
  return exact_eps(x, t)


def log_reward(x0, y):
  del y
  return -jnp.square(x0[:, 0] - MEAN) / (2 * SCALE**2)


def settings(**changes):
  values = dict(num_labels=1, steps=300, batch_size=512, sample_steps=STEPS, finetune="full",
                full_lr=0.02, weight_decay=0.0, remat=False, chunk_steps=100, ckpt_every=300)
  values.update(changes)
  return finetune.Settings(**values)


@functools.lru_cache(maxsize=None)
def untrained_terminal_samples(num, seed):
  params = {"w1": jnp.zeros(T), "w0": jnp.zeros(T)}
  labels = jnp.zeros(num, jnp.int32)
  return np.asarray(finetune.sample(policy_apply, params, reference_apply, None, SCHEDULE, labels,
                                    jax.random.key(seed), settings(), (1,))[:, 0], np.float64)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_tuned_chain_matches_the_reward_tilted_untrained_chain(alpha):
  config = settings(alpha=alpha)
  result = finetune.finetune(policy_apply, {"w1": jnp.zeros(T), "w0": jnp.zeros(T)},
                             reference_apply, None, SCHEDULE, log_reward, config,
                             jax.random.key(0), sample_shape=(1,), progress=False)
  labels = jnp.zeros(50_000, jnp.int32)
  tuned = np.asarray(finetune.sample(policy_apply, result.params[0], reference_apply, None,
                                     SCHEDULE, labels, jax.random.key(1), config, (1,)))[:, 0]
  base = untrained_terminal_samples(200_000, 2)
  weights = np.exp(np.asarray(log_reward(base[:, None], None)) / alpha)
  weights /= weights.sum()
  target_mean = float(np.sum(weights * base))
  target_var = float(np.sum(weights * (base - target_mean) ** 2))
  assert abs(tuned.mean() - target_mean) < 0.03, (tuned.mean(), target_mean)
  assert abs(tuned.var() / target_var - 1) < 0.08, (tuned.var(), target_var)
  # The prior alone would be far from both moments: the test is not passed by doing nothing.
  assert abs(base.mean() - target_mean) > 0.3


def test_below_policy_min_t_the_chain_is_the_reference_and_pays_no_kl():
  # A policy far from the reference: with policy_min_t it acts only on the steps at t >= 40.
  params = {"w1": jnp.full(T, 0.3), "w0": jnp.full(T, 0.5)}
  labels = jnp.zeros(64, jnp.int32)
  timesteps = np.asarray(finetune.sampling.ddim_timesteps(T, STEPS))
  free, kl_free = finetune.sample_with_kl(policy_apply, params, reference_apply, None, SCHEDULE,
                                          labels, jax.random.key(0), settings(), (1,))
  held, kl_held = finetune.sample_with_kl(policy_apply, params, reference_apply, None, SCHEDULE,
                                          labels, jax.random.key(0), settings(policy_min_t=40),
                                          (1,))
  acting = timesteps >= 40
  assert acting.any() and not acting.all()
  np.testing.assert_array_equal(np.asarray(kl_held)[~acting], 0.0)
  assert np.all(np.asarray(kl_free)[~acting] > 0)
  np.testing.assert_allclose(np.asarray(kl_held)[acting][0], np.asarray(kl_free)[acting][0],
                             rtol=1e-6)
  x = jnp.ones((2, 1))
  for t, expected in ((39, reference_apply(None, x, jnp.full(2, 39))),
                      (40, policy_apply(params, x, jnp.full(2, 40), None))):
    denoise = finetune.policy_denoiser(policy_apply, params, reference_apply, None, labels[:2],
                                       settings(policy_min_t=40))
    np.testing.assert_allclose(denoise(x, jnp.full(2, t)), expected)
  assert not np.allclose(free, held)


def test_kl_is_zero_at_init_with_lora_and_a_zero_label_table():
  model = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=4, out_features=4, width=8, num_blocks=1, rngs=rngs))
  pretrained = jax.tree.map(lambda p: p + 0.05, model.init(jax.random.key(0)))
  labelled = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=4, out_features=4, width=8, num_blocks=1, num_embeddings=4, rngs=rngs))
  policy_params = unet.add_label_embedding(pretrained, 3)
  config = settings(num_labels=3, finetune="lora", lora_rank=2, batch_size=6, sample_steps=5)
  kl = finetune.kl_at_init(lambda p, x, t, y: labelled.apply(p, x, t, y), policy_params,
                           lambda p, x, t: model.apply(p, x, t), pretrained, SCHEDULE, config,
                           jax.random.key(1), (4,))
  # Zero up to float32 rounding: with a scalar t the labelled network projects its label table,
  # the unlabelled one a single row (per-row t: exactly 0). A label row of 1e-3 gives ~1e-3.
  assert float(kl) < 1e-7
  exact = finetune.kl_at_init(lambda p, x, t, y: labelled.apply(p, x, t, y), policy_params,
                              lambda p, x, t: model.apply(p, x, t), pretrained, SCHEDULE,
                              dataclasses.replace(config, shared_time=False),
                              jax.random.key(1), (4,))
  assert float(exact) == 0.0


def test_shared_time_gives_the_per_row_chain_of_a_residual_mlp():
  model = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=4, out_features=4, width=8, num_blocks=2, num_embeddings=4, rngs=rngs))
  params = jax.tree.map(lambda p: p + 0.05, model.init(jax.random.key(0)))
  reference = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=4, out_features=4, width=8, num_blocks=2, rngs=rngs))
  reference_params = jax.tree.map(lambda p: p - 0.03, reference.init(jax.random.key(1)))
  labels = jnp.array([0, 1, 2, 3, 1, 0])
  chains = [finetune.sample_with_kl(
      lambda p, x, t, y: model.apply(p, x, t, y), params,
      lambda p, x, t: reference.apply(p, x, t), reference_params, SCHEDULE, labels,
      jax.random.key(2), settings(num_labels=4, sample_steps=5, shared_time=shared),
      (4,)) for shared in (True, False)]
  for shared, per_row in zip(*chains):
    np.testing.assert_allclose(shared, per_row, rtol=1e-4, atol=1e-6)
  assert float(jnp.max(chains[0][1])) > 1e-3   # the two networks differ: a real KL


def test_training_compiles_one_chunk_and_the_null_label_row_stays_zero(tmp_path, monkeypatch):
  model = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=2, out_features=2, width=8, num_blocks=1, num_embeddings=3, rngs=rngs))
  base = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
      in_features=2, out_features=2, width=8, num_blocks=1, rngs=rngs))
  # A trained network's output layer is not zero (a fresh ResidualMLP's is).
  pretrained = jax.tree.map(lambda p: p + 0.05, base.init(jax.random.key(0)))
  policy_params = unet.add_label_embedding(pretrained, 2)
  config = settings(num_labels=2, finetune="lora", lora_rank=2, batch_size=8, sample_steps=4,
                    steps=6, chunk_steps=2, ckpt_every=2, num_seeds=2, truncation="per_step")
  reward = lambda x0, y: jax.nn.log_sigmoid(jnp.where(y == 1, 4.0, -4.0) * x0[:, 0])
  # The loss is traced once for every update of every seed of every chunk: the steps in a
  # lax.scan, the seeds in a vmap, the chunk bounds traced.
  chex.clear_trace_counter()
  monkeypatch.setattr(finetune, "objective", chex.assert_max_traces(finetune.objective, n=1))
  init, chunk = finetune._training_functions(  # pylint: disable=protected-access
      lambda p, x, t, y: model.apply(p, x, t, y), lambda p, x, t: base.apply(p, x, t), reward,
      config, (2,), 2)
  state = init(policy_params, jax.random.split(jax.random.key(1), 2))
  for start in range(0, 6, 2):
    state, metrics = chunk(state, policy_params, pretrained, SCHEDULE, jnp.asarray(start),
                           jnp.asarray(start + 2))
  assert chunk._cache_size() == 1  # pylint: disable=protected-access
  monkeypatch.undo()   # the public call below builds (and traces) its own chunk
  table = np.asarray(state["trained"]["embedding"])
  assert table.shape == (2, 3, 8)
  assert np.all(table[:, -1] == 0) and np.any(table[:, :2] != 0)
  assert np.all(np.isfinite(np.asarray(metrics["train/loss"])))
  # And through the public entry point, resumably: a second call trains nothing more.
  first = finetune.finetune(lambda p, x, t, y: model.apply(p, x, t, y), policy_params,
                            lambda p, x, t: base.apply(p, x, t), pretrained, SCHEDULE, reward,
                            config, jax.random.key(1), sample_shape=(2,), workdir=tmp_path,
                            progress=False)
  again = finetune.finetune(lambda p, x, t, y: model.apply(p, x, t, y), policy_params,
                            lambda p, x, t: base.apply(p, x, t), pretrained, SCHEDULE, reward,
                            config, jax.random.key(1), sample_shape=(2,), workdir=tmp_path,
                            progress=False)
  assert again.history == [] and len(first.history) == 3
  for a, b in zip(jax.tree.leaves(first.trained), jax.tree.leaves(again.trained)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("changes, key", [
    (dict(alpha=0.0), "alpha"), (dict(alpha=-1.0), "alpha"), (dict(finetune="adapter"), "finetune"),
    (dict(truncation="random"), "truncation"), (dict(kl_reduction="max"), "kl_reduction"),
    (dict(max_truncation=99), "max_truncation"), (dict(eta=0.0), "eta"),
    (dict(lr_schedule="linear"), "lr_schedule")])
def test_bad_settings_fail_naming_the_setting(changes, key):
  with pytest.raises(ValueError, match=key):
    settings(**changes)


def test_cosine_schedule_decays_both_rates_to_zero_and_constant_keeps_them():
  trained = {"label_embedding": {"embedding": jnp.ones((3, 2))}, "lora": {"a": jnp.ones((2, 2))}}
  grads = jax.tree.map(jnp.ones_like, trained)

  def update_size(schedule, step):
    opt = finetune.optimizer(settings(lr_schedule=schedule, steps=10, weight_decay=0.0), trained)
    state = opt.init(trained)
    for _ in range(step):
      _, state = opt.update(grads, state, trained)
    updates, _ = opt.update(grads, state, trained)
    return [float(jnp.abs(u).max()) for u in jax.tree.leaves(updates)]

  np.testing.assert_allclose(update_size("constant", 9), update_size("constant", 0), rtol=1e-5)
  first, last = update_size("cosine", 0), update_size("cosine", 10)
  assert min(first) > 1e-4 and max(last) == 0.0
