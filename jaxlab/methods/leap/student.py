"""The student: the zoo `Decoder` over an episode's token buffer, read out at the action slots.

logits(tokens [B, L]) -> [B, horizon, num_actions]: the decoder's hidden state at each step's
prediction position (the token just before the step's action, `env.prediction_positions`),
through the tied read-out, restricted to the action tokens. Causal attention means one forward
pass scores every step of an episode against its own history, and the policy is the argmax over
the actions (greedy, as the official evaluation decodes).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab.methods.leap import env as env_lib
from jaxlab.zoo import functional
from jaxlab.zoo import transformer


# The student's size: the zoo's checked decoder size (width, depth, heads, MLP).
ModelSpec = transformer.DecoderSpec


def network(spec: ModelSpec) -> functional.Functional:
  return functional.Functional(lambda rngs: spec.build(len(env_lib.VOCAB), rngs=rngs))


class Student:
  """`init(key) -> params`, `action_logits(params, tokens)`, `act(params, state)`."""

  def __init__(self, model_spec: ModelSpec, env_spec: env_lib.EnvSpec):
    self.model_spec, self.env_spec = model_spec, env_spec
    self.net = network(model_spec)
    self._positions = env_lib.prediction_positions(env_spec)
    self._action_tokens = jnp.asarray(env_spec.action_tokens())

  def init(self, key: jax.Array):
    return self.net.init(key)

  def _logits(self, decoder, tokens: jax.Array) -> jax.Array:
    hidden = decoder(decoder.embed(tokens))                       # [B, L, D]
    at_steps = hidden[:, jnp.asarray(self._positions)]                       # [B, H, D]
    return decoder.attend(at_steps)[..., self._action_tokens]     # [B, H, A]

  def action_logits(self, params, tokens: jax.Array) -> jax.Array:
    """tokens [B, L] -> float32 logits [B, horizon, num_actions], step t from tokens < t's
    action."""
    return self._logits(self.net.module(params), tokens).astype(jnp.float32)

  def act(self, params, state: env_lib.State, key: jax.Array | None, step: int) -> jax.Array:
    """Greedy action of one episode at static step `step` (a policy for `env.rollout`): the
    decoder reads only the tokens before the step's action."""
    del key
    prefix = int(self._positions[step]) + 1
    decoder = self.net.module(params)
    hidden = decoder(decoder.embed(state.tokens[None, :prefix]))[0, -1]     # [D]
    logits = decoder.attend(hidden)[self._action_tokens].astype(jnp.float32)
    return jnp.argmax(logits).astype(jnp.int32)
