"""The prior cache: train once, load after; a directory holding another prior fails by name."""
import json

import jax
import numpy as np
import pytest

from jaxlab.diffusion import priors
from jaxlab.diffusion import schedules

SPEC = dict(dataset="digits", size=8, denoiser="residual_mlp", parameterization="eps",
            schedule="cosine", num_steps=10, steps=4, batch_size=16, lr=1e-3,
            warmup_fraction=0.25, grad_clip=1.0, ema_max=0.999, ema_power=0.75, seed=0,
            architecture={"width": 16, "num_blocks": 1})


def spec(**changes):
  return priors.PriorSpec.from_config({**SPEC, **changes})


def test_a_second_call_trains_zero_steps_and_returns_the_same_weights(tmp_path):
  first = priors.load_or_train(spec(), tmp_path, progress=False, ckpt_every=2)
  second = priors.load_or_train(spec(), tmp_path, progress=False, ckpt_every=2)
  assert (first.source, second.source) == ("trained", "loaded")
  assert 0 < second.train_s <= first.train_s   # the cost recorded when it was trained
  for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(second.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  lines = (tmp_path / f"digits-{spec().key()}" / "metrics.jsonl").read_text().splitlines()
  assert max(json.loads(line)["step"] for line in lines) == SPEC["steps"]
  x = np.zeros((3, 8, 8, 1), np.float32)
  assert first.apply(first.params, x, np.zeros(3, np.int32)).shape == x.shape
  assert second.summary()["source"] == "loaded"


def test_the_spec_decides_the_directory(tmp_path):
  assert spec().key() == spec().key()
  assert spec(seed=1).key() != spec().key()
  assert spec(architecture={"width": 32, "num_blocks": 1}).key() != spec().key()
  # Defaults written out or left implicit are the same spec.
  assert spec(dataset_options={"num_test": 360}).key() == spec().key()
  assert priors.directory(spec(), tmp_path).parent == tmp_path


def test_a_wrong_spec_file_fails_naming_the_key(tmp_path):
  where = priors.directory(spec(), tmp_path)
  where.mkdir(parents=True)
  recorded = {**spec().to_dict(), "format_version": priors.FORMAT_VERSION, "lr": 0.5}
  (where / "spec.json").write_text(json.dumps(recorded))
  with pytest.raises(ValueError, match="records lr = 0.5"):
    priors.load_or_train(spec(), tmp_path, progress=False)


def test_the_cache_root_is_the_argument_then_the_environment_then_home(tmp_path, monkeypatch):
  monkeypatch.setenv(priors.CACHE_ENV, str(tmp_path / "env"))
  assert priors.cache_root(tmp_path / "given") == tmp_path / "given"
  assert priors.cache_root() == tmp_path / "env" / "priors"
  monkeypatch.delenv(priors.CACHE_ENV)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert priors.cache_root() == tmp_path / "home" / ".cache" / "jaxlab" / "priors"


@pytest.mark.parametrize("changes, key", [
    (dict(dataset="cifar"), "dataset"), (dict(denoiser="transformer"), "denoiser"),
    (dict(parameterization="score"), "parameterization"), (dict(num_steps=1), "num_steps"),
    (dict(architecture={"depth": 3}), "depth"), (dict(dataset_options={"size": 3}), "size"),
    (dict(lr=0.0), "lr"), (dict(learning_rate=1e-3), "learning_rate")])
def test_bad_specs_fail_naming_the_key(changes, key):
  with pytest.raises(ValueError, match=key):
    spec(**changes)


def test_a_schedule_that_never_reaches_noise_fails_naming_num_steps():
  # DDPM's linear betas at T = 50 keep alpha_bar_T = 0.60: the sampler's N(0, I) start is a law
  # the model never saw. T = 1000 (DDPM's) and the cosine schedule at any T reach ~0.
  with pytest.raises(ValueError, match=r"num_steps.*alpha_bar_T = 0\.603"):
    spec(schedule="linear", num_steps=50)
  assert spec(schedule="linear", num_steps=1000).num_steps == 1000
  assert spec(schedule="cosine", num_steps=10).num_steps == 10
  assert schedules.terminal_alpha_bar(schedules.linear_betas(1000)) < 1e-4


def test_a_prior_on_two_dimensional_points(tmp_path):
  ring = priors.PriorSpec.from_config({**SPEC, "dataset": "gaussian_ring", "size": 256,
                                       "dataset_options": {"radius": 1.0}})
  prior = priors.load_or_train(ring, tmp_path, progress=False, ckpt_every=4)
  assert ring.sample_shape == (2,) and prior.source == "trained"
  out = prior.apply(prior.params, np.zeros((5, 2), np.float32), np.zeros(5, np.int32))
  assert out.shape == (5, 2)
