"""ise.model and ise.training: a zero segment table is the delimiter model, the chunk compiles
once, the loss and the exact-match scoring, and the example API's input checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import parallel
from jaxlab.methods.ise import evaluation
from jaxlab.methods.ise import model as model_lib
from jaxlab.methods.ise import tasks
from jaxlab.methods.ise import training

SPEC = model_lib.ModelSpec(width=16, depth=1, num_heads=2, mlp_dim=32)


def test_ise_with_a_zero_segment_table_equals_the_delimiter_model():
  net = model_lib.network(SPEC)
  params = net.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = tasks.encode_batch([tasks.sample_conversation(rng, attack="completion")
                              for _ in range(4)], "ise")
  tokens, segments = jnp.asarray(batch.tokens), jnp.asarray(batch.segments)
  zeroed = jax.tree.map(lambda x: x, params)
  zeroed["segment_embed"]["table"]["embedding"] = jnp.zeros_like(
      params["segment_embed"]["table"]["embedding"])
  ise = net.apply(zeroed, tokens, segments, 1.0)
  delimiters = net.apply(params, tokens, segments, 0.0)
  np.testing.assert_allclose(np.asarray(ise), np.asarray(delimiters), atol=1e-6)
  # With its table, the segments do change the logits.
  assert not np.allclose(np.asarray(net.apply(params, tokens, segments, 1.0)),
                         np.asarray(delimiters), atol=1e-6)


def test_masked_loss_counts_only_masked_positions():
  logits = jnp.log(jax.nn.one_hot(jnp.array([[1, 2, 0]]), 3) * 0.98 + 0.01)
  tokens = jnp.array([[0, 1, 1]])   # position 0 predicts 1 (right), 1 predicts 1 (wrong)
  only_first, metrics = training.masked_loss(logits, tokens, jnp.array([[True, False, False]]))
  assert metrics["token_accuracy"] == 1.0
  np.testing.assert_allclose(only_first, -np.log(0.99 / 1.01), rtol=1e-5)
  both, metrics = training.masked_loss(logits, tokens, jnp.array([[True, True, False]]))
  assert metrics["token_accuracy"] == 0.5 and both > only_first


def test_answers_match_needs_the_eos_and_nothing_when_unwanted():
  eos, pad = tasks.EOS, tasks.PAD
  slots = jnp.array([[9, 8, eos, pad], [9, eos, pad, pad], [-1, -1, -1, -1]])
  generated = jnp.array([[9, 8, eos, 5], [9, 8, eos, pad], [9, eos, pad, pad]])
  np.testing.assert_array_equal(np.asarray(training.answers_match(generated, slots)),
                                [True, False, False])


def test_training_chunk_compiles_once_and_variants_share_weights_and_batches(tmp_path):
  pools = training.build_pools(["adversarial"], ["delimiters", "ise"], size=64, max_turns=1,
                               seed=0)
  replicas = training.layout(["adversarial"], ["delimiters", "ise"], [0])
  spec = training.TrainSpec(steps=4, batch_size=8, learning_rate=1e-3, chunk_steps=2,
                            ckpt_every=2)
  mesh = parallel.make_mesh()
  fit = training.fit(SPEC, spec, replicas, pools, mesh=mesh, workdir=str(tmp_path),
                     progress=False)
  _, _, chunk = training._functions(  # pylint: disable=protected-access
      SPEC, spec, training.replicas.replica_sharding(2, mesh))
  assert chunk._cache_size() == 1   # pylint: disable=protected-access
  assert len(fit.history) == 2 and np.all(np.isfinite([h["train/loss"] for h in fit.history]))
  assert fit.params["segment_embed"]["table"]["embedding"].shape[0] == 2
  assert training.read_layout(tmp_path) == (SPEC, spec, replicas)
  # The examples API restores these replicas and scores them.
  example = {"messages": [{"role": "system", "content": "MASK NONE"},
                          {"role": "user", "content": "MAX"},
                          {"role": "data", "content": "1 2 3 4"}], "target": "4"}
  found = evaluation.evaluate_examples(str(tmp_path), [example] * 3)
  assert set(found) == {"delimiters", "ise"} and set(found["ise"]) == {"adversarial"}
  assert 0.0 <= found["ise"]["adversarial"] <= 1.0


def test_variants_of_a_seed_start_from_the_same_weights_and_batches():
  pools = training.build_pools(["clean"], ["none", "ise"], size=16, max_turns=1, seed=0)
  replicas = training.layout(["clean"], ["none", "ise"], [3])
  keys, pool_index, use_segments = training.replica_inputs(replicas, pools, ["clean"])
  np.testing.assert_array_equal(jax.random.key_data(keys[0]), jax.random.key_data(keys[1]))
  np.testing.assert_array_equal(np.asarray(pool_index), [0, 1])
  np.testing.assert_array_equal(np.asarray(use_segments), [0.0, 1.0])


def test_examples_api_rejects_bad_examples_before_compiling(tmp_path):
  good = {"messages": [{"role": "system", "content": "MASK NONE"},
                       {"role": "user", "content": "MAX"},
                       {"role": "data", "content": "1 2 3 4"}], "target": "4"}
  bad_role = {"messages": [{"role": "robot", "content": "MAX"}], "target": "4"}
  bad_token = {"messages": [{"role": "user", "content": "MAXIMUM"}], "target": "4"}
  long = {"messages": [{"role": "data", "content": " ".join(["1"] * 64)}], "target": "1"}
  for example, match in ((bad_role, "example 1.*role"), (bad_token, "example 1.*MAXIMUM"),
                         (long, "example 1.*limit")):
    with pytest.raises(ValueError, match=match):
      evaluation.check_examples([good, example], "ise")
  with pytest.raises(FileNotFoundError, match="train"):
    evaluation.evaluate_examples(str(tmp_path), [good])


def test_a_packed_row_gives_each_conversation_the_logits_it_has_alone():
  net = model_lib.network(SPEC)
  params = net.init(jax.random.key(1))
  rng = np.random.default_rng(5)
  conversations = [tasks.sample_conversation(rng, max_turns=1) for _ in range(6)]
  batch = tasks.encode_batch(conversations, "ise")
  lengths = (batch.tokens != tasks.PAD).sum(axis=1)
  groups = training.pack_groups(lengths, tasks.MAX_TOKENS)
  assert len(groups) < len(conversations) and sum(map(len, groups)) == len(conversations)
  tokens, segments, loss_mask, positions, docs = training.pack(batch, groups, tasks.MAX_TOKENS)
  packed = net.apply(params, jnp.asarray(tokens), jnp.asarray(segments), 1.0,
                     positions=jnp.asarray(positions), mask=training.packed_mask(jnp.asarray(docs)))
  alone = net.apply(params, jnp.asarray(batch.tokens), jnp.asarray(batch.segments), 1.0)
  for row, group in enumerate(groups):
    at = 0
    for index in group:
      n = int(lengths[index])
      np.testing.assert_allclose(np.asarray(packed[row, at:at + n]),
                                 np.asarray(alone[index, :n]), atol=2e-5)
      np.testing.assert_array_equal(loss_mask[row, at:at + n], batch.loss_mask[index, :n])
      at += n
    assert not loss_mask[row, at:].any()


def test_pools_pack_the_same_conversations_in_every_variant():
  pools = training.build_pools(["adversarial"], ["none", "ise"], size=200, max_turns=2, seed=0)
  assert pools.tokens.shape[1] < 200 and pools.tokens.shape[2] == tasks.MAX_TOKENS
  np.testing.assert_array_equal(pools.docs[0].max(axis=1), pools.docs[1].max(axis=1))
  # Every conversation starts with <bos> at position 0 in both variants.
  for variant in range(2):
    starts = pools.positions[variant] == 0
    starts &= pools.docs[variant] > 0
    assert np.all(pools.tokens[variant][starts] == tasks.BOS)
    assert starts.sum() == 200
