"""Hand-set BaseConv weights that compute one exact least-squares gradient.

For the `gradient` task (tokens [x, 0], [a_1, b_1], ..., [a_n, b_n]) two gated-convolution layers
suffice; any further layers are set to zero (identity blocks). Residual-stream channels:

  A (d)    a_i, or x at position 0        (read-in copies the token)
  B (1)    b_i
  P (d*d)  a_ij a_ik                      layer 1: identity conv, gated by A_k
  Q (d)    a_ij b_i                       layer 1: identity conv, gated by B
  X (d)    x at the last position         layer 1: conv tap at lag n (reaches position 0), gate 1;
                                          a second channel gated by -1 cancels the conv residual
  G (d)    g = (A^T A x - A^T b) / n      layer 2: conv taps 1/n at lags 0..n-1 (the sum over
                                          positions 1..n at the last one), gated by X_k (P) or -1
                                          (Q), summed over k by the output projection

The read-out returns G. Every map is one the BaseConv layer has (linear projections, a causal
long convolution with its residual, a bilinear gate), so this shows the architecture represents a
GD step exactly, not approximately. The official notebook builds a different 3-layer circuit (x
given at every position); this one reads x from the first token, as the trained models do.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def required_width(d: int) -> int:
  return (d + 1) + d * d + 3 * d


def handset_gradient_params(template: Any, *, d: int, n: int) -> Any:
  """Fills a BaseConv `Backbone` parameter tree (no LayerNorms, no MLP, conv residual on).

  `template` is any parameter tree of that backbone (e.g. from `Functional.init`); only its
  structure, shapes and dtypes are used.
  """
  params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), template)
  width = params["read_in"]["kernel"].shape[1]
  depth = len(params["blocks"])
  if width < required_width(d) or depth < 2:
    raise ValueError(f"the hand-set construction needs width >= {required_width(d)} and depth "
                     f">= 2; got width {width}, depth {depth}")
  if params["positions"].shape[0] < n + 1:
    raise ValueError(f"the construction needs max_len >= n + 1 = {n + 1}")
  for block in params["blocks"].values():
    if set(block) != {"mixer"}:
      raise ValueError("the construction expects blocks without LayerNorm or MLP")

  a_ch = np.arange(d)
  b_ch = d
  p_ch = d + 1 + np.arange(d * d).reshape(d, d)
  q_ch = d + 1 + d * d + np.arange(d)
  x_ch = q_ch + d
  g_ch = x_ch + d

  params["read_in"]["kernel"][np.arange(d + 1), np.arange(d + 1)] = 1.0
  params["read_out"]["kernel"][g_ch, np.arange(d)] = 1.0

  layer1 = params["blocks"][0]["mixer"]
  layer2 = params["blocks"][1]["mixer"]
  for block in params["blocks"].values():
    block["mixer"]["branch"][:] = [1.0, 0.0]

  # Layer 1. Internal channels: P (d*d), Q (d), X (d), X-cancel (d).
  internal = iter(range(width))
  for j in range(d):
    for k in range(d):
      c = next(internal)
      layer1["in_proj"]["kernel"][a_ch[j], c] = 1.0
      layer1["gate_proj"]["kernel"][a_ch[k], c] = 1.0
      layer1["out_proj"]["kernel"][c, p_ch[j, k]] = 1.0
  for j in range(d):
    c = next(internal)
    layer1["in_proj"]["kernel"][a_ch[j], c] = 1.0
    layer1["gate_proj"]["kernel"][b_ch, c] = 1.0
    layer1["out_proj"]["kernel"][c, q_ch[j]] = 1.0
  for j in range(d):
    copy, cancel = next(internal), next(internal)
    layer1["in_proj"]["kernel"][a_ch[j], [copy, cancel]] = 1.0
    layer1["conv"]["kernel"][n, copy] = 1.0           # lag n: the last position sees position 0
    layer1["gate_proj"]["bias"][[copy, cancel]] = [1.0, -1.0]
    layer1["out_proj"]["kernel"][[copy, cancel], x_ch[j]] = 1.0

  # Layer 2: mean over positions 1..n (lags 0..n-1 at the last position; the conv residual
  # already contributes 1 at lag 0), gated by x_k for P and by -1 for Q.
  mean_taps = np.full(n + 1, 1.0 / n)
  mean_taps[n] = 0.0
  mean_taps[0] -= 1.0
  internal = iter(range(width))
  for j in range(d):
    for k in range(d):
      c = next(internal)
      layer2["in_proj"]["kernel"][p_ch[j, k], c] = 1.0
      layer2["conv"]["kernel"][: n + 1, c] = mean_taps
      layer2["gate_proj"]["kernel"][x_ch[k], c] = 1.0
      layer2["out_proj"]["kernel"][c, g_ch[j]] = 1.0
  for j in range(d):
    c = next(internal)
    layer2["in_proj"]["kernel"][q_ch[j], c] = 1.0
    layer2["conv"]["kernel"][: n + 1, c] = mean_taps
    layer2["gate_proj"]["bias"][c] = -1.0
    layer2["out_proj"]["kernel"][c, g_ch[j]] = 1.0
  return jax.tree.map(jnp.asarray, params)


def perturbed(params: Any, key: jax.Array, scale: float) -> Any:
  """`params` plus independent N(0, scale^2) noise on every entry (zeros included): a model near
  the exact solution, whose gradient MSE grows as scale^2 (about 1.3e3 scale^2 at d=5, n=20)."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(treedef, [
      x + scale * jax.random.normal(k, jnp.shape(x), jnp.asarray(x).dtype)
      for x, k in zip(leaves, keys)])
