"""ADDT: the adversarial weight, CGPO with and without RBGM, the fine-tuning step (compiles once,
starts from the pretrained weights, EMA), the evaluation protocols and config checks."""
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import train_loop
from jaxlab.diffusion import priors
from jaxlab.diffusion import schedules
from jaxlab.methods.diffusion_purification import addt
from jaxlab.methods.diffusion_purification import evaluation
from jaxlab.methods.diffusion_purification import models
from jaxlab.methods.diffusion_purification import purification
from jaxlab.methods.diffusion_purification import reproduction
from jaxlab.methods.diffusion_purification import training

ROOT = pathlib.Path(__file__).resolve().parents[3]
SCHEDULE = schedules.cosine_schedule(50)


def smoke_config(**overrides):
  config = config_lib.load_config(ROOT / "configs" / "diffusion_purification.py", "smoke")
  return config_lib.with_overrides(config, overrides) if overrides else config


def test_adversarial_weight_is_the_clipped_snr_formula():
  t = jnp.arange(50)
  weight = addt.adversarial_weight(SCHEDULE, t, scale=0.03, maximum=0.3)
  alpha_bar = np.asarray(SCHEDULE.alphas_cumprod)
  expected = np.clip(0.03 * np.sqrt(alpha_bar) / np.sqrt(1 - alpha_bar), 0, 0.3)
  np.testing.assert_allclose(weight, expected, rtol=1e-5)
  assert float(weight[0]) == pytest.approx(0.3) and float(weight[-1]) < 0.01


def toy_models():
  """A linear x0 predictor and a linear classifier on 4x4 single-channel images."""
  weights = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)), jnp.float32)
  predict_x0 = lambda x, t: 0.8 * x
  classify = lambda x: x.reshape(x.shape[0], -1) @ weights
  return predict_x0, classify


def cgpo_inputs():
  x0 = jax.random.uniform(jax.random.key(0), (3, 4, 4, 1)) * 2 - 1
  labels = jnp.array([0, 1, 2])
  t = jnp.array([3, 10, 20])
  weight = addt.adversarial_weight(SCHEDULE, t, scale=0.5, maximum=0.9)
  return x0, labels, t, weight


def test_cgpo_with_rbgm_gives_a_gaussian_permutation_ordered_like_the_guidance():
  denoise, classify = toy_models()
  x0, labels, t, weight = cgpo_inputs()
  delta, guidance = addt.cgpo(denoise, classify, SCHEDULE, x0, labels, t, weight,
                              jax.random.key(1), iterations=3, perturbation="addt")
  for b in range(3):
    d, g = np.asarray(delta[b]).ravel(), np.asarray(guidance[b]).ravel()
    np.testing.assert_array_equal(np.argsort(d), np.argsort(g))
  assert np.abs(np.asarray(guidance)).sum() > 0


def test_cgpo_without_rbgm_standardises_the_guidance():
  denoise, classify = toy_models()
  x0, labels, t, weight = cgpo_inputs()
  delta, guidance = addt.cgpo(denoise, classify, SCHEDULE, x0, labels, t, weight,
                              jax.random.key(1), iterations=3, perturbation="addt_no_rbgm")
  np.testing.assert_allclose(delta, addt.standardise(guidance), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.mean(delta, axis=(1, 2)), 0, atol=1e-5)
  np.testing.assert_allclose(np.std(delta, axis=(1, 2)), 1, rtol=1e-4)


def test_cgpo_perturbation_raises_the_classifier_loss_over_random_gaussian_noise():
  denoise, classify = toy_models()
  x0, labels, t, weight = cgpo_inputs()
  delta, _ = addt.cgpo(denoise, classify, SCHEDULE, x0, labels, t, weight, jax.random.key(1),
                       iterations=5, perturbation="addt")
  random_delta = jax.random.normal(jax.random.key(7), x0.shape)

  def expected_loss(d):
    def loss(key):
      x_t = schedules.q_sample(SCHEDULE, x0, t, addt.mix_noise(
          jax.random.normal(key, x0.shape), d, weight))
      return jnp.mean(models.cross_entropy(classify(denoise(x_t, t)), labels))
    return float(jnp.mean(jax.vmap(loss)(jax.random.split(jax.random.key(3), 256))))
  assert expected_loss(delta) > expected_loss(random_delta) + 0.1


def test_plain_noise_is_just_gaussian_and_unknown_perturbations_fail():
  denoise, classify = toy_models()
  x0, labels, t, _ = cgpo_inputs()
  key = jax.random.key(4)
  noise, _ = addt.training_noise(denoise, classify, SCHEDULE, x0, labels, t, key,
                                 perturbation="plain", scale=0.03, maximum=0.3, iterations=5)
  np.testing.assert_array_equal(noise, jax.random.normal(jax.random.split(key)[1], x0.shape))
  with pytest.raises(ValueError, match="unknown perturbation"):
    addt.training_noise(denoise, classify, SCHEDULE, x0, labels, t, key, perturbation="pgd",
                        scale=0.03, maximum=0.3, iterations=5)


def test_ema_decay_warms_up_towards_its_maximum():
  decay = priors.ema_decay(jnp.array([0, 1, 10_000_000]), maximum=0.9999, power=0.75)
  np.testing.assert_allclose(decay, [0.0, 1 - 2 ** -0.75, 0.9999], rtol=1e-6)


def test_addt_finetune_step_compiles_once_and_starts_from_the_pretrained_weights(tmp_path):
  config = smoke_config(train={"steps": 3, "ckpt_every": 3, "log_every": 1})
  pretrained = models.denoiser(config)[0].init(jax.random.key(3))
  classifier = models.classifier(config)[0].init(jax.random.key(4))
  experiment = training.diffusion_experiment(config, 3, perturbation="addt",
                                             init_params=pretrained, classifier_params=classifier)
  state = experiment.init(jax.random.key(0))
  chex.assert_trees_all_equal(state["params"], pretrained)
  chex.assert_trees_all_equal(state["ema"], pretrained)
  traced = chex.assert_max_traces(experiment.update, n=1)
  result = train_loop.run(train_loop.Experiment(init=experiment.init, update=traced,
                                                train_data=experiment.train_data),
                          config, tmp_path)
  assert result.step == 3 and int(result.state["step"]) == 3
  with pytest.raises(ValueError, match="classifier"):
    training.diffusion_experiment(config, 3, perturbation="addt", init_params=pretrained)


def test_dwbox_evaluation_scores_the_purifier_with_the_attacked_keys():
  """With a vanishing budget the DW-box result is the accuracy of the one fixed purification."""
  config = smoke_config(attack={"epsilon": 1e-7, "step_size": 1e-7})
  classifier = jax.tree.map(lambda p: p + 0.05, models.classifier(config)[0].init(
      jax.random.key(0)))
  denoiser = jax.tree.map(lambda p: p + 0.01, models.denoiser(config)[0].init(jax.random.key(1)))
  x = jax.random.uniform(jax.random.key(2), (8, 8, 8, 1)) * 2 - 1
  logits = evaluation.defended_logits(config)
  y = jnp.argmax(logits(classifier, denoiser, x, jax.random.key(9)), -1)
  key = jax.random.key(5)
  out = evaluation.evaluator(config)(classifier, denoiser, x, y, key)
  dwbox_key = jax.random.split(key, 4)[3]
  expected = jnp.argmax(logits(classifier, denoiser, x, dwbox_key), -1) == y
  np.testing.assert_array_equal(out["robust_acc_dwbox"], expected.astype(np.float32))
  for name in evaluation.PROTOCOLS:
    assert out[name].shape == (8,) and np.all((0 <= out[name]) & (out[name] <= 1))


def test_purifier_keys_fix_every_noise():
  config = smoke_config()
  denoiser = jax.tree.map(lambda p: p + 0.01, models.denoiser(config)[0].init(jax.random.key(1)))
  _, apply = models.denoiser(config)
  x = jnp.zeros((2, 8, 8, 1))
  keys = jax.random.split(jax.random.key(0), purification.num_keys(config.diffusion.t_star))
  run = lambda k: purification.purify(lambda xt, t: apply(denoiser, xt, t),
                                      models.make_schedule(config), x, config.diffusion.t_star, k)
  np.testing.assert_array_equal(run(keys), run(keys))


@pytest.mark.parametrize("overrides,key", [
    ({"diffusion": {"t_star": 20}}, "diffusion.t_star"),
    ({"models": "pretrained,adversarial"}, "models"),
    ({"eval": {"num_images": 1000}}, "eval.num_images"),
    ({"eval": {"num_images": 12}}, "eval.num_images"),
    ({"prior": {"denoiser": "transformer"}}, "prior.denoiser"),
    ({"prior": {"architecture": {"depth": 2}}}, "prior.architecture"),
    ({"prior": {"num_steps": 2}}, "diffusion.t_star"),
    ({"addt": {"lambda_max": 1.5}}, "addt.lambda_max"),
    ({"attack": {"convergence_steps": 2}}, "attack.convergence_steps"),
    ({"eval": {"num_seeds": 0}}, "eval.num_seeds"),
])
def test_bad_configs_fail_with_the_key_named(overrides, key):
  with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
    reproduction.validate(smoke_config(**overrides))


def test_an_x0_model_regresses_the_clean_image_and_an_eps_model_the_noise():
  """Same update, same noise draw: only the regression target differs."""
  eps_config = smoke_config()
  x0_config = smoke_config(prior={"parameterization": "x0"})
  batch = {"image": jax.random.uniform(jax.random.key(0), (16, 8, 8, 1)) * 2 - 1,
           "label": jnp.arange(16) % 10}
  pretrained = models.denoiser(eps_config)[0].init(jax.random.key(3))
  losses = {}
  for name, config in (("eps", eps_config), ("x0", x0_config)):
    experiment = training.diffusion_experiment(config, 3, perturbation="plain",
                                               init_params=pretrained)
    _, metrics = experiment.update(experiment.init(jax.random.key(0)), batch, jax.random.key(1))
    losses[name] = float(metrics["loss"])
  # A fresh model outputs 0: the eps loss is E|n|^2 = 1, the x0 loss E|x0|^2, same noise draw.
  np.testing.assert_allclose(losses["x0"], float(jnp.mean(batch["image"] ** 2)), rtol=1e-5)
  assert abs(losses["eps"] - 1.0) < 0.2


def test_the_addt_claim_needs_paired_gains_beyond_two_standard_errors():
  rng = np.random.default_rng(0)
  plain = (rng.uniform(size=400) < 0.5).astype(np.float32)   # per-image robust correctness

  def summary(flips):
    """ADDT = plain with `flips` images turned from wrong to right (and none the other way)."""
    addt = plain.copy()
    addt[np.flatnonzero(plain == 0)[:flips]] = 1.0
    protocol = {"clean_acc": 0.9, "robust_acc_eot": 0.6, "robust_acc_dwbox": 0.5}
    paired = {p: reproduction.paired_gain(addt, plain) for p in evaluation.PROTOCOLS}
    return {"no_defence": {"robust_acc_pgd": 0.3}, "pretrained": protocol, "plain": protocol,
            "addt": protocol, "paired_gain": {"addt_vs_plain": paired}}
  claim = lambda s: {c["name"]: c for c in reproduction.claims(s)[0]}
  assert claim(summary(20))["addt_raises_robustness"]["holds"]        # +0.05, se ~0.011
  assert not claim(summary(1))["addt_raises_robustness"]["holds"]     # +0.0025, se 0.0025
  assert claim(summary(20))["addt_raises_robustness"]["paired"]["eot"]["n"] == 400
  assert "stochasticity_is_the_main_driver" not in claim(summary(20))   # no per-image test


def test_the_stochasticity_claim_is_a_paired_test_of_the_gains():
  n = 400
  undefended = (np.arange(n) < 120).astype(np.float32)               # 0.3
  eot = (np.arange(n) < 240).astype(np.float32)                      # gain 0.3

  def claim_for(dwbox_correct, convergence_difference=0.0):
    dwbox = (np.arange(n) < dwbox_correct).astype(np.float32)
    protocol = {"clean_acc": 0.9, "robust_acc_eot": 0.6, "robust_acc_dwbox": 0.5,
                evaluation.DWBOX_LONG: 0.5 + convergence_difference}
    summary = {"no_defence": {"robust_acc_pgd": 0.3}, "pretrained": protocol,
               "stochasticity": reproduction.stochasticity_test(eot, dwbox, undefended),
               "dwbox_convergence": {"difference": convergence_difference, "stderr": 0.01,
                                     "n": n, "steps": 20, "long_steps": 100}}
    return {c["name"]: c for c in reproduction.claims(summary)[0]}
  # DW-box gain 0.2 of an EOT gain 0.3: most of the gain stays, not the main driver.
  assert not claim_for(200)["stochasticity_is_the_main_driver"]["holds"]
  # Gain 0.15 = exactly half: not beyond two standard errors.
  assert not claim_for(180)["stochasticity_is_the_main_driver"]["holds"]
  # Gain 0.025: the gain disappears.
  held = claim_for(130)
  assert held["stochasticity_is_the_main_driver"]["holds"]
  assert held["dwbox_attack_converged"]["holds"]
  assert not claim_for(130, convergence_difference=-0.02)["dwbox_attack_converged"]["holds"]


def test_evaluate_pairs_models_over_every_purification_seed():
  config = smoke_config(eval={"num_images": 8}, attack={"convergence_steps": 3})
  classifier_params = models.classifier(config)[0].init(jax.random.key(0))
  denoiser = models.denoiser(config)[0].init(jax.random.key(1))
  # The zero-initialised output layer would make the purifier ignore its input noise.
  denoiser = jax.tree.map(lambda p: p + 0.05 * jnp.ones_like(p), denoiser)
  summary = reproduction.evaluate(config, classifier_params,
                                  {"pretrained": denoiser, "plain": denoiser})
  seeds = config.eval.num_seeds
  assert len(summary["pretrained"]["per_seed"]["robust_acc_eot"]) == seeds == 2
  assert set(summary["pretrained"]["seed_std"]) == set(evaluation.PROTOCOLS)
  # Only the pretrained purifier runs the DW-box attack on, to the convergence steps.
  assert evaluation.DWBOX_LONG in summary["pretrained"]
  assert evaluation.DWBOX_LONG not in summary["plain"]
  assert summary["dwbox_convergence"]["long_steps"] == config.attack.convergence_steps
  # PGD-100 ran in the first seed: it is compared with that seed's PGD-20, not the seed mean.
  pretrained = summary["pretrained"]
  np.testing.assert_allclose(
      summary["dwbox_convergence"]["difference"],
      pretrained[evaluation.DWBOX_LONG] - pretrained["per_seed"]["robust_acc_dwbox"][0],
      atol=1e-6)
  assert summary["stochasticity"]["n"] == 8 and summary["num_seeds"] == seeds
  # The same model under the same keys: every paired difference is exactly zero.
  for protocol in evaluation.PROTOCOLS:
    assert summary["paired_gain"]["plain_vs_pretrained"][protocol]["difference"] == 0.0
