"""JetFormer: a Jet flow turns image patches into soft tokens; a decoder models them with a GMM.

Sequences (one decoder, both directions, chosen per example):
  generation     [BOS, class x R, BOI, t_1 ... t_N]   the GMM at BOI, t_1, ... predicts t_1, ...
  understanding  [BOI, t_1 ... t_N, BOS, class x R]   the logits at BOS predict the class
The class prefix is the label repeated R = `class_repeats` times, copy i looked up in its own
block of the vocabulary (as the official class-conditional model: a one-token prefix would give
the decoder a single embedding to attend to). Only the first `ar_dim` dimensions of each flow
output token are modelled autoregressively; the rest ("factored out") get a N(0, 1) prior. Model
pieces come from the zoo: `flows.Jet`, `transformer.Decoder`, `gmm.MixtureHead`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.zoo import flows
from jaxlab.zoo import gmm
from jaxlab.zoo import mlp
from jaxlab.zoo import transformer

LOG_2PI = math.log(2 * math.pi)


class Vocabulary(NamedTuple):
  """Classes 0..C-1, then the special tokens; `repeats` offset copies of that block."""
  num_classes: int
  repeats: int = 1

  @property
  def no_label(self) -> int:
    return self.num_classes

  @property
  def bos(self) -> int:
    return self.num_classes + 1

  @property
  def boi(self) -> int:
    return self.num_classes + 2

  @property
  def block_size(self) -> int:
    return self.num_classes + 3

  @property
  def size(self) -> int:
    return self.block_size * self.repeats

  def class_prefix(self, labels: jax.Array) -> jax.Array:
    """Labels (or `no_label`) [B] -> prefix tokens [B, repeats]: copy i in vocabulary block i."""
    return labels[:, None] + self.block_size * jnp.arange(self.repeats)[None, :]


class JetFormer(nnx.Module):
  """Flow (optional) + decoder (optional) + GMM head over tokens [B, N, token_dim].

  `use_flow=False` models raw patches (the flow is the identity); `use_decoder=False` is Jet
  alone with a N(0, 1) prior on every dimension.
  """

  def __init__(self, *, num_tokens: int, token_dim: int, ar_dim: int, num_classes: int,
               use_flow: bool, use_decoder: bool, jet_depth: int, jet_width: int,
               jet_conditioner_depth: int, jet_heads: int, width: int, depth: int,
               num_heads: int, num_kv_heads: int, mlp_dim: int, num_mixtures: int,
               dropout: float, class_repeats: int = 1, embed_init_std: float | None = None,
               rngs: nnx.Rngs):
    if not 0 < ar_dim <= token_dim:
      raise ValueError(f"ar_dim must be in 1..token_dim={token_dim}, got {ar_dim}")
    self.num_tokens, self.token_dim, self.ar_dim = num_tokens, token_dim, ar_dim
    if class_repeats < 1:
      raise ValueError(f"class_repeats must be >= 1, got {class_repeats}")
    self.vocab = Vocabulary(num_classes, class_repeats)
    self.flow = (flows.Jet(num_tokens, token_dim, depth=jet_depth, kinds=("channels",),
                           width=jet_width, conditioner_depth=jet_conditioner_depth,
                           num_heads=jet_heads, rngs=rngs) if use_flow else None)
    self.decoder = (transformer.Decoder(
        vocab_size=self.vocab.size, width=width, depth=depth, num_heads=num_heads,
        num_kv_heads=num_kv_heads, mlp_dim=mlp_dim, dropout=dropout,
        embed_init_std=embed_init_std, rngs=rngs)
                    if use_decoder else None)
    self.read_in = (nnx.Linear(ar_dim, width, dot_general=mlp.flat_dot_general, rngs=rngs)
                    if use_decoder else None)
    self.head = gmm.MixtureHead(width, num_mixtures, ar_dim, rngs=rngs) if use_decoder else None

  def encode(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Tokens [B, N, C] -> (z [B, N, C], log|det dz/dtokens| [B])."""
    if self.flow is None:
      return tokens, jnp.zeros(tokens.shape[:1], tokens.dtype)
    return self.flow.forward(tokens)

  def decode(self, z: jax.Array) -> jax.Array:
    return z if self.flow is None else self.flow.inverse(z)

  @property
  def prefix_length(self) -> int:
    """Positions before the first image token's prediction in generation order (BOS, class)."""
    return 1 + self.vocab.repeats

  def sequences(self, labels: jax.Array, z_ar: jax.Array, image_first: jax.Array
                ) -> jax.Array:
    """Embedded sequences [B, N + R + 2, W] in each example's direction."""
    batch = labels.shape[0]
    special = lambda token: self.decoder.embed(jnp.full((batch, 1), token))
    label = self.decoder.embed(self.vocab.class_prefix(labels))
    image = self.read_in(z_ar)
    generation = jnp.concatenate([special(self.vocab.bos), label, special(self.vocab.boi),
                                  image], axis=1)
    understanding = jnp.concatenate([special(self.vocab.boi), image, special(self.vocab.bos),
                                     label], axis=1)
    return jnp.where(image_first[:, None, None], understanding, generation)

  def hidden(self, labels: jax.Array, z_ar: jax.Array, image_first: jax.Array,
             rng: jax.Array | None = None) -> jax.Array:
    return self.decoder(self.sequences(labels, z_ar, image_first), rng=rng)

  def image_log_prob(self, hidden: jax.Array, z_ar: jax.Array) -> jax.Array:
    """Sum over tokens of log GMM(z_t | prefix) for generation-order hidden states: [B]."""
    start = self.prefix_length
    logits, means, scales = self.head(hidden[:, start:start + self.num_tokens])
    return gmm.log_prob(z_ar, logits, means, scales).sum(axis=1)

  def class_logits(self, hidden: jax.Array) -> jax.Array:
    """Class logits [B, num_classes] at the BOS position of understanding-order states."""
    return self.decoder.attend(hidden[:, self.num_tokens + 1])[:, :self.vocab.num_classes]


def standard_normal_log_prob(z: jax.Array) -> jax.Array:
  """Sum of log N(z_i; 0, 1) over all but the leading axis: [B]."""
  return (-0.5 * (z**2 + LOG_2PI)).reshape(z.shape[0], -1).sum(axis=1)
