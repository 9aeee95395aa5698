"""The two studies of the reproduction: synthetic attention instances and a character LM.

Both prune with the four methods of `pruning` at every sparsity. On the LM, layers are pruned in
order, each calibrated on its attention input in the model whose earlier layers are already
pruned; the GD masks of all heads and lams run at once (`vmap`; the sparsities' inputs through
`core.replicas.map_replicas`), and a layer whose calibration input is the same for every
sparsity (the first) descends once and is binarised per sparsity.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.core import replicas
from jaxlab.methods.attention_pruning import charlm
from jaxlab.methods.attention_pruning import pruning
from jaxlab.methods.attention_pruning import synthetic

SETTINGS = ("merged", "factors")
BASELINES = ("magnitude", "wanda", "sparsegpt")
# Each ablation changes one reconstructed choice of the GD mask (README, Deviations).
ABLATIONS = {
    "score_mask_times_weight": dict(score="mask_times_weight"),
    "no_keep_values": dict(keep_values=False),
    "fixed_lam": dict(lams=(pruning.DEFAULT_LAM,)),
    "lam_div10": dict(lam_factor=0.1),
    "absolute_lam": dict(lam_scale="absolute"),
    "non_causal": dict(causal=False),
}
# A step counts as a rise only beyond float32 rounding of the loss.
MONOTONE_RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class GdOptions:
  """The GD mask's settings; each head takes the lam of `lams` whose binarised mask keeps its
  calibration attention matrix best (one lam: no choice)."""
  lams: tuple[float, ...] = pruning.DEFAULT_LAMS
  lam_scale: str = "curvature"
  steps: int = pruning.DEFAULT_STEPS
  iterations: int = pruning.POWER_ITERATIONS
  score: str = pruning.DEFAULT_SCORE
  keep_values: bool = True
  causal: bool = True

  def ablated(self, change: dict[str, Any]) -> "GdOptions":
    change = dict(change)
    factor = change.pop("lam_factor", 1.0)
    lams = tuple(float(lam) * factor for lam in change.pop("lams", self.lams))
    return dataclasses.replace(self, lams=lams, **change)


def is_monotone(losses: np.ndarray) -> bool:
  losses = np.asarray(losses, np.float64)
  return bool(np.all(np.diff(losses) <= MONOTONE_RTOL * np.abs(losses[:-1])))


def _summary(values: Sequence[float]) -> dict[str, Any]:
  values = [float(v) for v in values]
  return {"mean": float(np.mean(values)), "std": float(np.std(values)), "values": values}


# ------------------------------------------------------------------------------------------------
# (a) Synthetic instances: the merged matrix alone, non-causal.


def synthetic_study(*, logit_stds: Sequence[float], instances: int, num_tokens: int, width: int,
                    sparsities: Sequence[float], methods: Sequence[str], gd: GdOptions,
                    sparsegpt_options: dict[str, Any]) -> dict[str, Any]:
  """metrics.synthetic.c<c>.<method>.s<s>.{attn_err, out_err, linear_err} ({mean, std, values}
  over instances), the GD mask's chosen lam per instance (c<c>.gd_mask.s<s>.lam) and
  c<c>.gd_loss.{first, last} (at the grid's first lam) and monotone (every lam)."""
  out: dict[str, Any] = {}
  for c in logit_stds:
    rows: dict[str, dict[str, dict[str, list[float]]]] = {}
    firsts, lasts, monotone, chosen = [], [], [], {}
    for inst in synthetic.instances(c, instances, num_tokens=num_tokens, width=width):
      for method in methods:
        if method == "gd_mask":
          masks, losses = pruning.gd_mask_grid(inst.x, inst.w, lams=gd.lams, steps=gd.steps,
                                               causal=False, lam_scale=gd.lam_scale,
                                               iterations=gd.iterations)
          losses = np.asarray(losses)
          firsts.append(float(losses[0, 0]))
          lasts.append(float(losses[0, -1]))
          monotone.append(all(is_monotone(l) for l in losses))
          pruned = {}
          for s in sparsities:
            w_new, best, _ = pruning.select_binarised(inst.x, inst.w, masks, s, gd.score,
                                                      gd.keep_values)
            pruned[s] = np.asarray(w_new)
            chosen.setdefault(f"s{s}", []).append(gd.lams[int(best)])
        else:
          options = sparsegpt_options if method == "sparsegpt" else {}
          pruned = {s: pruning.prune(inst.x, inst.w, method, s, **options)[1]
                    for s in sparsities}
        for s, w_new in pruned.items():
          row = rows.setdefault(method, {}).setdefault(f"s{s}", {})
          row.setdefault("attn_err", []).append(pruning.attention_error(inst.x, inst.w, w_new))
          row.setdefault("out_err", []).append(
              pruning.output_error(inst.x, inst.w, w_new, inst.w_value))
          row.setdefault("linear_err", []).append(pruning.linear_error(inst.x, inst.w, w_new))
    block: dict[str, Any] = {
        method: {s: {k: _summary(v) for k, v in row.items()} for s, row in by_s.items()}
        for method, by_s in rows.items()}
    if firsts:
      block["gd_loss"] = {"first": _summary(firsts), "last": _summary(lasts),
                          "monotone": bool(all(monotone)),
                          "monotone_instances": int(sum(monotone))}
      for key, lams in chosen.items():
        block["gd_mask"][key]["lam"] = lams
    out[f"c{c}"] = block
  return out


# ------------------------------------------------------------------------------------------------
# (b) The character LM: prune every layer's heads in order.


@dataclasses.dataclass(frozen=True)
class LayerPruned:
  query_key: dict[str, jax.Array]     # what the backbone runs this layer with
  attn_err: float                     # relative error of f on the calibration input, mean of heads
  lams: tuple[float, ...] = ()        # the GD mask's lam per head (chosen on the calibration input)


@functools.partial(jax.jit, static_argnames=("options",))
def _continuous_masks(xs, weights, options: GdOptions):
  """GD masks for every calibration input, head and lam at once. xs [P, S, L, D] holds one
  calibration input per sparsity (P = 1 when they share it); weights is [H, D, D] (merged:
  masks [P, H, G, D, D]) or a pair of [H, D, Dh] (a pair of [P, H, G, D, Dh])."""
  common = dict(lams=options.lams, steps=options.steps, causal=options.causal,
                lam_scale=options.lam_scale, iterations=options.iterations)

  def every_head(x):
    if isinstance(weights, tuple):
      run = lambda w_q, w_k: pruning.gd_mask_factors_grid(x, w_q, w_k, **common)
      return jax.vmap(run)(*weights)
    return jax.vmap(lambda w: pruning.gd_mask_grid(x, w, **common))(weights)

  # Over the sparsities' inputs: a vmap on accelerators, one after another in one compiled loop
  # on a single CPU device (layer 1 of the quick LM, 4 sparsities x 4 heads x 3 lams: 16.8 s
  # vmapped, 15.1 s in turn, 14.7 s as four separate calls).
  return replicas.map_replicas(every_head)(xs)


def _heads_error(x: np.ndarray, merged: np.ndarray, merged_new: np.ndarray) -> float:
  return float(np.mean([pruning.attention_error(x, merged[h], merged_new[h], causal=True)
                        for h in range(merged.shape[0])]))


class LayerPruner:
  """Prunes one layer's heads with one method at every sparsity; the GD masks of all the
  sparsities' calibration inputs descend at once and are cached per layer."""

  def __init__(self, setting: str, method: str, gd: GdOptions, sparsegpt_options: dict):
    if setting not in SETTINGS:
      raise ValueError(f"unknown setting {setting!r}; choose one of {SETTINGS}")
    self.setting, self.method, self.gd, self.sparsegpt_options = (setting, method, gd,
                                                                  sparsegpt_options)
    self.seconds = 0.0
    self._masks: dict[Any, Any] = {}

  def masks(self, cache_key, xs, weights):
    """(masks, losses) for the calibration inputs xs [P, S, L, D], computed once per key."""
    if cache_key not in self._masks:
      found, losses = _continuous_masks(jnp.asarray(xs), weights, self.gd)
      self._masks[cache_key] = (jax.tree.map(np.asarray, found), np.asarray(losses))
    return self._masks[cache_key]

  def prune_layer(self, cache_key, xs: Sequence[np.ndarray], w_q: np.ndarray, w_k: np.ndarray,
                  sparsities: Sequence[float]) -> tuple[list[LayerPruned], np.ndarray | None]:
    """xs: the layer's calibration input [S, L, D] for each sparsity, or one input that serves
    them all (as the first layer's does); w_q, w_k [H, D, Dh]. Returns the pruned layer per
    sparsity and, for the GD mask, its losses [len(xs), H, G, steps + 1]."""
    if len(xs) not in (1, len(sparsities)):
      raise ValueError(f"need one calibration input or one per sparsity, got {len(xs)} for "
                       f"{len(sparsities)} sparsities")
    start = time.perf_counter()
    masks = losses = None
    if self.method == "gd_mask":
      weights = (jnp.asarray(charlm.merged_matrices(w_q, w_k)) if self.setting == "merged"
                 else (jnp.asarray(w_q), jnp.asarray(w_k)))
      masks, losses = self.masks(cache_key, np.stack(xs), weights)
    layers = []
    for i, sparsity in enumerate(sparsities):
      which = i if len(xs) > 1 else 0
      found = None if masks is None else jax.tree.map(lambda m: m[which], masks)
      layers.append(self._prune_at(xs[which], w_q, w_k, sparsity, found))
    self.seconds += time.perf_counter() - start
    return layers, losses

  def __call__(self, cache_key, x: np.ndarray, w_q: np.ndarray, w_k: np.ndarray,
               sparsity: float) -> tuple[LayerPruned, np.ndarray | None]:
    """One sparsity: `prune_layer` with a single calibration input."""
    layers, losses = self.prune_layer(cache_key, [x], w_q, w_k, [sparsity])
    return layers[0], losses

  def _prune_at(self, x, w_q, w_k, sparsity, masks) -> LayerPruned:
    merged = charlm.merged_matrices(w_q, w_k)
    chosen = []
    options = dict(sparsity=sparsity, score=self.gd.score, keep_values=self.gd.keep_values,
                   causal=self.gd.causal)
    if self.setting == "merged":
      if self.method == "gd_mask":
        heads = [pruning.select_binarised(x, merged[h], masks[h], **options)
                 for h in range(merged.shape[0])]
        merged_new = np.stack([np.asarray(w_new) for w_new, _, _ in heads])
        chosen = [int(best) for _, best, _ in heads]
      else:
        merged_new = np.stack([self._baseline(x, merged[h], sparsity)
                               for h in range(merged.shape[0])])
      query_key = {"merged": jnp.asarray(merged_new)}
    else:
      if self.method == "gd_mask":
        m_q, m_k = masks
        heads = [pruning.select_binarised_factors(x, w_q[h], w_k[h], m_q[h], m_k[h], **options)
                 for h in range(w_q.shape[0])]
        w_q_new = np.stack([np.asarray(head[0]) for head in heads])
        w_k_new = np.stack([np.asarray(head[1]) for head in heads])
        chosen = [int(head[2]) for head in heads]
      else:
        w_q_new = np.stack([self._baseline(x, w_q[h], sparsity) for h in range(w_q.shape[0])])
        w_k_new = np.stack([self._baseline(x, w_k[h], sparsity) for h in range(w_k.shape[0])])
      merged_new = charlm.merged_matrices(w_q_new, w_k_new)
      query_key = charlm.query_key_of_factors(w_q_new, w_k_new)
    lams = tuple(self.gd.lams[i] for i in chosen)
    return LayerPruned(query_key, _heads_error(x, merged, merged_new), lams)

  def dense_query_key(self, w_q: np.ndarray, w_k: np.ndarray) -> dict[str, jax.Array]:
    """The unpruned layer in this setting's form."""
    if self.setting == "merged":
      return {"merged": jnp.asarray(charlm.merged_matrices(w_q, w_k))}
    return charlm.query_key_of_factors(w_q, w_k)

  def _baseline(self, x, w, sparsity):
    options = self.sparsegpt_options if self.method == "sparsegpt" else {}
    return pruning.prune(x, w, self.method, sparsity, **options)[1]


def prune_model(model, params, *, vocab_size: int, num_heads: int, calibration: np.ndarray,
                validation: np.ndarray, pruner: LayerPruner, sparsities: Sequence[float],
                seed_key: Any) -> dict[str, Any]:
  """Every layer in order at each sparsity: {s<s>: {bpc, ppl, attn_err}} (the GD mask also
  s<s>.lam, [layer][head]) and whether every GD loss fell monotonically."""
  depth = len(params["blocks"])
  kernels = [charlm.attention_kernels(params, layer, num_heads) for layer in range(depth)]
  # Layers not yet pruned run with their own matrices in the setting's form (the same model,
  # tested), so every call below has one pytree structure and compiles once.
  query_keys = {s: [pruner.dense_query_key(*kernels[layer]) for layer in range(depth)]
                for s in sparsities}
  errors = {s: [] for s in sparsities}
  lams = {s: [] for s in sparsities}
  gd_losses = []
  for layer in range(depth):
    # The first layer's input does not depend on the sparsity: its GD masks are shared. A later
    # layer's input does (earlier layers are pruned): its masks descend for every sparsity at
    # once.
    xs = [charlm.attention_inputs(model, params, calibration, vocab_size, query_keys[s])[layer]
          for s in (sparsities[:1] if layer == 0 else sparsities)]
    pruned, losses = pruner.prune_layer((seed_key, layer), xs, *kernels[layer], sparsities)
    if losses is not None:
      gd_losses.append(losses)
    for s, layer_pruned in zip(sparsities, pruned):
      query_keys[s][layer] = layer_pruned.query_key
      errors[s].append(layer_pruned.attn_err)
      lams[s].append(list(layer_pruned.lams))
  out: dict[str, Any] = {}
  for s in sparsities:
    bpc = charlm.bits_per_character(model, params, validation, vocab_size, query_keys[s])
    out[f"s{s}"] = {"bpc": bpc, "ppl": 2.0 ** bpc, "attn_err": float(np.mean(errors[s]))}
    if pruner.method == "gd_mask":
      out[f"s{s}"]["lam"] = lams[s]
  if gd_losses:
    out["gd_loss_monotone"] = bool(all(is_monotone(l) for ls in gd_losses
                                       for l in np.reshape(ls, (-1, ls.shape[-1]))))
  return out


def dense_bpc(model, params, validation: np.ndarray, vocab_size: int) -> float:
  return charlm.bits_per_character(model, params, validation, vocab_size)


def perplexity(bpc: float) -> float:
  return float(2.0 ** bpc) if math.isfinite(bpc) else math.inf
