"""benchmarks.common: FLOP counts that see every replica of a `map_replicas` step."""
import jax
import jax.numpy as jnp

from benchmarks import common
from jaxlab.core import replicas


def test_all_replica_flops_counts_each_replica_once_more():
  weights = jnp.ones((4, 32, 32))
  inputs = jnp.ones((4, 16, 32))
  step = replicas.map_replicas(lambda w, x: jnp.sum(x @ w))
  one = common.xla_flops(lambda w, x: jnp.sum(x @ w), weights[0], inputs[0])
  counted = common.all_replica_flops(step, weights, inputs)
  assert abs(counted - 4 * one) <= 0.05 * 4 * one
  assert replicas.runs_replicas_in_turn() == (jax.device_count() == 1)   # restored afterwards
