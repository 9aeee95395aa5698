"""Class-conditional sampling (temperature, classifier-free guidance) and class prediction.

Sampling fills the N soft tokens one at a time inside a `jax.lax.scan` (the causal decoder runs on
the whole fixed-length sequence; positions after the current one are zeros it cannot see), draws
the factored-out dimensions from N(0, 1) and inverts the flow back to pixels.

Classifier-free guidance, as the paper's sampler does it: per token a mixture component k is drawn
from the conditional mixture; with c = N(mu_c[k], s_c[k]) and u = N(mu_u[k], s_u[k]) the same
component of the unconditional (no-label) mixture, scales times the temperature, every dimension
is drawn by rejection sampling from the guided density c^(1+w) / u^w, with a wider Gaussian
proposal N(mu_c, 2 max(s_c, s_u)) and 1,000 candidates by default; where no candidate is
accepted it falls back to c. The share of dimensions that found an accepted candidate is
returned beside the samples, so a sampler that silently fell back to unguided draws shows up.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxlab.methods.jetformer import model as model_lib
from jaxlab.methods.jetformer import tokens as tokens_lib
from jaxlab.zoo import gmm


def _normal_log_pdf(x: jax.Array, mean: jax.Array, scale: jax.Array) -> jax.Array:
  return -0.5 * ((x - mean) / scale) ** 2 - jnp.log(scale) - 0.5 * math.log(2 * math.pi)


def guided_gaussian_sample(key: jax.Array, mean_c: jax.Array, scale_c: jax.Array,
                           mean_u: jax.Array, scale_u: jax.Array, weight: float, *,
                           num_candidates: int = 1000, grid_size: int = 257
                           ) -> tuple[jax.Array, jax.Array]:
  """One draw per element from the density proportional to N(mean_c, scale_c)^(1 + w) /
  N(mean_u, scale_u)^w (all arguments share a shape), by rejection sampling; and a bool array,
  True where a candidate was accepted.

  The acceptance bound is the largest target / proposal ratio on a grid of +-8 proposal scales;
  an element with no accepted candidate (a guided density that is not normalisable, or an
  unlucky draw) takes a sample of N(mean_c, scale_c) instead.
  """
  candidate_key, accept_key, fallback_key = jax.random.split(key, 3)
  proposal_scale = 2 * jnp.maximum(scale_c, scale_u)

  def log_ratio(x):   # x: [P, ...], P points per element
    mc, sc, mu, su, sp = (a[None] for a in (mean_c, scale_c, mean_u, scale_u, proposal_scale))
    target = (1 + weight) * _normal_log_pdf(x, mc, sc) - weight * _normal_log_pdf(x, mu, su)
    return target - _normal_log_pdf(x, mc, sp)

  offsets = jnp.broadcast_to(
      jnp.linspace(-8.0, 8.0, grid_size).reshape((grid_size,) + (1,) * mean_c.ndim),
      (grid_size,) + mean_c.shape).astype(mean_c.dtype)
  log_bound = jnp.max(log_ratio(mean_c[None] + proposal_scale[None] * offsets), axis=0)
  candidates = mean_c[None] + proposal_scale[None] * jax.random.normal(
      candidate_key, (num_candidates,) + mean_c.shape, mean_c.dtype)
  log_uniform = jnp.log(jax.random.uniform(accept_key, candidates.shape, mean_c.dtype))
  accepted = log_uniform < log_ratio(candidates) - log_bound[None]
  first = jnp.argmax(accepted, axis=0)
  chosen = jnp.take_along_axis(candidates, first[None], axis=0)[0]
  fallback = mean_c + scale_c * jax.random.normal(fallback_key, mean_c.shape, mean_c.dtype)
  found = jnp.any(accepted, axis=0)
  return jnp.where(found, chosen, fallback), found


def sample_levels(model: model_lib.JetFormer, key: jax.Array, labels: jax.Array, *,
                  temperature: float, cfg_weight: float, num_candidates: int, num_levels: int,
                  patch: int, image_shape: tuple[int, int, int]
                  ) -> tuple[jax.Array, jax.Array]:
  """Integer images [S, H, W, C] for class labels [S] (ignored by a model without decoder), and
  the guidance sampler's acceptance rate over all autoregressive dimensions (NaN without a
  decoder)."""
  count = labels.shape[0]
  n, ar_dim, token_dim = model.num_tokens, model.ar_dim, model.token_dim
  dtype = jnp.result_type(float)
  token_key, rest_key = jax.random.split(key)
  if model.decoder is None:
    z = temperature * jax.random.normal(token_key, (count, n, token_dim), dtype)
    acceptance = jnp.full([], jnp.nan, dtype)
  else:
    image_first = jnp.zeros((count,), bool)
    no_label = jnp.full((count,), model.vocab.no_label)

    def mixture_at(hidden, i):
      return model.head(jax.lax.dynamic_index_in_dim(hidden, model.prefix_length + i, axis=1,
                                                     keepdims=False))

    def next_token(z_ar, i):
      component_key, sample_key = jax.random.split(jax.random.fold_in(token_key, i))
      logits_c, means_c, scales_c = mixture_at(model.hidden(labels, z_ar, image_first), i)
      _, means_u, scales_u = mixture_at(model.hidden(no_label, z_ar, image_first), i)
      component = jax.random.categorical(component_key, logits_c, axis=-1)        # [S]
      mean_c, scale_c = gmm.take_component(means_c, scales_c, component)          # [S, ar]
      mean_u, scale_u = gmm.take_component(means_u, scales_u, component)
      token, found = guided_gaussian_sample(sample_key, mean_c, temperature * scale_c, mean_u,
                                            temperature * scale_u, cfg_weight,
                                            num_candidates=num_candidates)
      return jax.lax.dynamic_update_index_in_dim(z_ar, token, i, axis=1), found.mean()

    z_ar, accepted = jax.lax.scan(next_token, jnp.zeros((count, n, ar_dim), dtype),
                                  jnp.arange(n))
    acceptance = accepted.mean()
    z_rest = jax.random.normal(rest_key, (count, n, token_dim - ar_dim), dtype)
    z = jnp.concatenate([z_ar, z_rest], axis=-1)
  x = tokens_lib.unpatchify(model.decode(z), patch, *image_shape)
  return tokens_lib.unit_to_levels(x, num_levels), acceptance


def factored_std(model: model_lib.JetFormer, key: jax.Array, levels: jax.Array, *,
                 num_levels: int, patch: int) -> jax.Array:
  """Std of the flow outputs that sampling draws from N(0, 1), for dequantised real images: the
  factored-out dims (every dim for a flow without decoder). Near 1 when N(0, 1) fits them; NaN
  when nothing is factored out or there is no flow."""
  if model.flow is None or (model.decoder is not None and model.ar_dim == model.token_dim):
    return jnp.full([], jnp.nan, jnp.result_type(float))
  x = tokens_lib.dequantize(key, levels, num_levels)
  z, _ = model.encode(tokens_lib.patchify(x, patch))
  return z.std() if model.decoder is None else z[..., model.ar_dim:].std()


def predict_classes(model: model_lib.JetFormer, levels: jax.Array, *, num_levels: int,
                    patch: int) -> jax.Array:
  """Image understanding: the class read at BOS after the image prefix, [B] (bin centres)."""
  x = tokens_lib.levels_to_unit(levels, num_levels) + 0.5 / tokens_lib.bin_scale(num_levels)
  z, _ = model.encode(tokens_lib.patchify(x, patch))
  batch = levels.shape[0]
  hidden = model.hidden(jnp.zeros((batch,), jnp.int32), z[..., :model.ar_dim],
                        jnp.ones((batch,), bool))
  return jnp.argmax(model.class_logits(hidden), axis=-1)
