"""The decoder ISE trains: the zoo `Decoder` with a segment embedding added to its input.

h0 = embed(tokens) + use_segments * SegmentEmbedding(segments), then the decoder and its tied
read-out. `use_segments` is a per-replica scalar (1 for the `ise` and `ise_only` variants, 0
otherwise), so every variant is one parameter layout and one compiled function; a variant that
does not use segments never sees the table (its gradient there is zero).
"""
from __future__ import annotations

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.methods.ise import tasks
from jaxlab.zoo import embeddings
from jaxlab.zoo import functional
from jaxlab.zoo import transformer


@dataclasses.dataclass(frozen=True)
class ModelSpec(transformer.DecoderSpec):
  """The zoo decoder's size plus the segment table's initial scale."""
  segment_init_std: float = 0.01   # the official builder's N(0, 0.01^2)


class SegmentedDecoder(nnx.Module):
  """(tokens [B, L], segments [B, L], use_segments scalar) -> logits [B, L, vocab]."""

  def __init__(self, spec: ModelSpec, *, rngs: nnx.Rngs):
    self.decoder = spec.build(len(tasks.VOCAB), rngs=rngs)
    self.segment_embed = embeddings.SegmentEmbedding(tasks.NUM_SEGMENTS, spec.width,
                                                     init_std=spec.segment_init_std, rngs=rngs)

  def __call__(self, tokens: jax.Array, segments: jax.Array,
               use_segments: jax.Array | float = 1.0, *, positions: jax.Array | None = None,
               mask: jax.Array | None = None) -> jax.Array:
    """`positions` and `mask` as `Decoder`'s (default: 0..L-1, causal); packed rows pass both."""
    h = self.decoder.embed(tokens)
    h = h + jnp.asarray(use_segments, h.dtype) * self.segment_embed(segments)
    return self.decoder.attend(self.decoder(h, positions=positions, mask=mask))


def network(spec: ModelSpec) -> functional.Functional:
  return functional.Functional(lambda rngs: SegmentedDecoder(spec, rngs=rngs))
