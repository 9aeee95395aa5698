"""The zoo's denoisers behind one interface: `apply(params, x [B, ...], t [B], label=None)`.

* "residual_mlp": the zoo `ResidualMLP` on the flattened sample (any sample shape: 2-D points or
  small images);
* "unet": the zoo `UNet` on [B, H, W, C] images.

`build(kind, sample_shape, architecture, num_labels=None)` returns the `Functional` (for `init`)
and the apply function, whose output has x's shape. With `num_labels`, the network embeds a label
(the zoo's label embedding) and `label` is required. A method or a prior names its denoiser by
kind and architecture options, so the same network can be pretrained once and fine-tuned by
several methods.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax

from jaxlab.zoo import functional
from jaxlab.zoo import residual_mlp
from jaxlab.zoo import unet

KINDS = ("residual_mlp", "unet")
# The options each kind reads, with their defaults.
ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "residual_mlp": dict(width=256, num_blocks=3),
    "unet": dict(base_channels=32, channel_multipliers=(1, 2), groups=8, blocks_per_level=1,
                 attention_at_lowest=False),
}

# Options added after priors were first cached: recorded in the full option set only when they
# differ from these defaults, so the specs (and cache keys) of earlier priors stay the same.
LATER_OPTIONS: dict[str, dict[str, Any]] = {
    "residual_mlp": {},
    "unet": dict(attention_levels=(), num_heads=4),
}

# (params, x [B, ...], t [B], label [B] | None) -> [B, ...] like x
DenoiserApply = Callable[..., jax.Array]


def architecture(kind: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The kind's full option set: its defaults overridden by `options` (unknown keys fail)."""
  if kind not in KINDS:
    raise ValueError(f"unknown denoiser {kind!r}; choose one of {', '.join(KINDS)}")
  full = dict(ARCHITECTURE_DEFAULTS[kind])
  later = LATER_OPTIONS[kind]
  for key, value in (options or {}).items():
    if key not in full and key not in later:
      raise ValueError(f"denoiser {kind!r} has no option {key!r}; its options are "
                       f"{', '.join(sorted(full) + sorted(later))}")
    value = tuple(value) if isinstance(value, list) else value
    if key in later and value == later[key]:
      continue
    full[key] = value
  return full


def build(kind: str, sample_shape: Sequence[int], options: Mapping[str, Any] | None = None, *,
          num_labels: int | None = None) -> tuple[functional.Functional, DenoiserApply]:
  """(model, apply) of a `kind` denoiser for samples of `sample_shape` (without the batch)."""
  arch = architecture(kind, options)
  sample_shape = tuple(sample_shape)
  if kind == "residual_mlp":
    features = math.prod(sample_shape)
    model = functional.Functional(lambda rngs: residual_mlp.ResidualMLP(
        in_features=features, out_features=features, width=arch["width"],
        num_blocks=arch["num_blocks"], num_embeddings=num_labels, rngs=rngs))

    def apply(params, x, t, label=None):
      flat = model.apply(params, x.reshape(x.shape[0], features), t, label)
      return flat.reshape(x.shape)
    return model, apply
  if len(sample_shape) != 3:
    raise ValueError(f"the unet denoises [H, W, C] images, got sample shape {sample_shape}")
  channels = sample_shape[-1]
  model = functional.Functional(lambda rngs: unet.UNet(
      in_channels=channels, out_channels=channels, base_channels=arch["base_channels"],
      channel_multipliers=tuple(arch["channel_multipliers"]),
      blocks_per_level=arch["blocks_per_level"],
      attention_at_lowest=arch["attention_at_lowest"], groups=arch["groups"],
      num_heads=arch.get("num_heads", LATER_OPTIONS["unet"]["num_heads"]),
      attention_levels=tuple(arch.get("attention_levels", ())),
      num_embeddings=num_labels, rngs=rngs))
  return model, model.apply
