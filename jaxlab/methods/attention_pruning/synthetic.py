"""Synthetic attention instances, from near-linear to saturated softmax.

X ~ N(0, 1) of shape [N, d]; W Gaussian, rescaled so the logits X W X^T have standard deviation
exactly `logit_std` on that X (0.5: the softmax is nearly linear in the logits; 5: rows are
dominated by a few keys); W_V ~ N(0, 1/d) for the output error f(X, W) X W_V.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Instance:
  x: np.ndarray        # [N, d]
  w: np.ndarray        # [d, d], the merged query-key matrix
  w_value: np.ndarray  # [d, d]
  logit_std: float


def instance(seed: int, *, num_tokens: int, width: int, logit_std: float) -> Instance:
  if num_tokens < 2 or width < 1 or logit_std <= 0:
    raise ValueError(f"need num_tokens >= 2, width >= 1, logit_std > 0; got {num_tokens}, "
                     f"{width}, {logit_std}")
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((num_tokens, width)).astype(np.float32)
  w = rng.standard_normal((width, width)).astype(np.float32)
  w *= logit_std / float(np.std(x @ w @ x.T))
  w_value = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
  return Instance(x, w.astype(np.float32), w_value, float(logit_std))


def instances(logit_std: float, count: int, *, num_tokens: int, width: int,
              seed: int = 0) -> list[Instance]:
  """`count` instances at one logit scale; instance i uses the same X and W shape draw at every
  scale (seed + i), so the scales differ only in the softmax's regime."""
  return [instance(seed + i, num_tokens=num_tokens, width=width, logit_std=logit_std)
          for i in range(count)]
