"""Binarized tightening (reconstructed from the paper's Algorithm 1; unverified against the PDF).

An integer x in [l, u] has d = ceil(log2(u - l + 1)) virtual bits: the binary digits of
v = x - l, most significant first. A neighbourhood releases some bits. The bits before the first
released one stay fixed at the incumbent's, and every later bit is free, so the variable may
move within the aligned block of 2^(d - k) values that shares the incumbent's first k bits
(k = index of the first released bit), clipped to [l, u]:

    all bits fixed  -> {x^t}
    none fixed      -> [l, u]
    k leading fixed -> [l + (v >> (d - k)) << (d - k), that + 2^(d - k) - 1] clipped to u.

A binary variable has one bit: released = free in [0, 1], else fixed. Variables are handled
together as padded [n, D] bit arrays (D = the largest d; bit j of variable i exists if j < d_i).
"""
from __future__ import annotations

import numpy as np


def num_bits(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
  """d_i = ceil(log2(u_i - l_i + 1)) for integer bounds (0 where l_i = u_i)."""
  span = np.asarray(upper, np.int64) - np.asarray(lower, np.int64)
  if np.any(span < 0):
    raise ValueError("every lower bound must be <= its upper bound")
  return np.where(span > 0, np.ceil(np.log2(span + 1)).astype(np.int64), 0)


def encode(x: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
  """[n, D] bits of v = x - l, most significant first (D = max d; padding bits 0)."""
  x = np.rint(np.asarray(x, float)).astype(np.int64)
  lower = np.asarray(lower, np.int64)
  if np.any(x < lower) or np.any(x > np.asarray(upper, np.int64)):
    raise ValueError("the incumbent lies outside its bounds")
  bits = num_bits(lower, upper)
  width = int(bits.max(initial=0))
  value = x - lower
  shifts = bits[:, None] - 1 - np.arange(width)[None]        # bit j is 2^(d - 1 - j)
  valid = shifts >= 0
  return np.where(valid, (value[:, None] >> np.maximum(shifts, 0)) & 1, 0)


def tightened_bounds(x: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                     released: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(new lower, new upper) [n] given released bits [n, D] (True: released; padding ignored)."""
  x = np.rint(np.asarray(x, float)).astype(np.int64)
  lower, upper = np.asarray(lower, np.int64), np.asarray(upper, np.int64)
  bits = num_bits(lower, upper)
  released = np.asarray(released, bool)
  width = released.shape[1] if released.ndim == 2 else 0
  valid = np.arange(width)[None] < bits[:, None]
  released = released & valid
  any_released = released.any(axis=1)
  first = np.where(any_released, np.argmax(released, axis=1), bits)   # k fixed leading bits
  free = bits - first                                                   # trailing free bits
  value = x - lower
  block_start = (value >> free) << free
  new_lower = lower + block_start
  new_upper = np.minimum(new_lower + (np.int64(1) << free) - 1, upper)
  return new_lower, new_upper
