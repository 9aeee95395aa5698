"""semantix: the energy and its correspondence, the metrics, the restyled pairs, the transfer's
input checks and one compile per method."""
import functools

import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import parallel
from jaxlab.data import scenes
from jaxlab.diffusion import priors
from jaxlab.diffusion import schedules
from jaxlab.methods.semantix import energy
from jaxlab.methods.semantix import metrics
from jaxlab.methods.semantix import transfer
from jaxlab.zoo import functional
from jaxlab.zoo import unet
from experiments import semantix as semantix_experiment

CONFIG = config_lib.__file__.replace("jaxlab/core/config.py", "configs/semantix.py")


@functools.cache
def tiny_prior():
  """One jitted init for every test of a process: eagerly, the UNet's ~40 initialisers and the
  perturbation compile one small kernel per shape (7.5 s against 1-3 s)."""
  model = functional.Functional(lambda rngs: unet.UNet(
      in_channels=3, out_channels=3, base_channels=8, channel_multipliers=(1, 2), groups=4,
      num_heads=2, attention_levels=(0, 1), rngs=rngs))
  params = jax.jit(lambda key: jax.tree.map(
      lambda p: p + 0.05 * jax.random.normal(jax.random.key(4), p.shape), model.init(key)))(
          jax.random.key(0))

  class Prior:
    pass
  prior = Prior()
  prior.apply, prior.params = model.apply, params
  prior.schedule = schedules.cosine_schedule(20)
  return prior, model


SETTINGS = transfer.Settings(
    visited=10, t_start=0.6, t_stop=0.2, sdedit_start=0.4, normalize_gradient=True,
    style_taps=("dec0_1", "dec1_1"), spatial_taps=("dec1_q",), sd_tap="mid", match_tap="dec1_1",
    soft_temperature=None, kv_layers=("dec0", "dec1"), kv_query_blend=0.75, kv_temperature=1.5)


def test_identical_images_match_themselves_and_give_zero_energy_and_gradient():
  prior, _ = tiny_prior()
  x = jax.random.uniform(jax.random.key(1), (2, 8, 8, 3), minval=-1, maxval=1)
  t = jnp.asarray([5, 5])
  taps = ("dec0_1", "dec1_1", "dec1_q", "mid")
  features = jax.jit(lambda y: prior.apply(prior.params, y, t, taps=taps)[1])(x)
  match = energy.correspondence(features["dec1_1"], features["dec1_1"], pe_weight=1.0)
  np.testing.assert_array_equal(jnp.argmax(match, -1), jnp.tile(jnp.arange(16), (2, 1)))
  weights = transfer.method_weights("semantix", 1.0, 1.0, 1.0, 1.0, 1.0)

  def total(y):
    out = prior.apply(prior.params, y, t, taps=taps)[1]
    return transfer._energy("semantix", SETTINGS, weights, out, features, features)

  value, grad = jax.jit(jax.value_and_grad(total))(x)
  assert abs(float(value)) < 1e-6
  assert float(jnp.abs(grad).max()) < 1e-5


def test_energy_gradient_matches_finite_differences():
  prior, _ = tiny_prior()
  keys = jax.random.split(jax.random.key(2), 3)
  x, ctx, ref = (jax.random.uniform(k, (1, 8, 8, 3), minval=-1, maxval=1) for k in keys)
  t = jnp.asarray([6])
  taps = ("dec0_1", "dec1_1", "dec1_q", "mid")
  get = lambda y: prior.apply(prior.params, y, t, taps=taps)[1]
  weights = transfer.method_weights("semantix", 1.0, 1.0, 1.0, 1.0, 0.5)
  total = jax.jit(
      lambda y: transfer._energy("semantix", SETTINGS, weights, get(y), get(ctx), get(ref)))
  grad = jax.jit(jax.grad(total))(x)
  direction = jax.random.normal(jax.random.key(5), x.shape)
  h = 1e-2
  numeric = (total(x + h * direction) - total(x - h * direction)) / (2 * h)
  np.testing.assert_allclose(float(jnp.sum(grad * direction)), float(numeric), rtol=2e-2)


def test_global_style_energy_is_zero_for_matching_statistics():
  f = jax.random.normal(jax.random.key(0), (2, 4, 4, 8))
  shuffled = f[:, ::-1, ::-1]
  assert float(energy.global_style_energy(shuffled, f)) < 1e-6
  assert float(energy.global_style_energy(f * 2, f)) > 0.1


def test_metrics_on_hand_computed_cases():
  a = np.zeros((1, 8, 8, 3))
  b = np.full((1, 8, 8, 3), 0.1)
  np.testing.assert_allclose(metrics.psnr(a, b), 20.0)
  image = np.random.default_rng(0).uniform(size=(2, 16, 16, 3))
  np.testing.assert_allclose(metrics.ssim(image, image), 1.0)
  assert metrics.ssim(image, image[::-1])[0] < 0.5
  classes = np.zeros((1, 8, 8), int)
  classes[:, 4:] = 1
  out = np.zeros((1, 8, 8, 3))
  ideal = np.zeros((1, 8, 8, 3))
  ideal[:, 4:] = [0.3, 0.4, 0.0]      # class 1 is off by |(0.3, 0.4, 0)| = 0.5, class 0 by 0
  np.testing.assert_allclose(metrics.class_colour_error(out, ideal, classes), 0.25)
  identity = np.eye(4)[None]
  grid = np.zeros((1, 4, 4), int)
  grid[:, 2:] = 1
  np.testing.assert_allclose(metrics.class_agreement(identity, grid, grid), 1.0)
  np.testing.assert_allclose(metrics.class_agreement(identity, grid, 1 - grid), 0.0)


def test_restyling_a_scene_by_itself_renders_it_and_pairs_know_their_ideal():
  scene = scenes.sample_scene(scenes.scene_rng(0, 3))
  np.testing.assert_array_equal(scenes.render(scenes.restyle(scene, scene))["image"],
                                scenes.render(scene)["image"])
  pairs = scenes.semantix_pairs(3, seed=5)
  assert pairs["ideal"].shape == (3, 32, 32, 3)
  assert set(np.unique(pairs["context_classes"])) <= {0, 1, 2}
  first = scenes.semantix_pairs(1, seed=5)
  np.testing.assert_array_equal(first["ideal"][0], pairs["ideal"][0])


def test_every_method_runs_and_compiles_once(monkeypatch):
  prior, _ = tiny_prior()
  chex.clear_trace_counter()
  monkeypatch.setattr(energy, "semantic_distance",
                      chex.assert_max_traces(energy.semantic_distance, n=1))
  transfer.transfer_function.cache_clear()
  images = jax.random.uniform(jax.random.key(0), (2, 2, 8, 8, 3))
  for eta in (0.5, 2.0):      # new weights, no new trace
    weights = transfer.method_weights("semantix", eta, 1.0, 1.0, 1.0, 1.0)
    out = transfer.transfer(prior, images[0], images[1], jax.random.key(1), SETTINGS,
                            "semantix", weights)
    assert out.shape == (2, 8, 8, 3) and bool(jnp.all(jnp.isfinite(out)))
  for method in ("reconstruction", "kv_injection", "adain_sdedit"):
    out = transfer.transfer(prior, images[0], images[1], jax.random.key(1), SETTINGS, method)
    assert out.shape == (2, 8, 8, 3)
  transfer.transfer_function.cache_clear()


def test_bad_inputs_fail_before_compiling():
  prior, _ = tiny_prior()
  with pytest.raises(ValueError, match=r"\[B, H, W, 3\]"):
    transfer.transfer(prior, jnp.zeros((2, 8, 8, 3)), jnp.zeros((2, 8, 8, 1)),
                      jax.random.key(0), SETTINGS, "semantix")
  smoke = config_lib.load_config(CONFIG, "smoke")
  for override, key in (({"sampler": {"t_stop": 0.7}}, "t_stop"),
                        ({"guidance": {"style_taps": ("dec9_0",)}}, "dec9_0"),
                        ({"methods": "semantix,styleid"}, "methods"),
                        ({"sampler": {"visited": 2}}, "sampler")):
    with pytest.raises(config_lib.ConfigError, match=key):
      semantix_experiment.settings(config_lib.with_overrides(smoke, override))


def test_a_rerun_reuses_finished_stages_and_a_new_config_does_not(monkeypatch, tmp_path):
  """Tuning and each method's outputs are kept per config: after an interrupted run (one
  method's outputs missing) only that method samples again; the pairs are inverted once more
  for it. The sampler itself is faked: this tests the bookkeeping, not the transfer."""
  config = config_lib.load_config(CONFIG, "smoke")
  methods = config.methods.split(",")
  calls = {"tune": 0, "invert": 0, "run": []}

  class FakePrior:
    source, train_s = "fake", 0.0

  def fake_tune(*args):
    del args
    calls["tune"] += 1
    base = dict(eta=1.0, pe_weight=1.0, spatial_weight=1.0, sd_weight=1.0)
    return {"chosen": {"semantix": dict(base), "global_guidance": dict(base)}, "grid": []}

  def fake_invert(*args):
    del args
    calls["invert"] += 1
    return []

  def fake_run(prior, run, method, weights, pairs, inverted):
    del prior, run, weights, inverted
    calls["run"].append(method)
    return np.clip(pairs["ideal"] + 0.05 * len(calls["run"]), 0.0, 1.0)

  monkeypatch.setattr(semantix_experiment.priors, "load_or_train",
                      lambda *args, **kwargs: FakePrior())
  monkeypatch.setattr(semantix_experiment.priors, "replicated_on", lambda prior, mesh: prior)
  monkeypatch.setattr(semantix_experiment, "tune", fake_tune)
  monkeypatch.setattr(semantix_experiment, "invert_pairs", fake_invert)
  monkeypatch.setattr(semantix_experiment, "run_method", fake_run)
  monkeypatch.setattr(semantix_experiment, "correspondence_accuracy",
                      lambda prior, run, pairs, pe: {
                          name: np.ones(len(pairs["context"]))
                          for name in ("features_pe", "features_only", "pe_only")})
  monkeypatch.setattr(semantix_experiment.results, "save_figure", lambda *args, **kwargs: None)

  first = semantix_experiment.main(config, str(tmp_path))
  assert calls == {"tune": 1, "invert": 1, "run": methods}
  stages = config_lib.stage_dir(config, str(tmp_path))
  (tmp_path / stages / f"{methods[-1]}.npz").unlink()
  second = semantix_experiment.main(config, str(tmp_path))
  assert calls == {"tune": 1, "invert": 2, "run": methods + [methods[-1]]}
  assert second["metrics"][methods[0]] == first["metrics"][methods[0]]
  assert second["metrics"][methods[-1]] != first["metrics"][methods[-1]]
  fresh = lambda: config_lib.load_config(CONFIG, "smoke")   # `override` works in place
  changed = config_lib.override(fresh(), {"data.num_pairs": 8})
  assert config_lib.stage_dir(changed, str(tmp_path)) != stages
  quiet = config_lib.override(fresh(), {"train.progress": True})
  assert config_lib.stage_dir(quiet, str(tmp_path)) == stages


def test_pairs_split_over_devices_give_the_outputs_of_one_device():
  """The experiment splits each batch over the devices that divide it (4 of the tests' 8 here),
  the prior replicated on them, instead of computing the whole batch on every device."""
  prior, _ = tiny_prior()
  whole = priors.Prior(apply=prior.apply, params=prior.params, schedule=prior.schedule,
                       spec=None, source="test", train_s=0.0, call_s=0.0, directory="")
  images = np.asarray(jax.random.uniform(jax.random.key(0), (2, 4, 8, 8, 3)))
  pairs = {"context": images[0], "reference": images[1]}
  weights = transfer.method_weights("semantix", 1.0, 1.0, 1.0, 1.0, 1.0)
  outputs = []
  for devices in (jax.devices(), jax.devices()[:1]):
    mesh = parallel.batch_mesh(4, devices=devices)
    placed = priors.replicated_on(whole, mesh)
    inverted = semantix_experiment.invert_pairs(placed, SETTINGS, pairs, 4, 0, mesh)
    outputs.append(semantix_experiment.run_method(placed, SETTINGS, "semantix", weights, pairs,
                                                  inverted))
    assert len(inverted[0][2].context.sharding.device_set) == min(len(devices), 4)
  np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-5)
