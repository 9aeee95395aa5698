"""zoo.unet taps, decoder attention levels and attention overrides."""
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.zoo import unet


def small(attention_levels=(1,), seed=0):
  return unet.UNet(in_channels=3, out_channels=3, base_channels=8, channel_multipliers=(1, 2),
                   groups=4, num_heads=2, attention_levels=attention_levels,
                   rngs=nnx.Rngs(seed))


def perturb(model):
  # The output conv starts at zero: move every parameter so the output depends on everything.
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(9), len(leaves))
  leaves = [leaf + 0.1 * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys)]
  nnx.update(model, jax.tree.unflatten(treedef, leaves))
  return model


X = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
T = jnp.asarray([3, 40])


def test_taps_leave_the_output_unchanged_and_have_their_shapes():
  model = perturb(small())
  plain = model(X, T)
  out, taps = model(X, T, taps=model.tap_names())
  np.testing.assert_array_equal(out, plain)
  assert set(taps) == set(model.tap_names())
  assert taps["enc0_0"].shape == (2, 8, 8, 8) and taps["mid"].shape == (2, 4, 4, 16)
  assert taps["dec1_q"].shape == (2, 4, 4, 16) and taps["dec0_1"].shape == (2, 8, 8, 8)


def test_unknown_taps_and_layers_fail_naming_them():
  model = small()
  with pytest.raises(ValueError, match="unknown taps"):
    model(X, T, taps=("dec7_0",))
  with pytest.raises(ValueError, match="attention layers"):
    model(X, T, attention_override={"dec0": unet.AttentionOverride()})


def test_without_attention_levels_the_parameter_layout_is_the_old_one():
  params = nnx.to_pure_dict(nnx.state(small(attention_levels=()), nnx.Param))
  assert "decoder_attention" not in params
  assert "decoder_attention" in nnx.to_pure_dict(nnx.state(small(), nnx.Param))


def test_an_override_with_the_layers_own_keys_changes_nothing():
  model = perturb(small())
  _, taps = model(X, T, taps=("dec1_q", "dec1_k", "dec1_v", "mid_k", "mid_v"))
  same = {"dec1": unet.AttentionOverride(key=taps["dec1_k"], value=taps["dec1_v"],
                                         query=taps["dec1_q"], query_blend=0.5),
          "mid": unet.AttentionOverride(key=taps["mid_k"], value=taps["mid_v"])}
  np.testing.assert_allclose(model(X, T, attention_override=same), model(X, T), atol=1e-5)


def test_injected_keys_and_values_attend_to_the_other_image():
  model = perturb(small())
  other = jax.random.normal(jax.random.key(2), X.shape)
  _, theirs = model(other, T, taps=("dec1_k", "dec1_v"))
  injected = model(X, T, attention_override={"dec1": unet.AttentionOverride(
      key=theirs["dec1_k"], value=theirs["dec1_v"], temperature=1.5)})
  assert float(jnp.abs(injected - model(X, T)).max()) > 1e-3
