"""Zoo attention seen from outside: bias-free q/k, probabilities, replaced query-key matrices,
and the Backbone's attention inputs and per-block replacements."""
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import attention
from jaxlab.zoo import functional
from jaxlab.zoo import sequence

WIDTH, HEADS, LENGTH = 12, 3, 7
HEAD_DIM = WIDTH // HEADS


def layer(*, qkv_bias=True, causal=True, kind="softmax", seed=0):
  """An attention layer with O(1) weights, so that softmax rows are far from uniform."""
  module = attention.Attention(WIDTH, HEADS, kind=kind, causal=causal, qkv_bias=qkv_bias,
                               init_std=0.5, out_init_std=0.5, rngs=nnx.Rngs(seed))
  if qkv_bias:   # zero at init; make it matter
    module.qkv.bias[...] = 0.3 * jax.random.normal(jax.random.key(seed + 1), (3 * WIDTH,))
  return module


def inputs(seed=1, batch=2):
  return jax.random.normal(jax.random.key(seed), (batch, LENGTH, WIDTH))


def hand_probabilities(x, w_q, w_k, causal):
  """softmax(x W_Q,h W_K,h^T x^T / sqrt(Dh)) per head, head by head, in numpy float64."""
  x, w_q, w_k = (np.asarray(a, np.float64) for a in (x, w_q, w_k))
  out = np.zeros((x.shape[0], HEADS, LENGTH, LENGTH))
  for h in range(HEADS):
    cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
    logits = (x @ w_q[:, cols]) @ np.swapaxes(x @ w_k[:, cols], 1, 2) / np.sqrt(HEAD_DIM)
    if causal:
      logits = np.where(np.tril(np.ones((LENGTH, LENGTH), bool)), logits, -np.inf)
    logits = logits - logits.max(-1, keepdims=True)
    out[:, h] = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  return out


@pytest.mark.parametrize("causal", [True, False])
def test_bias_free_logits_are_the_bilinear_form_of_the_query_key_kernels(causal):
  module = layer(qkv_bias=False, causal=causal)
  assert module.qkv.bias is None and module.out.bias is not None
  assert "bias" not in nnx.to_pure_dict(nnx.state(module, nnx.Param))["qkv"]
  x = inputs()
  w_q, w_k = module.query_key_kernels()
  np.testing.assert_array_equal(w_q, module.qkv.kernel[...][:, :WIDTH])
  np.testing.assert_allclose(module.probabilities(x), hand_probabilities(x, w_q, w_k, causal),
                             atol=2e-6)


def test_probabilities_are_causal_stochastic_rows_in_float32():
  module = layer()
  p = module.probabilities(inputs())
  assert p.shape == (2, HEADS, LENGTH, LENGTH) and p.dtype == jnp.float32
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_array_equal(np.triu(p, k=1), 0.0)
  assert np.all(np.asarray(p)[..., np.tril(np.ones((LENGTH, LENGTH), bool))] > 0)
  # The first query can only see itself.
  np.testing.assert_array_equal(p[:, :, 0, 0], 1.0)
  # With a q/k bias the probabilities are not the bias-free bilinear form.
  assert not np.allclose(p, hand_probabilities(inputs(), *module.query_key_kernels(), True),
                         atol=1e-3)


def test_probabilities_of_linear_attention_raise():
  with pytest.raises(ValueError, match="no softmax probabilities"):
    layer(kind="linear").probabilities(inputs())


@pytest.mark.parametrize("kind", ["softmax", "linear"])
@pytest.mark.parametrize("qkv_bias", [True, False])
def test_replacing_query_key_by_the_modules_own_kernels_changes_nothing(kind, qkv_bias):
  module = layer(kind=kind, qkv_bias=qkv_bias)
  x = inputs()
  w_q, w_k = module.query_key_kernels()
  own = {"w_q": w_q, "w_k": w_k}
  np.testing.assert_array_equal(module(x, query_key=own), module(x))
  np.testing.assert_array_equal(module(x, last_only=True, query_key=own),
                                module(x, last_only=True))
  if kind == "softmax":
    np.testing.assert_array_equal(module.probabilities(x, query_key=own), module.probabilities(x))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["softmax", "linear"])
def test_merged_matrices_reproduce_the_layer_and_edits_change_it(kind, causal):
  module = layer(kind=kind, causal=causal, qkv_bias=False)
  x = inputs()
  merged = module.merged_query_key()
  assert merged.shape == (HEADS, WIDTH, WIDTH)
  np.testing.assert_allclose(merged, attention.merge_query_key(*module.query_key_kernels(),
                                                                HEADS), rtol=1e-6)
  params_before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param)))
  reference = module(x)
  np.testing.assert_allclose(module(x, query_key={"merged": merged}), reference,
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(module(x, last_only=True, query_key={"merged": merged}),
                             reference[:, -1:], rtol=1e-5, atol=1e-5)
  if kind == "softmax":
    np.testing.assert_allclose(module.probabilities(x, query_key={"merged": merged}),
                               module.probabilities(x), rtol=1e-5, atol=1e-6)
  # Zeroing head 1's matrix makes its attention uniform (softmax) or absent (linear).
  pruned = merged.at[1].set(0.0)
  changed = module(x, query_key={"merged": pruned})
  assert not np.allclose(changed, reference, atol=1e-3)
  if kind == "softmax":
    p = module.probabilities(x, query_key={"merged": pruned})
    rows = np.arange(1, LENGTH + 1)[:, None] if causal else LENGTH
    expected = (np.tril(np.ones((LENGTH, LENGTH))) if causal else 1.0) / rows
    np.testing.assert_allclose(p[:, 1], np.broadcast_to(expected, p[:, 1].shape), atol=1e-6)
  # The parameters are untouched by any replacement.
  jax.tree.map(np.testing.assert_array_equal, params_before,
               nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def test_merged_logits_equal_the_hand_bilinear_form():
  module = layer(qkv_bias=False)
  x = inputs()
  merged = jax.random.normal(jax.random.key(5), (HEADS, WIDTH, WIDTH))
  hand = np.einsum("bld,hde,bse->bhls", np.asarray(x, np.float64), np.asarray(merged, np.float64),
                   np.asarray(x, np.float64))
  np.testing.assert_allclose(module.logits(x, query_key={"merged": merged}), hand,
                             rtol=1e-4, atol=1e-4)


def test_bad_query_keys_raise():
  x = inputs()
  with_bias, without_bias = layer(), layer(qkv_bias=False)
  merged = without_bias.merged_query_key()
  with pytest.raises(ValueError, match="qkv_bias=False"):
    with_bias(x, query_key={"merged": merged})
  with pytest.raises(ValueError, match="qkv_bias=False"):
    with_bias.probabilities(x, query_key={"merged": merged})
  with pytest.raises(ValueError, match="keys"):
    without_bias(x, query_key={"w_q": merged[0]})
  with pytest.raises(ValueError, match="expected"):
    without_bias(x, query_key={"merged": merged[:2]})


def backbone(mixer="softmax_attention", **kwargs):
  return functional.Functional(lambda rngs: sequence.Backbone(
      d_in=3, d_out=2, width=WIDTH, depth=2, max_len=LENGTH, mixer=mixer, num_heads=HEADS,
      use_mlp=True, rngs=rngs, **kwargs))


@pytest.mark.parametrize("mixer", sequence.MIXERS)
def test_backbone_returns_each_blocks_normalised_mixer_input(mixer):
  model = backbone(mixer)
  params = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (2, LENGTH, 3))
  out, mixer_inputs = model.apply(params, x, return_attention_inputs=True)
  np.testing.assert_array_equal(out, model.apply(params, x))
  assert len(mixer_inputs) == 2 and all(h.shape == (2, LENGTH, WIDTH) for h in mixer_inputs)
  module = model.module(params)
  first = module.blocks[0].norm_mixer(module.read_in(x) + module.positions[...][None])
  np.testing.assert_allclose(mixer_inputs[0], first, rtol=1e-6, atol=1e-6)
  second = module.blocks[1].norm_mixer(module.blocks[0](module.read_in(x)
                                                        + module.positions[...][None]))
  np.testing.assert_allclose(mixer_inputs[1], second, rtol=1e-6, atol=1e-6)
  last, _ = model.apply(params, x, last_only=True, return_attention_inputs=True)
  np.testing.assert_allclose(last[:, 0], out[:, -1], rtol=1e-5, atol=1e-6)


def test_backbone_query_keys_replace_one_block_at_a_time():
  model = backbone(qkv_bias=False)
  params = model.init(jax.random.key(0))
  assert "bias" not in params["blocks"][0]["mixer"]["qkv"]
  assert "bias" in backbone().init(jax.random.key(0))["blocks"][0]["mixer"]["qkv"]
  x = jax.random.normal(jax.random.key(1), (2, LENGTH, 3))
  module = model.module(params)
  merged = [block.mixer.merged_query_key() for block in module.blocks]
  reference = model.apply(params, x)
  np.testing.assert_array_equal(model.apply(params, x, query_keys=[None, None]), reference)
  np.testing.assert_allclose(
      model.apply(params, x, query_keys=[{"merged": m} for m in merged]), reference,
      rtol=1e-5, atol=1e-5)
  # Replacing only the second block leaves the first block's output, so its input, alone.
  # (At GPT-2 init the logits are tiny: a large random matrix, not zero, makes a difference.)
  edited = [None, {"merged": 3.0 * jax.random.normal(jax.random.key(2), merged[1].shape)}]
  out, edited_inputs = model.apply(params, x, query_keys=edited, return_attention_inputs=True)
  _, plain_inputs = model.apply(params, x, return_attention_inputs=True)
  np.testing.assert_array_equal(edited_inputs[1], plain_inputs[1])
  assert not np.allclose(out, reference, atol=1e-4)
  # jit-compatible: the replacements are ordinary array arguments.
  jitted = jax.jit(lambda p, qk: model.apply(p, x, query_keys=qk))
  np.testing.assert_allclose(jitted(params, edited), out, rtol=1e-5, atol=1e-6)


def test_backbone_query_keys_errors():
  model = backbone(qkv_bias=False)
  params = model.init(jax.random.key(0))
  x = jnp.ones((1, LENGTH, 3))
  with pytest.raises(ValueError, match="one per block"):
    model.apply(params, x, query_keys=[None])
  conv = backbone("baseconv")
  with pytest.raises(ValueError, match="BaseConv"):
    conv.apply(conv.init(jax.random.key(0)), x, query_keys=[None, None])
