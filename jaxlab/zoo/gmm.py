"""Mixtures of diagonal Gaussians as an output head: densities, sampling, parameter layout.

A mixture of K diagonal Gaussians over D dims is (logits [..., K], means [..., K, D], scales
[..., K, D]); the mixture weights are softmax(logits). The functions are pure and take those three
arrays, so any network producing `K + 2*K*D` numbers per position can feed them through
`split_mixture_params`; `MixtureHead` is the zero-initialised linear layer that does so.

* `log_prob`: log sum_k w_k N(x; mu_k, diag(s_k^2)) by logsumexp over per-component log densities,
  which stays finite however far x is from every component and for thousands of components.
* `component_log_prob`: the per-component log densities [..., K] (e.g. for guidance or rejection
  sampling that reweights components).
* `sample`: draw a component from the weights, then the Gaussian with its scales times
  `temperature`.
"""
from __future__ import annotations

import math

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.zoo import mlp as mlp_lib

MIN_SCALE = 1e-6


def squareplus(x: jax.Array) -> jax.Array:
  """(x + sqrt(x^2 + 4)) / 2: a smooth, positive, algebraic softplus; squareplus(0) = 1.

  For x < 0 the equal form 2 / (sqrt(x^2 + 4) - x) is used, because x + sqrt(x^2 + 4) cancels
  to 0 in floating point once |x| is large.
  """
  # Each branch sees its input zeroed off its own side, so the branch `where` discards cannot
  # produce an inf or NaN that would leak into the gradient. `where`, not `maximum`: the latter
  # splits the gradient at a tie, halving it at x = 0, where a zero-initialised head starts.
  negative = x < 0
  pos, neg = jnp.where(negative, 0, x), jnp.where(negative, x, 0)
  return jnp.where(negative, 2 / (jnp.sqrt(jnp.square(neg) + 4) - neg),
                   (pos + jnp.sqrt(jnp.square(pos) + 4)) / 2)


def num_mixture_params(num_components: int, dim: int) -> int:
  """K + 2*K*D: the length of the raw vector that `split_mixture_params` reads."""
  return num_components * (1 + 2 * dim)


def split_mixture_params(raw: jax.Array, num_components: int, dim: int
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """raw [..., K + 2KD] -> (logits [..., K], means [..., K, D], scales [..., K, D]).

  Layout: K logits, then K*D means (component-major), then K*D raw scales, mapped to
  max(squareplus(raw), 1e-6) so no component collapses to a point.
  """
  k, d = num_components, dim
  if raw.shape[-1] != num_mixture_params(k, d):
    raise ValueError(f"a mixture of {k} components over {d} dims needs "
                     f"{num_mixture_params(k, d)} raw parameters, got {raw.shape[-1]}")
  batch_shape = raw.shape[:-1]
  logits = raw[..., :k]
  means = raw[..., k:k + k * d].reshape(batch_shape + (k, d))
  raw_scales = raw[..., k + k * d:].reshape(batch_shape + (k, d))
  return logits, means, jnp.maximum(squareplus(raw_scales), MIN_SCALE)


def component_log_prob(x: jax.Array, means: jax.Array, scales: jax.Array) -> jax.Array:
  """log N(x; mu_k, diag(s_k^2)) per component; x [..., D], means/scales [..., K, D] -> [..., K].

  Computed in at least float32 from the standardised residual, so a point 1e3 scales away costs
  a finite -5e5 per dim instead of a density that underflows to 0.
  """
  chex.assert_equal_shape([means, scales])
  chex.assert_shape(x, means.shape[:-2] + means.shape[-1:])
  dtype = jnp.promote_types(jnp.result_type(x, means, scales), jnp.float32)
  z = (x[..., None, :].astype(dtype) - means.astype(dtype)) / scales.astype(dtype)
  per_dim = -0.5 * jnp.square(z) - jnp.log(scales.astype(dtype)) - 0.5 * math.log(2 * math.pi)
  return jnp.sum(per_dim, axis=-1)


def log_prob(x: jax.Array, logits: jax.Array, means: jax.Array, scales: jax.Array) -> jax.Array:
  """log sum_k softmax(logits)_k N(x; mu_k, diag(s_k^2)); x [..., D], logits [..., K] -> [...]."""
  chex.assert_shape(logits, means.shape[:-1])
  log_weights = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)))
  return jax.nn.logsumexp(log_weights + component_log_prob(x, means, scales), axis=-1)


def take_component(means: jax.Array, scales: jax.Array, component: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """The chosen component's (mean, scale), each [..., D]; component: integer [...]."""
  chex.assert_shape(component, means.shape[:-2])
  index = component[..., None, None]
  return (jnp.take_along_axis(means, index, axis=-2)[..., 0, :],
          jnp.take_along_axis(scales, index, axis=-2)[..., 0, :])


def sample(key: jax.Array, logits: jax.Array, means: jax.Array, scales: jax.Array, *,
           temperature: float | jax.Array = 1.0) -> jax.Array:
  """One draw per leading index: logits [..., K], means/scales [..., K, D] -> [..., D].

  The component comes from softmax(logits) unchanged; `temperature` multiplies only the chosen
  Gaussian's scales, so < 1 draws closer to the component means (sharper, less diverse samples),
  1 samples the mixture exactly, and 0 returns the chosen mean.
  """
  chex.assert_shape(logits, means.shape[:-1])
  component_key, noise_key = jax.random.split(key)
  component = jax.random.categorical(component_key, logits, axis=-1)
  mean, scale = take_component(means, scales, component)
  noise = jax.random.normal(noise_key, mean.shape, mean.dtype)
  return mean + temperature * scale * noise


class MixtureHead(nnx.Module):
  """h [..., in_features] -> (logits [..., K], means [..., K, D], scales [..., K, D]).

  A zero-initialised linear layer feeding `split_mixture_params`, so at init every position
  predicts uniform weights, zero means and unit scales (squareplus(0) = 1): a standard normal in
  every component, whatever the input.
  """

  def __init__(self, in_features: int, num_components: int, dim: int, *,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.in_features, self.num_components, self.dim = in_features, num_components, dim
    self.proj = nnx.Linear(in_features, num_mixture_params(num_components, dim),
                           kernel_init=nnx.initializers.zeros_init(),
                           bias_init=nnx.initializers.zeros_init(), param_dtype=param_dtype,
                           dot_general=mlp_lib.flat_dot_general, rngs=rngs)

  def __call__(self, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    chex.assert_shape(h, (..., self.in_features))
    return split_mixture_params(self.proj(h), self.num_components, self.dim)
