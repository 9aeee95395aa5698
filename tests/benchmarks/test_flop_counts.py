"""benchmarks.common: FLOP counts that see every replica of a `map_replicas` step."""
import jax
import jax.numpy as jnp

from benchmarks import common
from jaxlab.core import replicas


def test_all_replica_flops_counts_every_replica():
  weights = jnp.ones((4, 32, 32))
  inputs = jnp.ones((4, 16, 32))
  step = replicas.map_replicas(lambda w, x: jnp.sum(x @ w))
  one = common.xla_flops(lambda w, x: jnp.sum(x @ w), weights[0], inputs[0])
  counted = common.all_replica_flops(step, weights, inputs)
  assert abs(counted - 4 * one) <= 0.05 * 4 * one
  assert replicas.runs_replicas_in_turn() == (jax.device_count() == 1)   # restored afterwards


def test_unrolled_flops_counts_every_step_even_when_the_caller_sets_unroll():
  def chain(x, steps):
    body = lambda carry, _: (jnp.tanh(carry @ x), None)
    out, _ = jax.lax.scan(body, x, None, length=steps, unroll=1)
    return out.sum()

  weights = jnp.ones((32, 32))
  one = common.unrolled_flops(lambda x: chain(x, 1), weights)
  ten = common.unrolled_flops(lambda x: chain(x, 10), weights)
  assert 9 * one <= ten <= 11 * one
