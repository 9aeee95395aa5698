"""A time-conditioned residual MLP for vectors: the UNet's counterpart for inputs without
spatial structure worth convolving (tiny images flattened, tabular data, low-dimensional states).

`(x [B, D_in], t [B]) -> [B, D_out]`. An input projection to `width`; the time embedding is an MLP
(Linear -> SiLU -> Linear) of `sinusoidal_embedding(t, width)`; each of `num_blocks` residual
blocks computes LayerNorm -> SiLU -> Linear, adds its own projection of SiLU(embedding), then
LayerNorm -> SiLU -> Linear, and adds the result to its input; the output is LayerNorm -> SiLU ->
a zero-initialised Linear, so a fresh model predicts exactly 0 (as the UNet does). With
`num_embeddings` set, a learned embedding of an integer `label` is added to the time embedding,
as in the UNet (`unet.add_label_embedding` gives pretrained params a zero label table).

A scalar `t` (every row at the same time, as in a sampling chain) takes a shorter road to the
same numbers: the embedding path (time MLP, label, each block's projection of the embedding)
depends only on (t, label), so it runs once per row of the label table instead of once per
sample: 5 of the 11 width x width products of a 3-block network.

On a CPU the whole network is a few dense matmuls, which run near the machine's matmul peak,
while 3x3 convolutions on 8x8 feature maps run at a fraction of it.
"""
from __future__ import annotations

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.zoo.mlp import MLP
from jaxlab.zoo.unet import add_label
from jaxlab.zoo.unet import check_label
from jaxlab.zoo.unet import sinusoidal_embedding


class _Block(nnx.Module):

  def __init__(self, width: int, *, rngs: nnx.Rngs):
    self.norm_in = nnx.LayerNorm(width, rngs=rngs)
    self.linear_in = nnx.Linear(width, width, rngs=rngs)
    self.embedding_projection = nnx.Linear(width, width, rngs=rngs)
    self.norm_out = nnx.LayerNorm(width, rngs=rngs)
    self.linear_out = nnx.Linear(width, width, rngs=rngs)

  def __call__(self, h: jax.Array, embedding: jax.Array,
               rows: jax.Array | None = None) -> jax.Array:
    """`embedding` [B, width], or with `rows` [B] a table whose rows `rows` are the samples'."""
    projected = self.embedding_projection(jax.nn.silu(embedding))
    if rows is not None:
      projected = projected[rows]
    update = self.linear_in(jax.nn.silu(self.norm_in(h))) + projected
    return h + self.linear_out(jax.nn.silu(self.norm_out(update)))


class ResidualMLP(nnx.Module):
  """Denoiser-shaped MLP `(x [B, in_features], t [B] or scalar, label [B] | None) ->
  [B, out_features]`."""

  def __init__(self, *, in_features: int, out_features: int, width: int = 256,
               num_blocks: int = 3, num_embeddings: int | None = None, rngs: nnx.Rngs):
    if width < 2 or num_blocks < 1:
      raise ValueError(f"need width >= 2 and num_blocks >= 1, got {width}, {num_blocks}")
    if num_embeddings is not None and num_embeddings < 1:
      raise ValueError(f"num_embeddings must be positive or None, got {num_embeddings}")
    self.in_features, self.width = in_features, width
    self.input_projection = nnx.Linear(in_features, width, rngs=rngs)
    self.time_mlp = MLP([width, width, width], activation="silu", rngs=rngs)
    self.label_embedding = (nnx.Embed(num_embeddings, width, rngs=rngs)
                            if num_embeddings is not None else None)
    self.blocks = nnx.List([_Block(width, rngs=rngs) for _ in range(num_blocks)])
    self.output_norm = nnx.LayerNorm(width, rngs=rngs)
    self.output_projection = nnx.Linear(width, out_features, kernel_init=nnx.initializers.zeros,
                                        rngs=rngs)

  def __call__(self, x: jax.Array, t: jax.Array, label: jax.Array | None = None) -> jax.Array:
    if x.ndim != 2 or x.shape[-1] != self.in_features:
      raise ValueError(f"expected x of shape [B, {self.in_features}], got {x.shape}")
    t = jnp.asarray(t)
    if t.ndim == 0:
      embedding, rows = self._shared_time_embedding(t, label, x.shape[0])
    else:
      chex.assert_shape(t, x.shape[:1])
      embedding = add_label(self.time_mlp(sinusoidal_embedding(t, self.width)),
                            self.label_embedding, label, t, "ResidualMLP")
      rows = None
    h = self.input_projection(x)
    for block in self.blocks:
      h = block(h, embedding, rows)
    return self.output_projection(jax.nn.silu(self.output_norm(h)))

  def _shared_time_embedding(self, t: jax.Array, label: jax.Array | None, batch: int
                             ) -> tuple[jax.Array, jax.Array | None]:
    """(table, rows): the embedding of every label at time `t` [num_embeddings, width] and each
    sample's row of it, or without labels the one embedding [1, width] (rows None: it
    broadcasts)."""
    check_label(self.label_embedding, label, "ResidualMLP")
    embedding = self.time_mlp(sinusoidal_embedding(t[None], self.width))
    if self.label_embedding is None:
      return embedding, None
    chex.assert_shape(label, (batch,))
    return embedding + self.label_embedding.embedding[...], label
