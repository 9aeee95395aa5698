"""Gemma-style decoder: shapes, causal and prefix-LM masking, RoPE's relative-position property,
grouped-query attention against tiled multi-head attention, RMSNorm, dropout, gradients.

Tiny sizes; test data come from NumPy and each check is one `jax.jit`.
"""
import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import functional
from jaxlab.zoo import transformer

WIDTH, HEADS, HEAD_DIM, MLP_DIM = 16, 4, 8, 32


def decoder(*, vocab_size=None, num_kv_heads=1, dropout=0.0, depth=2):
  return functional.Functional(lambda rngs: transformer.Decoder(
      vocab_size=vocab_size, width=WIDTH, depth=depth, num_heads=HEADS, num_kv_heads=num_kv_heads,
      head_dim=HEAD_DIM, mlp_dim=MLP_DIM, dropout=dropout, rngs=rngs))


def normal(shape, seed):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def perturbed(params, seed=0):
  """Init plus noise: RMSNorm scales start at 0, which would hide a norm that ignored them."""
  leaves, treedef = jax.tree.flatten(params)
  return jax.tree.unflatten(treedef, [leaf + 0.1 * normal(leaf.shape, seed + i)
                                      for i, leaf in enumerate(leaves)])


def test_shapes_without_compiling():
  model = decoder(vocab_size=11, num_kv_heads=2)
  params = jax.eval_shape(model.init, jax.random.key(0))
  block = params["blocks"][0]
  chex.assert_shape(block["attn"]["query"]["kernel"], (WIDTH, HEADS * HEAD_DIM))
  chex.assert_shape(block["attn"]["key"]["kernel"], (WIDTH, 2 * HEAD_DIM))
  chex.assert_shape(block["attn"]["out"]["kernel"], (HEADS * HEAD_DIM, WIDTH))
  chex.assert_shape(block["mlp"]["gate"]["kernel"], (WIDTH, MLP_DIM))
  chex.assert_shape(params["final_norm"]["scale"], (WIDTH,))
  assert len(params["blocks"]) == 2
  x = jax.ShapeDtypeStruct((3, 7, WIDTH), jnp.float32)
  chex.assert_shape(jax.eval_shape(model.apply, params, x), (3, 7, WIDTH))
  tokens = jax.ShapeDtypeStruct((3, 7), jnp.int32)
  embedded = jax.eval_shape(lambda p, t: model.apply(p, t, method="embed"), params, tokens)
  chex.assert_shape(embedded, (3, 7, WIDTH))
  logits = jax.eval_shape(lambda p, h: model.apply(p, h, method="attend"), params, x)
  chex.assert_shape(logits, (3, 7, 11))
  with pytest.raises(ValueError, match="no token embedding"):
    jax.eval_shape(lambda p, t: decoder().apply(p, t, method="embed"),
                   jax.eval_shape(decoder().init, jax.random.key(0)), tokens)


def test_head_counts_are_checked():
  with pytest.raises(ValueError, match="num_heads 6 is not divisible by num_kv_heads 4"):
    transformer.MultiQueryAttention(WIDTH, 6, 4, HEAD_DIM, rngs=nnx.Rngs(0))


def test_causal_mask_hides_the_future_exactly():
  model = decoder()
  params = perturbed(model.init(jax.random.key(0)))
  x = normal((2, 9, WIDTH), 1)
  x_changed = x.copy()
  x_changed[:, 5:] += normal((2, 4, WIDTH), 2)
  y = jax.jit(lambda p, x: model.apply(p, x, mask=transformer.causal_mask(9)))(
      params, np.concatenate([x, x_changed]))
  np.testing.assert_array_equal(y[:2, :5], y[2:, :5])
  assert not np.allclose(y[:2, 5:], y[2:, 5:], atol=1e-3)


def test_prefix_lm_mask_is_bidirectional_within_the_prefix_only():
  np.testing.assert_array_equal(transformer.prefix_lm_mask(5, 2), [
      [1, 1, 0, 0, 0],
      [1, 1, 0, 0, 0],
      [1, 1, 1, 0, 0],
      [1, 1, 1, 1, 0],
      [1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(transformer.prefix_lm_mask(4, 0), transformer.causal_mask(4))
  per_example = transformer.prefix_lm_mask(5, jnp.array([2, 4]))
  assert per_example.shape == (2, 5, 5)
  np.testing.assert_array_equal(per_example[0], transformer.prefix_lm_mask(5, 2))
  np.testing.assert_array_equal(per_example[1], transformer.prefix_lm_mask(5, 4))

  model = decoder()
  params = perturbed(model.init(jax.random.key(0)))
  prefix, length = 4, 8
  x = normal((1, length, WIDTH), 3)
  later_prefix = x.copy()
  later_prefix[:, prefix - 1] += 1.0      # the last prefix token
  suffix = x.copy()
  suffix[:, prefix + 1:] += 1.0
  mask = transformer.prefix_lm_mask(length, prefix)
  y = jax.jit(lambda p, x: model.apply(p, x, mask=mask))(
      params, np.concatenate([x, later_prefix, suffix]))
  # The first token sees the last prefix token, but no prefix token sees the suffix.
  assert not np.allclose(y[0, 0], y[1, 0], atol=1e-3)
  np.testing.assert_array_equal(y[0, :prefix + 1], y[2, :prefix + 1])


def test_rope_depends_on_relative_position_and_preserves_norms():
  q, k = normal((1, 1, 2, 32), 4), normal((1, 1, 2, 32), 5)
  pairs = np.array([[3, 1], [10, 8], [1003, 1001], [5, 5], [7, 2]])

  @jax.jit
  def run(q, k):
    rotated = lambda x, p: transformer.apply_rope(x, jnp.full((1, 1), p))
    dots = jnp.stack([jnp.sum(rotated(q, p) * rotated(k, s), -1)[0, 0] for p, s in pairs])
    norms = jnp.linalg.norm(rotated(q, 1234), axis=-1)
    return dots, norms

  dots, norms = run(q, k)
  np.testing.assert_allclose(dots[1], dots[0], rtol=1e-5, atol=1e-5)   # shift by 7
  np.testing.assert_allclose(dots[2], dots[0], rtol=1e-4, atol=1e-4)   # shift by 1000
  assert not np.allclose(dots[0], dots[3], atol=1e-2)                 # other offsets differ
  assert not np.allclose(dots[0], dots[4], atol=1e-2)
  np.testing.assert_allclose(dots[3], np.sum(q * k, -1)[0, 0], rtol=1e-5, atol=1e-5)  # plain dot
  np.testing.assert_allclose(norms, np.linalg.norm(q, axis=-1), rtol=1e-5)


def test_grouped_query_attention_equals_multi_head_with_shared_key_value_heads():
  """H query heads over K kv heads == H over H kv heads whose weights repeat each K-head G times."""
  attention = lambda kv: functional.Functional(lambda rngs: transformer.MultiQueryAttention(
      WIDTH, HEADS, kv, HEAD_DIM, rngs=rngs))
  full = attention(HEADS)
  x = normal((2, 6, WIDTH), 6)
  positions = np.broadcast_to(np.arange(6), (2, 6))
  mask = transformer.causal_mask(6)

  def tiled(params, kv):
    # Key/value head j becomes heads j*G .. j*G + G-1 (G = H / K), the grouping the layer uses.
    repeat = lambda kernel: np.repeat(kernel.reshape(WIDTH, kv, HEAD_DIM), HEADS // kv,
                                      axis=1).reshape(WIDTH, HEADS * HEAD_DIM)
    return {**params, "key": {"kernel": repeat(params["key"]["kernel"])},
            "value": {"kernel": repeat(params["value"]["kernel"])}}

  grouped = {kv: jax.tree.map(np.asarray, attention(kv).init(jax.random.key(kv))) for kv in (1, 2)}

  @jax.jit
  def run(grouped, tiled_params):
    outs = {}
    for kv in (1, 2):
      apply = lambda p, model: model.apply(p, x, positions=positions, mask=mask)
      outs[kv] = (apply(grouped[kv], attention(kv)), apply(tiled_params[kv], full))
    return outs

  outs = run(grouped, {kv: tiled(grouped[kv], kv) for kv in (1, 2)})
  for kv in (1, 2):
    chex.assert_shape(outs[kv][0], (2, 6, WIDTH))
    np.testing.assert_allclose(outs[kv][0], outs[kv][1], rtol=1e-5, atol=1e-6)


def test_rmsnorm_has_unit_rms_at_init():
  norm = functional.Functional(lambda rngs: transformer.RMSNorm(WIDTH, rngs=rngs))
  params = norm.init(jax.random.key(0))
  np.testing.assert_array_equal(params["scale"], 0.0)
  # Inputs well above sqrt(eps) = 1e-3 in scale, where eps shifts the RMS by under 1e-5.
  x = normal((3, 5, WIDTH), 7) * np.array([0.5, 1.0, 1e3])[:, None, None].astype(np.float32)
  y = jax.jit(norm.apply)(params, x)
  np.testing.assert_allclose(np.sqrt(np.mean(np.square(y), -1)), 1.0, rtol=1e-4)


def test_dropout_acts_only_with_an_rng_and_gradients_are_finite():
  model = decoder(dropout=0.5)
  plain = decoder(dropout=0.0)
  params = perturbed(model.init(jax.random.key(0)))
  x = normal((2, 6, WIDTH), 8)
  mask = transformer.prefix_lm_mask(6, jnp.array([2, 3]))

  @jax.jit
  def run(params, x):
    deterministic = model.apply(params, x, mask=mask)
    reference = plain.apply(params, x, mask=mask)
    def loss(p, key):
      y = model.apply(p, x, mask=mask, rng=key)
      return jnp.mean(jnp.square(y)), y

    grads, dropped_a = jax.grad(loss, has_aux=True)(params, jax.random.key(1))
    dropped_b = model.apply(params, x, mask=mask, rng=jax.random.key(2))
    return deterministic, reference, dropped_a, dropped_b, grads

  deterministic, reference, dropped_a, dropped_b, grads = run(params, x)
  np.testing.assert_array_equal(deterministic, reference)
  assert not np.allclose(dropped_a, deterministic, atol=1e-3)
  assert not np.allclose(dropped_a, dropped_b, atol=1e-3)
  leaves = jax.tree.leaves(grads)
  assert all(np.all(np.isfinite(g)) for g in leaves)
  assert all(np.any(g != 0) for g in leaves), "every parameter should get a gradient"


def test_greedy_generate_equals_step_by_step_argmax():
  """The scanned buffer decoding against a Python loop that re-runs the model on the growing
  prompt of each row, on a random decoder and prompts of different lengths."""
  net = functional.Functional(lambda rngs: transformer.Decoder(
      vocab_size=11, width=16, depth=1, num_heads=2, mlp_dim=32, rngs=rngs))
  params = net.init(jax.random.key(0))
  logits_of = lambda t: net.apply(params, net.apply(params, t, method="embed"), method="__call__")

  # Jitted: eager NNX calls cost ~1 s each; one compile per prompt length is cheaper.
  @jax.jit
  def logits_fn(tokens, segments):
    del segments
    return net.apply(params, logits_of(tokens), method="attend")

  length, max_new = 12, 4
  prompts = [[1, 5, 3], [2, 7, 7, 4, 9, 1], [3]]
  tokens = np.zeros((3, length), np.int32)
  for row, prompt in enumerate(prompts):
    tokens[row, :len(prompt)] = prompt
  prompt_len = np.array([len(p) for p in prompts])
  out, segments = transformer.greedy_generate(logits_fn, jnp.asarray(tokens),
                                              jnp.zeros_like(jnp.asarray(tokens)),
                                              jnp.asarray(prompt_len), max_new, new_segment=3)
  for row, prompt in enumerate(prompts):
    current = list(prompt)
    for _ in range(max_new):
      logits = logits_fn(jnp.asarray([current]), None)
      current.append(int(jnp.argmax(logits[0, -1])))
    np.testing.assert_array_equal(np.asarray(out[row, :len(current)]), current)
    np.testing.assert_array_equal(np.asarray(segments[row, len(prompt):len(current)]), 3)
    assert np.all(np.asarray(segments[row, :len(prompt)]) == 0)


def test_greedy_generate_stops_at_the_end_of_the_buffer():
  logits_fn = lambda tokens, segments: jax.nn.one_hot(jnp.full(tokens.shape, 4), 6)
  tokens = jnp.asarray([[1, 2, 3, 0]])
  out, _ = transformer.greedy_generate(logits_fn, tokens, jnp.zeros_like(tokens),
                                       jnp.asarray([3]), 5)
  np.testing.assert_array_equal(np.asarray(out), [[1, 2, 3, 4]])
