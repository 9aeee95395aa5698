"""Config errors name the problem before anything compiles."""
import pathlib

import ml_collections
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import train_loop

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "precision_ls.py"


def smoke():
  return config_lib.load_config(CONFIG, "smoke")


def test_presets_load_and_are_locked():
  for preset in config_lib.PRESETS:
    c = config_lib.load_config(CONFIG, preset)
    assert c.preset == preset
    with pytest.raises(AttributeError):
      c.not_a_key = 1


def test_parse_arg_types_and_extras():
  parsed = config_lib.parse_arg("smoke,steps=7,name=x,flag", steps=0, name="", flag=False)
  assert (parsed.preset, parsed.steps, parsed.name, parsed.flag) == ("smoke", 7, "x", True)


def test_unknown_preset_names_the_choices():
  with pytest.raises(config_lib.ConfigError,
                     match=r"unknown preset 'fast'; this config has smoke, quick, paper"):
    config_lib.load_config(CONFIG, "fast")
  with pytest.raises(config_lib.ConfigError, match=r"'smok' \(did you mean 'smoke'\?\)"):
    config_lib.load_config(CONFIG, "smok")


def test_long_preset_only_where_the_config_defines_it():
  with pytest.raises(config_lib.ConfigError,
                     match=r"unknown preset 'long'; this config has smoke, quick, paper$"):
    config_lib.parse_arg("long", steps=0)
  with_long = config_lib.PRESETS + ("long",)
  parsed = config_lib.parse_arg("long,steps=9", presets=with_long, steps=0)
  assert (parsed.preset, parsed.steps) == ("long", 9)
  assert config_lib.base_config(preset="long").preset == "long"
  with pytest.raises(config_lib.ConfigError, match="must include smoke, quick, paper"):
    config_lib.parse_arg("quick", presets=("quick", "long"))
  assert config_lib.results_stem("m", "quick") == "m"
  assert config_lib.results_stem("m", "long") == "m_long"


def test_unknown_key_is_named_with_a_suggestion():
  with pytest.raises(config_lib.ConfigError,
                     match=r"'train.stepz' \(did you mean 'train.steps'\?\)"):
    config_lib.override(smoke(), {"train.stepz": 3})


def test_wrong_type_is_named():
  with pytest.raises(config_lib.ConfigError, match=r"'train.steps' expects int"):
    config_lib.override(smoke(), {"train.steps": "many"})
  with pytest.raises(config_lib.ConfigError, match=r"'train.batch_size' must be positive"):
    config_lib.override(smoke(), {"train.batch_size": -8})


def test_bad_choice_is_named():
  with pytest.raises(config_lib.ConfigError, match=r"'precision'.*float32, float64"):
    config_lib.override(smoke(), {"precision": "float16"})


def test_batch_not_divisible_by_devices_fails_before_compiling(tmp_path):
  c = config_lib.override(smoke(), {"train.batch_size": 12})
  compiled = []

  def init(rng):
    compiled.append("init")
    return {}

  experiment = train_loop.Experiment(init=init, update=lambda s, b, r: (s, {}),
                                     train_data=lambda i, n: iter(()))
  with pytest.raises(config_lib.ConfigError, match=r"'train.batch_size' = 12.*8 devices"):
    train_loop.run(experiment, c, tmp_path)
  assert not compiled and not (tmp_path / "checkpoints").exists()


def test_with_overrides_copies():
  c = smoke()
  variant = config_lib.with_overrides(c, {"optim": {"lr": 0.5}, "model": {"depth": 1}})
  assert variant.optim.lr == 0.5 and variant.model.depth == 1 and c.optim.lr != 0.5


def test_method_specific_choice_is_named():
  from jaxlab.methods.precision_ls import training  # pylint: disable=g-import-not-at-top
  c = config_lib.override(smoke(), {"model.mixer": "mamba"})
  with pytest.raises(config_lib.ConfigError, match=r"'model.mixer' is 'mamba'.*baseconv"):
    training.make_experiment(c)


def test_get_missing_key_default():
  c = ml_collections.ConfigDict({"a": {"b": 1}})
  assert config_lib.get(c, "a.b") == 1 and config_lib.get(c, "a.c", None) is None


def test_select_names():
  c = ml_collections.ConfigDict({"data": {"tasks": "b, a", "none": "", "every": "all",
                                          "typo": "a,z"}})
  known = ("a", "b", "c")
  assert config_lib.select_names(c, "data.tasks", known) == ["b", "a"]
  assert config_lib.select_names(c, "data.every", known) == ["a", "b", "c"]
  assert config_lib.select_names(c, "data.none", known, allow_empty=True) == []
  with pytest.raises(config_lib.ConfigError, match="selects nothing"):
    config_lib.select_names(c, "data.none", known)
  with pytest.raises(config_lib.ConfigError, match="'data.typo' names 'z'"):
    config_lib.select_names(c, "data.typo", known)


def test_stage_dir_ignores_progress_and_changes_with_any_other_value(tmp_path):
  config = config_lib.base_config(preset="smoke")
  stages = config_lib.stage_dir(config, tmp_path)
  assert stages.startswith(str(tmp_path / "stages"))
  quiet = config_lib.base_config(preset="smoke")
  quiet.train.progress = not config.train.progress
  assert config_lib.stage_dir(quiet, tmp_path) == stages
  longer = config_lib.base_config(preset="smoke")
  longer.train.steps += 1
  assert config_lib.stage_dir(longer, tmp_path) != stages


def test_atomic_file_renames_on_success_and_leaves_nothing_on_error(tmp_path):
  from jaxlab.core import metrics  # pylint: disable=g-import-not-at-top
  path = tmp_path / "deep" / "stage.bin"
  with metrics.atomic_file(path, "wb") as f:
    f.write(b"done")
  assert path.read_bytes() == b"done"
  with pytest.raises(RuntimeError):
    with metrics.atomic_file(path, "wb") as f:
      f.write(b"half")
      raise RuntimeError("killed")
  assert path.read_bytes() == b"done"
  assert not (tmp_path / "deep" / "stage.bin.tmp").exists()
