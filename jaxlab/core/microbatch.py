"""Gradients of a batch-mean loss computed over equal microbatches, accumulated in a scan.

Mathematically the same value and gradient as one pass over the whole batch (the mean of equal-size
microbatch means is the batch mean); only the float rounding order differs. On CPUs it is also
faster: a small model's per-step activations at a large batch spill out of the per-core L2 cache,
and streaming them from memory cost more than the scan's extra loop (measured on this project's
2-core machine in `benchmarks/precision_ls_speed.py`).

Microbatches are strided: microbatch j holds examples j, j + count, j + 2 count, ... (count
microbatches). A batch sharded over a data mesh on its leading axis then splits on each device
into local microbatches; contiguous ones would put whole microbatches on one device, and the scan
over them would gather every microbatch to every device.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

LossFn = Callable[[Any, Any], jax.Array]


def split_batch(batch: Any, microbatch: int) -> Any:
  """Every leaf [B, ...] -> [B // microbatch, microbatch, ...], microbatch j holding the
  examples j, j + B // microbatch, ... (strided: each device's shard splits locally)."""
  def split(x):
    if x.shape[0] % microbatch:
      raise ValueError(f"batch of {x.shape[0]} does not split into microbatches of {microbatch}")
    count = x.shape[0] // microbatch
    return jnp.swapaxes(x.reshape((microbatch, count) + x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def value_and_grad(loss_fn: LossFn, microbatch: int | None) -> Callable[[Any, Any], Any]:
  """`jax.value_and_grad(loss_fn)` for a loss that is a mean over the batch's leading axis,
  evaluated `microbatch` examples at a time. `microbatch` None (or >= the batch) is one pass."""
  whole = jax.value_and_grad(loss_fn)

  def fn(params, batch):
    size = jax.tree.leaves(batch)[0].shape[0]
    if not microbatch or microbatch >= size:
      return whole(params, batch)
    chunks = split_batch(batch, microbatch)

    def accumulate(totals, chunk):
      loss, grads = whole(params, chunk)
      return jax.tree.map(jnp.add, totals, (loss, grads)), None

    shapes = jax.eval_shape(whole, params, jax.tree.map(lambda x: x[0], chunks))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    (loss, grads), _ = jax.lax.scan(accumulate, zeros, chunks)
    count = size // microbatch
    return loss / count, jax.tree.map(lambda g: g / count, grads)

  return fn
