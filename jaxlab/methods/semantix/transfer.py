"""Semantix's sampler and the baselines, each one jitted function of (params, images, key).

Every method starts from the same two inversions (edit-friendly DDPM, `diffusion.inversion`) of
the context and the reference over the visited steps, and replays the context's noise maps from
step `t_start`:

* `semantix` (and its ablations `no_style`, `no_spatial`, `no_sd`, `no_pe`): at guided steps
  (t >= t_stop) eps' = eps + eta sqrt(1 - abar_t) grad_x E(x_t), E from `energy`, with the
  features of the output, the context and the reference at the same step;
* `global_guidance`: the same, with E_style replaced by per-channel mean/std matching (no
  correspondence);
* `reconstruction`: no guidance (replays the context);
* `kv_injection` (StyleID): the start latent AdaIN-ed to the reference's latent; at guided steps
  the chosen decoder self-attention layers attend to the reference's keys and values with the
  query blended towards the context's and a temperature;
* `adain_sdedit`: the context AdaIN-ed to the reference in pixels, noised to `sdedit_start` and
  sampled with fresh noise.

`transfer(prior, context, reference, key, settings, method)` is the public entry point; images
are [B, H, W, 3] in [0, 1].
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.diffusion import inversion
from jaxlab.diffusion import schedules
from jaxlab.methods.semantix import energy as energy_lib
from jaxlab.zoo import unet as unet_lib

ENERGY_METHODS = ("semantix", "global_guidance", "no_style", "no_spatial", "no_sd", "no_pe")
METHODS = ENERGY_METHODS + ("reconstruction", "kv_injection", "adain_sdedit")


@dataclasses.dataclass(frozen=True)
class Settings:
  """The static choices of a run (a change compiles anew)."""
  visited: int
  t_start: float
  t_stop: float
  sdedit_start: float
  normalize_gradient: bool
  style_taps: tuple[str, ...]
  spatial_taps: tuple[str, ...]
  sd_tap: str
  match_tap: str
  soft_temperature: float | None
  kv_layers: tuple[str, ...]
  kv_query_blend: float
  kv_temperature: float

  def __post_init__(self):
    if not 0.0 <= self.t_stop < self.t_start <= 1.0:
      raise ValueError(f"the guidance window needs 0 <= sampler.t_stop < sampler.t_start <= 1, "
                       f"got t_start={self.t_start}, t_stop={self.t_stop}")
    if not 0.0 < self.sdedit_start <= 1.0:
      raise ValueError(f"sampler.sdedit_start must be in (0, 1], got {self.sdedit_start}")


class Weights(NamedTuple):
  """The traced guidance weights (changing them does not compile anew)."""
  eta: jax.Array
  style: jax.Array
  spatial: jax.Array
  sd: jax.Array
  pe: jax.Array


def method_weights(method: str, eta: float, style: float, spatial: float, sd: float,
                   pe: float) -> Weights:
  """The weights a method runs with: its ablation zeroes one term."""
  values = dict(eta=eta, style=style, spatial=spatial, sd=sd, pe=pe)
  zeroed = {"no_style": "style", "no_spatial": "spatial", "no_sd": "sd", "no_pe": "pe"}
  if method in zeroed:
    values[zeroed[method]] = 0.0
  return Weights(**{k: jnp.asarray(v, jnp.float32) for k, v in values.items()})


def check_taps(settings: Settings, tap_names: tuple[str, ...],
               attention_names: tuple[str, ...]) -> None:
  """Every named tap and attention layer exists in the prior's UNet (before compiling)."""
  wanted = settings.style_taps + settings.spatial_taps + (settings.sd_tap, settings.match_tap)
  unknown = [t for t in wanted if t not in tap_names]
  if unknown:
    raise ValueError(f"guidance taps {unknown} are not in the prior's UNet; it has "
                     f"{', '.join(tap_names)}")
  missing = [layer for layer in settings.kv_layers if layer not in attention_names]
  if missing:
    raise ValueError(f"kv_injection.layers {missing} are not self-attention layers of the prior "
                     f"(it has {', '.join(attention_names)})")


def visited_steps(settings: Settings, num_train_steps: int) -> tuple[np.ndarray, int, int]:
  """(timesteps [K], start index, number of guided steps from the start down)."""
  steps = inversion.evenly_spaced(num_train_steps, settings.visited)
  start = int(np.searchsorted(steps, settings.t_start * num_train_steps, side="right") - 1)
  stop = int(np.searchsorted(steps, settings.t_stop * num_train_steps, side="left"))
  if start < 0 or stop > start:
    raise ValueError(f"no visited step lies in the guidance window [{settings.t_stop}, "
                     f"{settings.t_start}] x T with {settings.visited} of {num_train_steps} steps")
  return steps, start, stop


def adain(x: jax.Array, style: jax.Array, eps: float = 1e-5) -> jax.Array:
  """Per-image, per-channel mean and std of x [B, H, W, C] matched to those of style."""
  mean = lambda a: jnp.mean(a, axis=(1, 2), keepdims=True)
  std = lambda a: jnp.sqrt(jnp.var(a, axis=(1, 2), keepdims=True) + eps)
  return (x - mean(x)) / std(x) * std(style) + mean(style)


def _energy(method: str, settings: Settings, weights: Weights, out: dict, ctx: dict,
            ref: dict) -> jax.Array:
  if method == "global_guidance":
    style = sum(energy_lib.global_style_energy(out[t], ref[t]) for t in settings.style_taps)
  else:
    match = energy_lib.correspondence(ctx[settings.match_tap], ref[settings.match_tap],
                                      pe_weight=weights.pe,
                                      temperature=settings.soft_temperature)
    style = 0.0
    for tap in settings.style_taps:
      weights_at = _resample_matching(match, ctx[settings.match_tap], out[tap])
      style = style + energy_lib.style_energy(out[tap], ref[tap], weights_at)
  spatial = sum(energy_lib.spatial_energy(out[t], ctx[t]) for t in settings.spatial_taps)
  sd = energy_lib.semantic_distance(out[settings.sd_tap], ctx[settings.sd_tap])
  return weights.style * style + weights.spatial * spatial + weights.sd * sd


def _resample_matching(match: jax.Array, match_feature: jax.Array, feature: jax.Array
                       ) -> jax.Array:
  """Matching weights [B, N, N] found at the match tap's grid, carried to a tap of another
  (square, power-of-two) grid so that a match of identical images stays the identity.

  Finer tap (factor f): position i in coarse cell c(i) at offset o(i) goes to the position at
  the same offset in the cells c(i) is matched to. Coarser tap: a cell takes the matches of its
  top-left fine position, summed over the fine positions of each target cell.
  """
  side_match, side = match_feature.shape[1], feature.shape[1]
  if side == side_match:
    return match
  rows, cols = np.divmod(np.arange(side * side), side)
  if side > side_match:
    f = side // side_match
    cell = (rows // f) * side_match + cols // f
    offset = (rows % f) * f + cols % f
    same_offset = jnp.asarray(offset[:, None] == offset[None, :], match.dtype)
    return match[:, cell][:, :, cell] * same_offset[None]
  f = side_match // side
  top_left = (rows * f) * side_match + cols * f                   # fine index of each cell
  fine_rows, fine_cols = np.divmod(np.arange(side_match * side_match), side_match)
  coarse_of_fine = (fine_rows // f) * side + fine_cols // f
  pool = jax.nn.one_hot(coarse_of_fine, side * side, dtype=match.dtype)   # [N_fine, N]
  return jnp.einsum("bij,jc->bic", match[:, top_left], pool)


class Inverted(NamedTuple):
  """Edit-friendly inversions of a batch of contexts and references over the visited steps."""
  context: jax.Array            # [K, B, H, W, 3] x at each visited step
  context_maps: jax.Array       # [K, B, H, W, 3] the context's noise maps
  reference: jax.Array          # [K, B, H, W, 3]
  context_x0: jax.Array         # [B, H, W, 3] in [-1, 1]
  reference_x0: jax.Array


@functools.lru_cache(maxsize=None)
def invert_function(apply, settings_visited: int):
  """jit((params, schedule, context, reference, key) -> Inverted), images in [-1, 1]."""
  def run(params, schedule, context, reference, key):
    steps = inversion.evenly_spaced(schedule.num_steps, settings_visited)
    denoise = lambda x, t: apply(params, x, t)
    ctx_key, ref_key = jax.random.split(key)
    xs_ctx, maps = inversion.ddpm_invert(denoise, schedule, context,
                                         jax.random.split(ctx_key, len(steps)), steps)
    xs_ref, _ = inversion.ddpm_invert(denoise, schedule, reference,
                                      jax.random.split(ref_key, len(steps)), steps)
    return Inverted(xs_ctx, maps, xs_ref, context, reference)
  return jax.jit(run)


@functools.lru_cache(maxsize=None)
def transfer_function(apply, settings: Settings, method: str):
  """jit((params, schedule, inverted, key, weights) -> images in [-1, 1]): one compile per
  method and settings; the weights are traced."""
  if method not in METHODS:
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
  wanted = tuple(sorted(set(settings.style_taps + settings.spatial_taps
                            + (settings.sd_tap, settings.match_tap))))
  kv_taps = tuple(f"{layer}_{x}" for layer in settings.kv_layers for x in ("q", "k", "v"))

  def run(params, schedule, inverted, key, weights):
    num_train = schedule.num_steps
    steps, start, stop = visited_steps(settings, num_train)
    denoise = lambda x, t: apply(params, x, t)
    taps = lambda x, t, names: apply(params, x, t, taps=names)[1]
    context, reference = inverted.context_x0, inverted.reference_x0
    xs_ctx, maps, xs_ref = inverted.context, inverted.context_maps, inverted.reference
    if method == "adain_sdedit":
      start_x0 = adain(context, reference)
      sd_steps, sd_start, _ = visited_steps(
          dataclasses.replace(settings, t_start=settings.sdedit_start, t_stop=0.0), num_train)
      t0 = jnp.full((context.shape[0],), sd_steps[sd_start], jnp.int32)
      noise_keys = jax.random.split(key, len(sd_steps) + 1)
      x = schedules.q_sample(schedule, start_x0, t0,
                             jax.random.normal(noise_keys[-1], context.shape))
      fresh = jax.vmap(lambda k: jax.random.normal(k, context.shape))(noise_keys[:-1])
      fresh = fresh.at[0].set(0.0)       # the last step to x0 carries no noise
      return inversion.replay(denoise, schedule, x, fresh, sd_steps, start_index=sd_start)

    x_start = xs_ctx[start]
    if method == "reconstruction":
      return inversion.replay(denoise, schedule, x_start, maps, steps, start_index=start)

    if method == "kv_injection":
      x_start = adain(x_start, xs_ref[start])

      def injected_minus_plain(x, t, k):
        ref = taps(xs_ref[k], t, kv_taps)
        ctx = taps(xs_ctx[k], t, kv_taps)
        override = {layer: unet_lib.AttentionOverride(
            key=ref[f"{layer}_k"], value=ref[f"{layer}_v"], query=ctx[f"{layer}_q"],
            query_blend=settings.kv_query_blend, temperature=settings.kv_temperature)
            for layer in settings.kv_layers}
        return apply(params, x, t, attention_override=override) - denoise(x, t)

      # At guided steps the hook turns the plain eps into the injected denoiser's.
      guidance = lambda x, t, k: jax.lax.cond(
          k >= stop, lambda y: injected_minus_plain(y, t, k), jnp.zeros_like, x)
      return inversion.replay(denoise, schedule, x_start, maps, steps, start_index=start,
                              guidance=guidance)

    def guidance(x, t, k):
      def guided(x):
        ctx = taps(xs_ctx[k], t, wanted)
        ref = taps(xs_ref[k], t, wanted)
        grad = jax.grad(lambda y: _energy(method, settings, weights, taps(y, t, wanted), ctx,
                                          ref) * y.shape[0])(x)
        if settings.normalize_gradient:
          rms = jnp.sqrt(jnp.mean(jnp.square(grad), axis=(1, 2, 3), keepdims=True))
          grad = grad / (rms + 1e-8)
        scale = jnp.sqrt(1.0 - schedule.alphas_cumprod[t])[:, None, None, None]
        return weights.eta * scale * grad
      return jax.lax.cond(k >= stop, guided, jnp.zeros_like, x)

    return inversion.replay(denoise, schedule, x_start, maps, steps, start_index=start,
                            guidance=guidance)

  return jax.jit(run)


def check_images(context, reference) -> None:
  if context.ndim != 4 or context.shape[-1] != 3 or context.shape != reference.shape:
    raise ValueError(f"context and reference must both be [B, H, W, 3], got {context.shape} and "
                     f"{reference.shape}")


def invert(prior, context: jax.Array, reference: jax.Array, key: jax.Array,
           settings: Settings) -> Inverted:
  """Inversions of images [B, H, W, 3] in [0, 1], shared by every method of a batch."""
  check_images(context, reference)
  return invert_function(prior.apply, settings.visited)(
      prior.params, prior.schedule, jnp.asarray(context) * 2 - 1,
      jnp.asarray(reference) * 2 - 1, key)


def transfer(prior, context: jax.Array, reference: jax.Array, key: jax.Array,
             settings: Settings, method: str, weights: Weights | None = None,
             inverted: Inverted | None = None) -> jax.Array:
  """Images [B, H, W, 3] in [0, 1]: the context restyled after the reference by `method`.
  `inverted` (from `invert` with the same images and key) skips the inversions."""
  check_images(context, reference)
  invert_key, sample_key = jax.random.split(key)
  if inverted is None:
    inverted = invert(prior, context, reference, invert_key, settings)
  weights = weights if weights is not None else method_weights(method, 1.0, 1.0, 1.0, 1.0, 1.0)
  out = transfer_function(prior.apply, settings, method)(prior.params, prior.schedule, inverted,
                                                        sample_key, weights)
  return jnp.clip((out + 1) / 2, 0.0, 1.0)
