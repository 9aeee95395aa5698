"""zoo.embeddings: the segment table's shape, initial scale and lookup."""
from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import embeddings


def test_segment_embedding_looks_up_rows_at_the_official_scale():
  layer = embeddings.SegmentEmbedding(4, 256, rngs=nnx.Rngs(0))
  table = np.asarray(layer.table.embedding[...])
  assert table.shape == (4, 256)
  assert 0.008 < table.std() < 0.012   # N(0, 0.01^2)
  out = layer(jnp.array([[0, 3, 3], [1, 2, 0]]))
  np.testing.assert_array_equal(np.asarray(out[0, 1]), table[3])
  np.testing.assert_array_equal(np.asarray(out[1, 0]), table[1])


def test_segment_embedding_rejects_float_ids_and_no_segments():
  layer = embeddings.SegmentEmbedding(2, 8, rngs=nnx.Rngs(0))
  with pytest.raises(AssertionError):
    layer(jnp.zeros((2,), jnp.float32))
  with pytest.raises(ValueError, match="num_segments"):
    embeddings.SegmentEmbedding(0, 8, rngs=nnx.Rngs(0))
