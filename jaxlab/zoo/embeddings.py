"""Embedding tables added to token embeddings.

* `SegmentEmbedding`: one learned vector per segment id (which message or role a token came
  from), N(0, init_std^2) at init; added to the token embedding before the first block.
"""
from __future__ import annotations

import chex
from flax import nnx
import jax
import jax.numpy as jnp


class SegmentEmbedding(nnx.Module):
  """Segment ids [...] -> vectors [..., width]; ids must lie in 0..num_segments-1."""

  def __init__(self, num_segments: int, width: int, *, init_std: float = 0.01,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if num_segments < 1:
      raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    self.num_segments, self.width = num_segments, width
    self.table = nnx.Embed(num_segments, width, param_dtype=param_dtype,
                           embedding_init=nnx.initializers.normal(init_std), rngs=rngs)

  def __call__(self, segments: jax.Array) -> jax.Array:
    chex.assert_type(segments, int)
    return self.table(segments)
