"""zoo.graph: the segment softmax and the edge-attention layer on padded graphs."""
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.zoo import graph


def test_segment_softmax_equals_a_dense_softmax_per_segment_and_ignores_masked_edges():
  logits = jnp.asarray([[1.0], [2.0], [0.5], [3.0], [100.0], [-1.0]])
  segments = jnp.asarray([0, 0, 1, 1, 1, 2])
  mask = jnp.asarray([True, True, True, True, False, False])
  weights = graph.segment_softmax(logits, segments, 4, mask)
  np.testing.assert_allclose(weights[:2, 0], jax.nn.softmax(jnp.asarray([1.0, 2.0])), rtol=1e-6)
  np.testing.assert_allclose(weights[2:4, 0], jax.nn.softmax(jnp.asarray([0.5, 3.0])),
                             rtol=1e-6)
  # A masked edge weighs 0; a segment whose edges are all masked (2) or absent (3) gives no NaN.
  assert float(weights[4, 0]) == 0.0 and float(weights[5, 0]) == 0.0
  assert bool(jnp.all(jnp.isfinite(weights)))


def layer_and_graph(seed=0):
  layer = graph.EdgeAttention(3, 5, 2, 8, num_heads=2, rngs=nnx.Rngs(seed))
  keys = jax.random.split(jax.random.key(seed), 3)
  senders_x = jax.random.normal(keys[0], (6, 3))
  receivers_x = jax.random.normal(keys[1], (4, 5))
  edges = jax.random.normal(keys[2], (9, 2))
  senders = jnp.asarray([0, 1, 2, 3, 4, 5, 0, 2, 4])
  receivers = jnp.asarray([0, 0, 1, 1, 2, 2, 2, 0, 1])
  return layer, (senders_x, receivers_x, edges, senders, receivers)


def test_edge_attention_is_equivariant_to_relabelling_nodes_and_edges():
  layer, (senders_x, receivers_x, edges, senders, receivers) = layer_and_graph()
  out = layer(senders_x, receivers_x, edges, senders, receivers)
  sender_perm = np.asarray([3, 0, 5, 1, 4, 2])          # new index of old sender i: inverse
  receiver_perm = np.asarray([2, 3, 0, 1])
  edge_perm = np.random.default_rng(0).permutation(len(senders))
  new_senders_x = senders_x[np.argsort(sender_perm)]
  new_receivers_x = receivers_x[np.argsort(receiver_perm)]
  moved = layer(new_senders_x, new_receivers_x, edges[edge_perm],
                jnp.asarray(sender_perm)[senders][edge_perm],
                jnp.asarray(receiver_perm)[receivers][edge_perm])
  np.testing.assert_allclose(moved, out[np.argsort(receiver_perm)], atol=1e-5)


def test_padding_nodes_and_masked_edges_change_nothing():
  layer, (senders_x, receivers_x, edges, senders, receivers) = layer_and_graph()
  out = layer(senders_x, receivers_x, edges, senders, receivers)
  padded = layer(jnp.concatenate([senders_x, jnp.full((2, 3), 7.0)]),
                 jnp.concatenate([receivers_x, jnp.full((3, 5), -3.0)]),
                 jnp.concatenate([edges, jnp.ones((4, 2))]),
                 jnp.concatenate([senders, jnp.asarray([6, 7, 0, 1])]),
                 jnp.concatenate([receivers, jnp.asarray([0, 1, 4, 5])]),
                 jnp.arange(13) < 9)
  np.testing.assert_allclose(padded[:4], out, atol=1e-6)
  # Receiver 3 has no edge: it gets the output projection of zero (its bias).
  np.testing.assert_allclose(out[3], layer.out.bias[...], atol=1e-6)
