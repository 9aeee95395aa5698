"""Class-conditional sampling (temperature, classifier-free guidance) and class prediction.

Sampling fills the N soft tokens one at a time inside a `jax.lax.scan` (the causal decoder runs on
the whole fixed-length sequence; positions after the current one are zeros it cannot see), draws
the factored-out dimensions from N(0, 1) and inverts the flow back to pixels.

Guidance targets p_c^(1+w) / p_u^w per token, p_c / p_u the conditional / unconditional (no-label)
mixtures. We draw `num_proposals` candidates from p_c (scales times the temperature) and resample
one with weights (p_c / p_u)^w: sampling-importance-resampling, exact as the number of proposals
grows, instead of the official per-dimension rejection sampler.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab.methods.jetformer import model as model_lib
from jaxlab.methods.jetformer import tokens as tokens_lib
from jaxlab.zoo import gmm


def sample_levels(model: model_lib.JetFormer, key: jax.Array, labels: jax.Array, *,
                  temperature: float, cfg_weight: float, num_proposals: int, num_levels: int,
                  patch: int, image_shape: tuple[int, int, int]) -> jax.Array:
  """Integer images [S, H, W, C] for class labels [S] (ignored by a model without decoder)."""
  count = labels.shape[0]
  n, ar_dim, token_dim = model.num_tokens, model.ar_dim, model.token_dim
  dtype = jnp.result_type(float)
  token_key, rest_key = jax.random.split(key)
  if model.decoder is None:
    z = temperature * jax.random.normal(token_key, (count, n, token_dim), dtype)
  else:
    image_first = jnp.zeros((count,), bool)
    no_label = jnp.full((count,), model.vocab.no_label)

    def mixture_at(hidden, i):
      return model.head(jax.lax.dynamic_index_in_dim(hidden, 2 + i, axis=1, keepdims=False))

    def next_token(z_ar, i):
      step_key = jax.random.fold_in(token_key, i)
      conditional = mixture_at(model.hidden(labels, z_ar, image_first), i)
      unconditional = mixture_at(model.hidden(no_label, z_ar, image_first), i)
      proposal_keys = jax.random.split(jax.random.fold_in(step_key, 0), num_proposals)
      proposals = jax.vmap(lambda k: gmm.sample(k, *conditional, temperature=temperature))(
          proposal_keys)                                                    # [P, S, ar]
      log_ratio = (jax.vmap(lambda p: gmm.log_prob(p, *conditional))(proposals)
                   - jax.vmap(lambda p: gmm.log_prob(p, *unconditional))(proposals))
      pick = jax.random.categorical(jax.random.fold_in(step_key, 1), cfg_weight * log_ratio,
                                    axis=0)                                # [S]
      token = jnp.take_along_axis(proposals, pick[None, :, None], axis=0)[0]
      return jax.lax.dynamic_update_index_in_dim(z_ar, token, i, axis=1), None

    z_ar, _ = jax.lax.scan(next_token, jnp.zeros((count, n, ar_dim), dtype), jnp.arange(n))
    z_rest = jax.random.normal(rest_key, (count, n, token_dim - ar_dim), dtype)
    z = jnp.concatenate([z_ar, z_rest], axis=-1)
  x = tokens_lib.unpatchify(model.decode(z), patch, *image_shape)
  return tokens_lib.unit_to_levels(x, num_levels)


def predict_classes(model: model_lib.JetFormer, levels: jax.Array, *, num_levels: int,
                    patch: int) -> jax.Array:
  """Image understanding: the class read at BOS after the image prefix, [B] (bin centres)."""
  x = tokens_lib.levels_to_unit(levels, num_levels) + 0.5 / tokens_lib.bin_scale(num_levels)
  z, _ = model.encode(tokens_lib.patchify(x, patch))
  batch = levels.shape[0]
  hidden = model.hidden(jnp.zeros((batch,), jnp.int32), z[..., :model.ar_dim],
                        jnp.ones((batch,), bool))
  return jnp.argmax(model.class_logits(hidden), axis=-1)
