"""Config helpers shared by every `configs/<slug>.py`.

A config file defines `get_config(arg=None)` and returns a locked `ml_collections.ConfigDict` with
the fixed groups below. `arg` is the text after `:` in `--config=configs/<slug>.py:<arg>`: a preset
name (`smoke`, `quick`, `paper`, and `long` for configs that define it) optionally followed by
`,key=value` pairs, as in big_vision's `parse_arg`: `quick,seeds=3`.

This module imports no JAX, so loading a config is instant and never touches a backend.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import importlib.util
import json
import os
from typing import Any, Iterable, Mapping, Sequence

import ml_collections
from ml_collections import config_dict

PRESETS = ("smoke", "quick", "paper")   # every config has these
# `long`: a claim's converged regime past the quick budget (<= 90 min on 2 cores); a config that
# defines it passes `presets=PRESETS + ("long",)` to `parse_arg`.
OPTIONAL_PRESETS = ("long",)
ALL_PRESETS = PRESETS + OPTIONAL_PRESETS
# Presets whose results are published under results/ (`<slug>.json`, `<slug>_long.json`).
PUBLISHED_PRESETS = ("quick", "long")
PRECISIONS = ("float32", "float64")


class ConfigError(ValueError):
  """A config is invalid; the message names the key and what is allowed."""


def parse_arg(arg: str | None, *, default_preset: str = "quick",
              presets: Sequence[str] = PRESETS,
              **defaults: Any) -> ml_collections.ConfigDict:
  """Parses `"<preset>[,key=value,...]"` into a ConfigDict with `preset` and typed extras.

  `presets` are the presets this config defines (the three standard ones, plus `long` where the
  config has it). Values are parsed with the type of their default in `defaults`; a bare `key` is
  `True`.
  """
  presets = tuple(presets)
  unknown = [p for p in presets if p not in ALL_PRESETS]
  if unknown or not set(PRESETS) <= set(presets):
    raise ConfigError(f"a config's presets must include {', '.join(PRESETS)} and may add "
                      f"{', '.join(OPTIONAL_PRESETS)}; got {', '.join(presets)}")
  parsed = ml_collections.ConfigDict(dict(preset=default_preset, **defaults))
  if not arg:
    return parsed
  parts = [p.strip() for p in arg.split(",") if p.strip()]
  if parts and "=" not in parts[0] and parts[0] not in defaults:
    parsed.preset = parts.pop(0)
  for part in parts:
    key, _, text = part.partition("=")
    if key == "preset":
      parsed.preset = text
      continue
    if key not in defaults:
      raise ConfigError(
          f"unknown config argument {key!r} in {arg!r}; "
          f"allowed: preset, {', '.join(sorted(defaults)) or '(none)'}")
    parsed[key] = _parse_value(text, defaults[key], key) if text else True
  if parsed.preset not in presets:
    raise ConfigError(unknown_preset_message(parsed.preset, presets))
  return parsed


def argument_keys(config_file_argument: str) -> list[str]:
  """The keys set after the preset in `"<file>.py:<preset>,key=value,..."` (none for a bare
  preset): what makes a run differ from its preset, like a `--config.<key>` override."""
  _, _, arg = config_file_argument.partition(":")
  parts = [p.strip() for p in arg.split(",") if p.strip()]
  keys = [p.partition("=")[0] for p in parts if "=" in p]
  return [k for k in keys if k != "preset"]


def unknown_preset_message(preset: str, presets: Sequence[str]) -> str:
  close = difflib.get_close_matches(preset, presets, n=1)
  hint = f" (did you mean {close[0]!r}?)" if close else ""
  return f"unknown preset {preset!r}{hint}; this config has {', '.join(presets)}"


def _parse_value(text: str, default: Any, key: str) -> Any:
  if isinstance(default, str):
    return text
  expected = f"config key {key!r} expects {type(default).__name__}, got {text!r}"
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError) as e:
    raise ConfigError(expected) from e
  if isinstance(default, bool) != isinstance(value, bool) or (
      isinstance(default, (int, float)) and not isinstance(value, (int, float))):
    raise ConfigError(expected)
  return type(default)(value) if isinstance(default, float) else value


def base_config(*, preset: str, seed: int = 0) -> ml_collections.ConfigDict:
  """The fixed groups every experiment config has. Fill them, then call `finalize`."""
  if preset not in ALL_PRESETS:
    raise ConfigError(unknown_preset_message(preset, ALL_PRESETS))
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.seed = seed
  c.precision = "float32"
  c.model = ml_collections.ConfigDict()
  c.data = ml_collections.ConfigDict()
  c.optim = ml_collections.ConfigDict()
  c.train = ml_collections.ConfigDict(dict(
      steps=1000, batch_size=32, log_every=50, eval_every=500, ckpt_every=500,
      max_to_keep=2, progress=True))
  c.eval = ml_collections.ConfigDict(dict(batch_size=256, num_batches=4))
  # Mesh axis sizes; -1 means "all remaining devices". Data parallel by default.
  c.mesh = ml_collections.ConfigDict(dict(data=-1))
  return c


def finalize(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks what can be checked without devices, then locks the config."""
  validate(c)
  c.lock()
  return c


@dataclasses.dataclass(frozen=True)
class _Rule:
  key: str
  kind: type | tuple[type, ...]
  positive: bool = False
  choices: Sequence[Any] | None = None


_BASE_RULES = (
    _Rule("seed", int),
    _Rule("preset", str, choices=ALL_PRESETS),
    _Rule("precision", str, choices=PRECISIONS),
    _Rule("train.steps", int, positive=True),
    _Rule("train.batch_size", int, positive=True),
    _Rule("train.log_every", int, positive=True),
    _Rule("train.eval_every", int, positive=True),
    _Rule("train.ckpt_every", int, positive=True),
    _Rule("train.max_to_keep", int, positive=True),
)


def validate(c: ml_collections.ConfigDict, device_count: int | None = None) -> None:
  """Raises `ConfigError` naming the first bad key.

  With `device_count`, also checks that every batch size divides over the data axis (the check
  that needs devices, done by the train loop before anything compiles).
  """
  for rule in _BASE_RULES:
    value = get(c, rule.key)
    if isinstance(value, bool) or not isinstance(value, rule.kind):
      raise ConfigError(f"config key {rule.key!r} must be {_type_name(rule.kind)}, "
                        f"got {value!r} ({type(value).__name__})")
    if rule.positive and value <= 0:
      raise ConfigError(f"config key {rule.key!r} must be positive, got {value}")
    if rule.choices is not None and value not in rule.choices:
      raise ConfigError(f"config key {rule.key!r} is {value!r}; "
                        f"choose one of {', '.join(map(str, rule.choices))}")
  if device_count is not None:
    data_devices = data_axis_size(c, device_count)
    for key in ("train.batch_size", "eval.batch_size"):
      size = get(c, key, None)
      if size is not None and size % data_devices:
        raise ConfigError(
            f"config key {key!r} = {size} is not divisible by the {data_devices} devices of "
            f"the data axis; use a multiple of {data_devices} (or set --config.mesh.data)")


def data_axis_size(c: ml_collections.ConfigDict, device_count: int) -> int:
  """Size of the `data` mesh axis for this config on `device_count` devices."""
  size = c.mesh.data
  if size == -1:
    return device_count
  if not isinstance(size, int) or size <= 0 or device_count % size:
    raise ConfigError(f"config key 'mesh.data' = {size!r} must be -1 or a divisor of the "
                      f"{device_count} available devices")
  return size


def select_names(c: ml_collections.ConfigDict, key: str, known: Iterable[str], *,
                 allow_empty: bool = False) -> list[str]:
  """`c.<key>` is "all" or a comma-separated subset of `known` (or "" when `allow_empty`):
  the selected names, with a ConfigError naming the key and the choices otherwise."""
  known = tuple(known)
  value = get(c, key)
  if value == "all":
    return list(known)
  chosen = [name.strip() for name in value.split(",") if name.strip()]
  for name in chosen:
    if name not in known:
      raise ConfigError(f"config key {key!r} names {name!r}; choose 'all' or a comma-separated "
                        f"subset of {', '.join(known)}")
  if not chosen and not allow_empty:
    raise ConfigError(f"config key {key!r} selects nothing; choose 'all' or a comma-separated "
                      f"subset of {', '.join(known)}")
  return chosen


def require_choice(c: ml_collections.ConfigDict, key: str, choices: Iterable[Any]) -> Any:
  """Returns `c.<key>` if it is one of `choices`, else raises a ConfigError naming both."""
  choices = tuple(choices)
  value = get(c, key)
  if value not in choices:
    raise ConfigError(
        f"config key {key!r} is {value!r}; choose one of {', '.join(map(str, choices))}")
  return value


def require(condition: bool, key: str, message: str) -> None:
  """Raises a ConfigError about `key` unless `condition` holds."""
  if not condition:
    raise ConfigError(f"config key {key!r}: {message}")


def get(c: ml_collections.ConfigDict, key: str, *default: Any) -> Any:
  """`get(c, "train.steps")`; unknown keys raise a ConfigError with a suggestion."""
  node = c
  for i, part in enumerate(key.split(".")):
    if not isinstance(node, (ml_collections.ConfigDict, config_dict.FrozenConfigDict)) or (
        part not in node):
      if default:
        return default[0]
      raise ConfigError(_unknown_key_message(node, key, ".".join(key.split(".")[:i])))
    node = node[part]
  return node


def override(c: ml_collections.ConfigDict,
             overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """Applies `{"train.steps": 100, ...}` in place, as `--config.train.steps=100` would.

  Unknown keys and wrong types raise a ConfigError that names the key (the config stays locked, so
  a typo never silently adds a new field).
  """
  for key, value in overrides.items():
    parent_key, _, leaf = key.rpartition(".")
    parent = get(c, parent_key) if parent_key else c
    if not isinstance(parent, ml_collections.ConfigDict) or leaf not in parent:
      raise ConfigError(_unknown_key_message(parent, key, parent_key))
    if isinstance(value, str) and not isinstance(parent[leaf], str):
      value = _parse_value(value, parent[leaf], key)
    try:
      parent[leaf] = value
    except TypeError as e:
      raise ConfigError(f"config key {key!r} expects {type(parent[leaf]).__name__}, "
                        f"got {value!r} ({type(value).__name__})") from e
  validate(c)
  return c


def _unknown_key_message(node: Any, key: str, parent_key: str) -> str:
  known = sorted(node.keys()) if hasattr(node, "keys") else []
  leaf = key.split(".")[len(parent_key.split(".")) if parent_key else 0]
  close = difflib.get_close_matches(leaf, known, n=1)
  if close:
    suggestion = f"{parent_key}.{close[0]}" if parent_key else close[0]
    return f"unknown key {key!r} (did you mean {suggestion!r}?)"
  where = f"under {parent_key!r}" if parent_key else "at the top level"
  return f"unknown key {key!r}; keys {where}: {', '.join(known)}"


def _type_name(kind: type | tuple[type, ...]) -> str:
  kinds = kind if isinstance(kind, tuple) else (kind,)
  return " or ".join(k.__name__ for k in kinds)


def results_stem(slug: str, preset: str) -> str:
  """The name results/ uses for a published preset: `<slug>` (quick), `<slug>_long` (long)."""
  return slug if preset == "quick" else f"{slug}_{preset}"


def load_config(path: str | os.PathLike, arg: str | None = None) -> ml_collections.ConfigDict:
  """Loads `get_config(arg)` from a config file, as `--config=path:arg` does."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ConfigError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location(
      f"jaxlab_config_{os.path.splitext(os.path.basename(path))[0]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def fingerprint(c: ml_collections.ConfigDict, ignore: Sequence[str] = ("train.progress",)
                ) -> str:
  """A short hash of every value but `ignore`d keys: names a config's resumable stages, so a
  changed config never reuses another's."""
  values = {k: v for k, v in flatten(c.to_dict()).items() if k not in ignore}
  text = json.dumps(values, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def stage_dir(c: ml_collections.ConfigDict, workdir: str | os.PathLike) -> str:
  """`<workdir>/stages/<fingerprint>`: where an experiment keeps the finished stages it resumes
  from (labels, tuned settings, samples), so a changed config never reuses another's."""
  return os.path.join(os.fspath(workdir), "stages", fingerprint(c))


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}."""
  flat = {}
  for key, value in nested.items():
    path = f"{prefix}{key}"
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      flat.update(flatten(dict(value), f"{path}."))
    else:
      flat[path] = value
  return flat


def with_overrides(c: ml_collections.ConfigDict,
                   nested_overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A locked copy of `c` with nested overrides applied (e.g. one variant of a sweep)."""
  copy = ml_collections.ConfigDict(c.to_dict())
  copy.lock()
  return override(copy, flatten(nested_overrides))
