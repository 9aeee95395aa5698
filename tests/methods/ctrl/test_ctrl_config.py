"""ctrl's config: bad values fail in `validate`, naming the key, before anything compiles."""
import pathlib

import pytest

from experiments import ctrl as ctrl_experiment
from jaxlab.core import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def smoke(**overrides):
  config = config_lib.load_config(ROOT / "configs" / "ctrl.py", "smoke")
  return config_lib.override(config, overrides) if overrides else config


@pytest.mark.parametrize("overrides, message", [
    ({"ctrl.alpha": 0.0}, "alpha"),
    ({"tasks": "mnist"}, "tasks"),
    ({"baselines": "dps"}, "baselines"),
    ({"data.offline_sizes": (5,)}, "offline_sizes"),
    ({"toy2d.prior.num_steps": 1}, "num_steps"),
    ({"digits.rl_steps": 0}, "digits.rl_steps"),
])
def test_bad_config_fails_before_compiling(overrides, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    ctrl_experiment.validate(smoke(**overrides))


def test_smoke_config_validates():
  ctrl_experiment.validate(smoke())


@pytest.mark.parametrize("overrides, message", [
    ({"data.offline_sizes": (5000,)}, "offline_sizes"),
    ({"digits.ink.num_both": 500}, "num_both"),
    ({"digits.prior.denoiser": "transformer"}, "denoiser"),
])
def test_bad_digits_config_fails_before_compiling(overrides, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    ctrl_experiment.validate(smoke(**overrides))


def test_a_group_steps_override_reaches_ctrl_and_cfg_and_leaves_the_config_alone():
  config = config_lib.load_config(ROOT / "configs" / "ctrl.py", "long")
  digits = ctrl_experiment.with_group_steps(config, "digits")
  assert (digits.train.steps, digits.ctrl.steps, digits.cfg.steps) == (1000, 1000, 1000)
  assert (config.train.steps, config.ctrl.steps, config.cfg.steps) == (2000, 2000, 2000)
  assert ctrl_experiment.with_group_steps(config, "toy2d") is config


def test_headline_names_the_better_cfg_and_needs_the_compositional_task():
  methods = {"ctrl": {"acc_joint": 0.47}, "cfg_w1": {"acc_joint": 0.2}, "cfg_w3": {"acc_joint": 0.41}}
  found = ctrl_experiment.headline({"digits_class_ink": {"n50": {"methods": methods}}})
  assert found["ours"] == "0.470 vs 0.410" and "cfg_w3" in found["name"]
  assert ctrl_experiment.headline({"toy2d": {}}) is None
