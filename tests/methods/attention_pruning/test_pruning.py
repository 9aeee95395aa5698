"""attention_pruning.pruning: the softmax, the objective's gradient and curvature, monotone GD,
the keep masks and baselines against hand-worked cases, SparseGPT against a direct transcription
of its algorithm, validation, and one compile per shape."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.attention_pruning import pruning


def gaussian_instance(seed, tokens=8, width=4, logit_std=5.0):
  """X ~ N(0, 1) [N, d] and W scaled so the logits X W X^T have std `logit_std`."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((tokens, width)).astype(np.float32)
  w = rng.standard_normal((width, width)).astype(np.float32)
  return x, (w * logit_std / np.std(x @ w @ x.T)).astype(np.float32)


def hand_softmax(logits, causal):
  logits = np.array(logits, np.float64)
  if causal:
    logits[np.triu_indices(len(logits), k=1)] = -np.inf
  weights = np.exp(logits - logits.max(axis=1, keepdims=True))
  return weights / weights.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matrix_is_the_row_softmax_of_x_w_xt(causal):
  x, w = gaussian_instance(0, tokens=6, width=3, logit_std=20.0)  # saturated rows stay finite
  got = np.asarray(pruning.attention_matrix(x, w, causal))
  np.testing.assert_allclose(got, hand_softmax(x @ w @ x.T, causal), atol=1e-6)
  if causal:
    assert np.all(got[np.triu_indices(6, k=1)] == 0.0)


def test_loss_gradient_matches_central_differences_in_float64():
  x, w = gaussian_instance(1, tokens=5, width=3, logit_std=3.0)
  sequences = np.stack([x, x[::-1] * 0.5])  # two calibration sequences: the fidelity is a sum
  mask = np.random.default_rng(2).uniform(0.0, 1.5, w.shape)
  lam, step = 0.3, 1e-6
  with jax.enable_x64(True):
    loss = jax.jit(functools.partial(pruning.mask_loss, x=sequences.astype(np.float64),
                                     w=w.astype(np.float64), lam=lam, causal=True))
    grad = np.asarray(jax.grad(loss)(jnp.asarray(mask)))
    numeric = np.zeros_like(mask)
    for index in np.ndindex(*mask.shape):
      bump = np.zeros_like(mask)
      bump[index] = step
      numeric[index] = (float(loss(mask + bump)) - float(loss(mask - bump))) / (2 * step)
  assert grad.dtype == np.float64
  np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)


def test_power_iteration_finds_the_largest_hessian_eigenvalue():
  x, w = gaussian_instance(3, tokens=6, width=3)
  lam = 0.05
  fidelity = lambda m: pruning.mask_loss(m.reshape(3, 3), x, w, 0.0)
  hessian = jax.jit(jax.hessian(fidelity))(jnp.ones(9))
  curvature = float(np.linalg.eigvalsh(np.asarray(hessian, np.float64)).max())
  eta = float(pruning.hessian_step_size(x, w, lam, iterations=100))
  np.testing.assert_allclose(1.0 / eta, curvature * (1.0 + lam), rtol=1e-3)
  eta_absolute = float(pruning.hessian_step_size(x, w, lam, iterations=100,
                                                 lam_scale="absolute"))
  np.testing.assert_allclose(1.0 / eta_absolute, curvature + lam, rtol=1e-3)


def test_gd_loss_is_monotone_at_the_power_iteration_step_and_matches_the_objective():
  x, w = gaussian_instance(4, tokens=8, width=4)
  sequences = np.stack([x, gaussian_instance(5, tokens=8, width=4)[0]])
  mask, losses = pruning.gd_mask(sequences, w, lam=0.01, steps=60)
  losses = np.asarray(losses)
  assert losses.shape == (61,)
  assert np.all(np.diff(losses) <= 1e-6 * losses[0]) and losses[-1] < 0.9 * losses[0]
  lam = float(pruning.regularisation_weight(sequences, w, 0.01))
  np.testing.assert_allclose(losses[0], pruning.mask_loss(np.ones_like(w), sequences, w, lam),
                             rtol=1e-6)
  np.testing.assert_allclose(losses[-1], pruning.mask_loss(mask, sequences, w, lam), rtol=1e-5)


def test_factor_masks_descend_monotonically_and_vmap_over_heads_matches_one_by_one():
  x, _ = gaussian_instance(6, tokens=8, width=4)
  rng = np.random.default_rng(7)
  w_q, w_k = (rng.standard_normal((2, 4, 2)) * 2.0).astype(np.float32)
  (m_q, m_k), losses = pruning.gd_mask_factors(x, w_q, w_k, lam=0.01, steps=40, causal=True)
  assert m_q.shape == w_q.shape and m_k.shape == w_k.shape
  assert np.all(np.diff(np.asarray(losses)) <= 1e-6 * float(losses[0]))

  heads = np.stack([pruning.merged_weight(w_q, w_k), gaussian_instance(8, width=4)[1]])
  run = functools.partial(pruning.gd_mask, lam=0.01, steps=20)
  masks, head_losses = jax.vmap(run, in_axes=(None, 0))(x, heads)
  assert masks.shape == (2, 4, 4) and head_losses.shape == (2, 21)
  for head in range(2):
    np.testing.assert_allclose(masks[head], run(x, heads[head])[0], rtol=1e-5, atol=1e-6)


def test_a_lam_grid_descends_as_each_lam_alone_and_keeps_the_least_calibration_error():
  x, w = gaussian_instance(15, tokens=8, width=4)
  lams = (0.03, 0.01, 0.001)
  masks, losses = pruning.gd_mask_grid(x, w, lams=lams, steps=25)
  assert masks.shape == (3, 4, 4) and losses.shape == (3, 26)
  errors = []
  for i, lam in enumerate(lams):
    alone, alone_losses = pruning.gd_mask(x, w, lam=lam, steps=25)
    np.testing.assert_allclose(masks[i], alone, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses[i], alone_losses, rtol=1e-5)
    errors.append(pruning.attention_error(x, w, pruning.binarise(alone, w, 0.5)[1]))
  assert len(set(np.round(errors, 6))) > 1  # the choice matters on this instance
  w_new, best, got_errors = pruning.select_binarised(x, w, masks, 0.5)
  np.testing.assert_allclose(got_errors, errors, rtol=1e-5)
  assert int(best) == int(np.argmin(errors))
  np.testing.assert_allclose(w_new, pruning.binarise(masks[best], w, 0.5)[1])
  np.testing.assert_allclose(pruning.prune(x, w, "gd_mask", 0.5, lam=lams, steps=25)[1],
                             pruning.prune(x, w, "gd_mask", 0.5, lam=lams[best], steps=25)[1],
                             rtol=1e-5, atol=1e-6)


def test_a_lam_grid_on_factors_chooses_by_the_merged_matrix_error():
  x, _ = gaussian_instance(16, tokens=8, width=4)
  rng = np.random.default_rng(17)
  w_q, w_k = (rng.standard_normal((2, 4, 2)) * 2.0).astype(np.float32)
  lams = (0.03, 0.001)
  (masks_q, masks_k), losses = pruning.gd_mask_factors_grid(x, w_q, w_k, lams=lams, steps=20,
                                                            causal=True)
  assert masks_q.shape == (2, 4, 2) and losses.shape == (2, 21)
  errors = []
  for i, lam in enumerate(lams):
    (m_q, m_k), _ = pruning.gd_mask_factors(x, w_q, w_k, lam=lam, steps=20, causal=True)
    np.testing.assert_allclose(masks_q[i], m_q, rtol=1e-5, atol=1e-6)
    q, k = (pruning.binarise(m, f, 0.5)[1] for m, f in ((m_q, w_q), (m_k, w_k)))
    errors.append(pruning.attention_error(x, pruning.merged_weight(w_q, w_k),
                                          pruning.merged_weight(q, k), causal=True))
  q_new, k_new, best, got = pruning.select_binarised_factors(x, w_q, w_k, masks_q, masks_k, 0.5,
                                                             causal=True)
  np.testing.assert_allclose(got, errors, rtol=1e-5)
  assert int(best) == int(np.argmin(errors))
  np.testing.assert_allclose(q_new, pruning.binarise(masks_q[best], w_q, 0.5)[1])


def test_magnitude_keeps_the_largest_per_column_and_lower_index_on_ties():
  w = np.array([[1.0, -2.0], [-1.0, 2.0], [3.0, 0.0], [1.0, 0.0]], np.float32)
  mask, w_new = pruning.magnitude(w, 0.5)
  np.testing.assert_array_equal(mask, [[True, True], [False, True], [True, False],
                                       [False, False]])
  np.testing.assert_array_equal(w_new, np.where(mask, w, 0.0))
  # Three kept: the zeros of column 1 tie and the lower index (2) wins.
  np.testing.assert_array_equal(pruning.magnitude(w, 0.25)[0],
                                [[True, True], [True, True], [True, True], [False, False]])


def test_wanda_scores_weights_by_input_feature_norms():
  # Feature norms over both tokens: 5, 10, 5, 2.5 (exact in float32).
  x = np.array([[3.0, 6.0, 3.0, 1.5], [4.0, 8.0, 4.0, 2.0]], np.float32)
  w = np.array([[2.0, 1.0], [1.0, 0.25], [2.0, -3.0], [4.0, 1.0]], np.float32)
  # Scores: column 0 all 10 (a four-way tie: inputs 0 and 1), column 1 5, 2.5, 15, 2.5.
  mask, w_new = pruning.wanda(x, w, 0.5)
  np.testing.assert_array_equal(mask, [[True, True], [True, False], [False, True],
                                       [False, False]])
  np.testing.assert_array_equal(w_new, np.where(mask, w, 0.0))
  np.testing.assert_array_equal(pruning.wanda(x[None], w, 0.75)[0],  # sequences flatten
                                [[True, False], [False, False], [False, True], [False, False]])
  _, by_prune = pruning.prune(x, w, "wanda", 0.5)
  np.testing.assert_array_equal(by_prune, w_new)
  assert pruning.magnitude(w, 0.5)[0][3, 0]  # magnitude alone would keep input 3


def reference_sparsegpt(x, w, sparsity, blocksize, damp):
  """SparseGPT as its algorithm is laid out, in float64: a mask per block, updates inside the
  block, and one lazy update of the later inputs from the block's accumulated errors."""
  x, w = x.astype(np.float64), w.astype(np.float64).copy()
  d_in = w.shape[0]
  hessian = x.T @ x
  hessian += damp * np.mean(np.diag(hessian)) * np.eye(d_in)
  upper = np.linalg.cholesky(np.linalg.inv(hessian)).T
  keep = np.zeros(w.shape, bool)
  for i1 in range(0, d_in, blocksize):
    i2 = min(i1 + blocksize, d_in)
    block, errors = w[i1:i2].copy(), np.zeros((i2 - i1, w.shape[1]))
    scores = block ** 2 / np.diag(upper)[i1:i2, None] ** 2
    for column in range(w.shape[1]):
      kept = np.argsort(-scores[:, column], kind="stable")[:round((1 - sparsity) * (i2 - i1))]
      keep[i1 + kept, column] = True
    for j in range(i2 - i1):
      i = i1 + j
      quantized = np.where(keep[i], block[j], 0.0)
      errors[j] = (block[j] - quantized) / upper[i, i]
      block[j + 1:] -= np.outer(upper[i, i + 1:i2], errors[j])
      block[j] = quantized
    w[i1:i2] = block
    w[i2:] -= upper[i1:i2, i2:].T @ errors
  return keep, w


def test_sparsegpt_equals_the_blocked_algorithm_and_returns_w_at_zero_sparsity():
  rng = np.random.default_rng(9)
  x = rng.standard_normal((40, 12)).astype(np.float32)
  w = rng.standard_normal((12, 5)).astype(np.float32)
  mask, w_new = pruning.sparsegpt(x, w, 0.5, blocksize=4)
  ref_mask, ref_w = reference_sparsegpt(x, w, 0.5, 4, 0.01)
  np.testing.assert_array_equal(mask, ref_mask)
  np.testing.assert_allclose(w_new, ref_w, rtol=1e-4, atol=1e-4)
  assert np.all(np.asarray(mask).sum(axis=0) == 6)
  assert np.all(np.asarray(w_new)[~np.asarray(mask)] == 0.0)

  mask, w_same = pruning.sparsegpt(x, w, 0.0)
  assert np.all(mask)
  np.testing.assert_array_equal(w_same, w)


def test_sparsegpt_keeps_the_linear_map_closer_than_wanda():
  for seed in range(3):
    rng = np.random.default_rng(10 + seed)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    errors = {m: pruning.linear_error(x, w, pruning.prune(x, w, m, 0.5)[1])
              for m in ("wanda", "sparsegpt")}
    assert errors["sparsegpt"] <= errors["wanda"], errors


def test_keep_values_choose_between_w_o_m_and_w_on_the_kept_entries():
  x, w = gaussian_instance(11, tokens=8, width=4)
  options = dict(lam=0.01, steps=30)
  keep, original = pruning.prune(x, w, "gd_mask", 0.5, keep_values=False, **options)
  assert keep.dtype == bool and np.all(keep.sum(axis=0) == 2)
  np.testing.assert_array_equal(original, np.where(keep, w, 0.0))
  mask, _ = pruning.gd_mask(x, w, **options)
  keep_scaled, scaled = pruning.prune(x, w, "gd_mask", 0.5, **options)
  np.testing.assert_array_equal(keep_scaled, keep)
  np.testing.assert_allclose(scaled, np.where(keep, w * np.asarray(mask), 0.0), rtol=1e-6)
  assert not np.allclose(scaled, original)


def test_attention_error_sums_sequences_and_is_zero_for_the_same_weight():
  x, w = gaussian_instance(12, tokens=6, width=3)
  sequences = np.stack([x, 2.0 * x])
  w_new = np.where(np.eye(3, dtype=bool), w, 0.0)
  diffs = [pruning.attention_matrix(s, w_new) - pruning.attention_matrix(s, w) for s in sequences]
  refs = [pruning.attention_matrix(s, w) for s in sequences]
  expected = np.sqrt(sum(np.sum(np.square(d)) for d in diffs)
                     / sum(np.sum(np.square(r)) for r in refs))
  np.testing.assert_allclose(pruning.attention_error(sequences, w, w_new), expected, rtol=1e-5)
  assert pruning.attention_error(x, w, w) == 0.0
  assert pruning.linear_error(x, w, w) == 0.0 and pruning.output_error(x, w, w, w) == 0.0


def _bad_calls():
  x, w = gaussian_instance(13, tokens=4, width=3)
  w_q = np.ones((3, 2), np.float32)
  nan_x = x.copy()
  nan_x[0, 0] = np.nan
  inf_w = w.copy()
  inf_w[1, 1] = np.inf
  return [
      ("sparsity", lambda: pruning.prune(x, w, "magnitude", 1.0)),
      ("sparsity", lambda: pruning.prune(x, w, "wanda", -0.1)),
      ("sparsity", lambda: pruning.prune(x, w, "gd_mask", float("nan"))),
      ("x contains NaN", lambda: pruning.prune(nan_x, w, "gd_mask", 0.5)),
      ("w contains NaN or inf", lambda: pruning.prune(x, inf_w, "sparsegpt", 0.5)),
      ("last dimension", lambda: pruning.prune(x, np.ones((4, 4), np.float32), "wanda", 0.5)),
      ("square", lambda: pruning.prune(x, np.ones((3, 2), np.float32), "gd_mask", 0.5)),
      ("at least 2 tokens", lambda: pruning.prune(x[:1], w, "gd_mask", 0.5)),
      ("x must have 2 or 3 dimensions", lambda: pruning.prune(x[0], w, "wanda", 0.5)),
      ("unknown method", lambda: pruning.prune(x, w, "obs", 0.5)),
      ("unknown score", lambda: pruning.prune(x, w, "gd_mask", 0.5, score="weight")),
      ("unknown lam_scale", lambda: pruning.prune(x, w, "gd_mask", 0.5, lam_scale="x")),
      ("do not apply", lambda: pruning.prune(x, w, "wanda", 0.5, blocksize=4)),
      ("steps", lambda: pruning.prune(x, w, "gd_mask", 0.5, steps=0)),
      ("lam", lambda: pruning.prune(x, w, "gd_mask", 0.5, lam=-1.0)),
      ("lam must be", lambda: pruning.prune(x, w, "gd_mask", 0.5, lam=(0.01, -1.0))),
      ("empty grid", lambda: pruning.prune(x, w, "gd_mask", 0.5, lam=())),
      ("blocksize", lambda: pruning.prune(x, w, "sparsegpt", 0.5, blocksize=0)),
      ("same shape", lambda: pruning.prune_factors(x, w_q, w, "magnitude", 0.5)),
      ("sparsity", lambda: pruning.prune_factors(x, w_q, w_q, "gd_mask", 1.5)),
      ("sparsity", lambda: pruning.keep_mask(np.ones((3, 3)), 1.0)),
  ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_inputs_raise_value_errors_naming_the_problem_before_any_compile(index, monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("validation must come before any computation")

  for name in ("_gd_mask", "_gd_mask_factors", "_sparsegpt", "_top_per_column"):
    monkeypatch.setattr(pruning, name, never)
  message, call = _bad_calls()[index]
  with pytest.raises(ValueError, match=message):
    call()


def test_gd_mask_traces_once_for_two_calls_of_the_same_shapes(monkeypatch):
  traces = []
  merged_fidelity = pruning._merged_fidelity

  def counted(*args):
    traces.append(1)  # Python side effect: runs only while tracing
    return merged_fidelity(*args)

  monkeypatch.setattr(pruning, "_merged_fidelity", counted)
  x, w = gaussian_instance(14, tokens=7, width=5)  # shapes no other test uses
  pruning.gd_mask(x, w, lam=0.01, steps=3)
  pruning.gd_mask(2.0 * x, -w, lam=0.02, steps=3, eta=None)
  assert len(traces) == 1
  pruning.gd_mask(x, w, lam=0.01, steps=4)  # a new static argument does retrace
  assert len(traces) == 2
