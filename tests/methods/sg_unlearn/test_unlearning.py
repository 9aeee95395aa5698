"""sg_unlearn: data splits, the compiled epoch loop, retraining's isolation, the evaluation MIA."""
import dataclasses
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import parallel
from jaxlab.methods.sg_unlearn import auditor
from jaxlab.methods.sg_unlearn import data as data_lib
from jaxlab.methods.sg_unlearn import evaluation
from jaxlab.methods.sg_unlearn import reproduction
from jaxlab.methods.sg_unlearn import unlearning

MODEL = unlearning.classifier((16,))
CONFIG = pathlib.Path(__file__).resolve().parents[3] / "configs" / "sg_unlearn.py"


def toy_problem(num=60, seeds=(0, 1), alphas=(0.0,)):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num, 64)).astype(np.float32)
  y = np.arange(num) % 10
  forget = [data_lib.forget_mask(y, "random", s, fraction=0.2) for s in seeds]
  samples = []
  for f, s in zip(forget, seeds):
    members = np.flatnonzero(f)
    x_aud = np.concatenate([x[members], x[members][::-1] + 0.5])
    y_aud = np.concatenate([y[members], y[members][::-1]])
    is_member = np.r_[np.ones(len(members)), np.zeros(len(members))].astype(bool)
    train_w, test_w = auditor.fold_masks(y_aud, is_member, num_folds=2, test_fraction=0.3,
                                         num_classes=10, seed=s)
    samples.append(unlearning.AuditorSamples(
        x=x_aud, y=y_aud.astype(np.int32), member_sign=np.where(is_member, 1.0, -1.0).astype(
            np.float32), train_weights=train_w, test_weights=test_w))
  reps = len(alphas)
  inputs = reproduction.replica_inputs(
      [jax.random.key(s) for s in seeds] * reps, [(~f).astype(np.float32) for f in forget] * reps,
      [y] * len(seeds) * reps, [a for a in alphas for _ in seeds], samples * reps)
  return x, y, forget, inputs


def test_splits_and_forget_sets():
  y = np.repeat(np.arange(10), 30)
  random = data_lib.forget_mask(y, "random", 3, fraction=0.1)
  assert random.sum() == 30
  classwise = data_lib.forget_mask(y, "classwise", 13)
  assert set(y[classwise]) == {3} and classwise.sum() == 30
  wrong = data_lib.wrong_labels(y, 0)
  assert np.all(wrong != y) and wrong.min() >= 0 and wrong.max() <= 9
  with pytest.raises(ValueError, match="setting"):
    data_lib.forget_mask(y, "everything", 0)


def test_epoch_batches_put_the_selected_images_first():
  weights = jnp.asarray(np.r_[np.zeros(5), np.ones(7), np.zeros(3)], jnp.float32)
  rows, batch_weights = unlearning.epoch_batches(jax.random.key(0), weights, 4, 2)
  assert rows.shape == (2, 4)
  flat_rows, flat_weights = np.asarray(rows).ravel(), np.asarray(batch_weights).ravel()
  assert set(flat_rows[:7].tolist()) == set(range(5, 12)) and flat_weights[:7].sum() == 7
  assert flat_weights[7] == 0


def test_epoch_chunk_traces_once_across_chunks():
  x, _, _, inputs = toy_problem(alphas=(0.0, 1.0))
  recipe = unlearning.Recipe(epochs=5, batch_size=16, batches_per_epoch=4, adversarial=True,
                             newton_steps=3, chunk_epochs=2)
  counted = chex.assert_max_traces(unlearning.replica_chunk(MODEL, recipe), n=1)
  chunk = unlearning.vectorize(counted)
  params = jax.vmap(MODEL.init)(inputs.key)
  state = jax.vmap(lambda p: unlearning.init_state(p, recipe))(params)
  for start, stop in ((0, 2), (2, 4), (4, 5)):
    state, metrics = chunk(state, inputs, jnp.asarray(x), jnp.asarray(start), jnp.asarray(stop))
  assert np.all(np.isfinite(metrics["train/loss"]))
  chex.clear_trace_counter()


def test_retraining_never_sees_the_forget_set():
  x, _, forget, inputs = toy_problem(seeds=(0,))
  recipe = unlearning.Recipe(epochs=3, batch_size=16, batches_per_epoch=4, chunk_epochs=3)
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  params = jax.vmap(MODEL.init)(inputs.key)
  first = unlearning.run_phase(MODEL, recipe, params, inputs, x, mesh=mesh, progress=False)
  scrambled = x.copy()
  scrambled[forget[0]] = np.random.default_rng(1).normal(size=(forget[0].sum(), 64)) * 100
  second = unlearning.run_phase(MODEL, recipe, params, inputs, scrambled, mesh=mesh,
                                progress=False)
  chex.assert_trees_all_equal(first.params, second.params)
  third = unlearning.run_phase(MODEL, recipe, params, inputs._replace(
      base_weights=jnp.ones_like(inputs.base_weights)), scrambled, mesh=mesh, progress=False)
  assert not np.allclose(jax.tree.leaves(third.params)[0], jax.tree.leaves(first.params)[0])


def test_the_adversarial_step_lowers_the_auditors_utility():
  x, _, _, inputs = toy_problem(seeds=(0,), alphas=(0.0, 5.0))
  recipe = unlearning.Recipe(epochs=4, batch_size=16, batches_per_epoch=4, adversarial=True,
                             newton_steps=8, attacker_lr=0.05, chunk_epochs=4)
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  params = jax.vmap(MODEL.init)(jnp.stack([inputs.key[0]] * 2))
  result = unlearning.run_phase(MODEL, recipe, params, inputs, x, mesh=mesh, progress=False)
  utility = jax.vmap(lambda p, s: unlearning.auditor_utility(MODEL, recipe, p, s))(
      result.params, inputs.auditor)
  # The utility is minus the attackers' held-out loss: the leader with alpha > 0 lowers it.
  assert float(utility[1]) < float(utility[0])


def test_at_alpha_zero_the_auditor_has_no_influence():
  """alpha = 0 takes no attacker step (as the official code): exactly FT, whatever the auditor's
  data."""
  x, _, _, inputs = toy_problem(seeds=(0,), alphas=(0.0,))
  mesh = parallel.make_mesh(devices=jax.devices()[:1])
  params = jax.vmap(MODEL.init)(inputs.key)
  recipe = unlearning.Recipe(adversarial=True, epochs=2, batch_size=16, batches_per_epoch=4,
                             chunk_epochs=2)
  sg = unlearning.run_phase(MODEL, recipe, params, inputs, x, mesh=mesh, progress=False)
  other = inputs._replace(auditor=inputs.auditor._replace(x=inputs.auditor.x * -3.0 + 1.0))
  moved = unlearning.run_phase(MODEL, recipe, params, other, x, mesh=mesh, progress=False)
  chex.assert_trees_all_equal(sg.params, moved.params)
  ft = unlearning.run_phase(MODEL, dataclasses.replace(recipe, adversarial=False), params, inputs,
                            x, mesh=mesh, progress=False)
  chex.assert_trees_all_close(sg.params, ft.params, rtol=1e-6, atol=1e-7)
  stronger = unlearning.run_phase(MODEL, recipe, params, other._replace(
      alpha=jnp.ones_like(other.alpha)), x, mesh=mesh, progress=False)
  assert not np.allclose(jax.tree.leaves(stronger.params)[0], jax.tree.leaves(sg.params)[0])


def test_membership_attack_separates_only_different_losses():
  rng = np.random.default_rng(0)
  same = rng.exponential(size=400)
  accuracy, auc = evaluation.membership_attack(same[:200], same[200:], folds=5, seed=0)
  assert abs(accuracy - 0.5) < 0.1 and abs(auc - 0.5) < 0.1
  accuracy, auc = evaluation.membership_attack(rng.uniform(1e-4, 1e-3, 200),
                                               rng.uniform(1e-2, 1.0, 200), folds=5, seed=0)
  assert accuracy > 0.95 and auc > 0.99


def test_evaluate_and_gap_to_retrain():
  rng = np.random.default_rng(1)
  train_losses, test_losses = rng.exponential(0.1, 100), rng.exponential(1.0, 80)
  forget = np.zeros(100, bool)
  forget[:20] = True
  correct = np.r_[np.ones(90), np.zeros(10)].astype(bool)
  m = evaluation.evaluate(train_losses=train_losses, train_correct=correct, forget=forget,
                          test_losses=test_losses, test_correct=np.ones(80, bool), mia_folds=5)
  assert m["retain_acc"] == pytest.approx(70 / 80) and m["forget_acc"] == 1.0
  assert m["test_acc"] == 1.0 and m["mia_auc"] > 0.8
  from scipy import stats  # pylint: disable=g-import-not-at-top
  assert m["ks"] == pytest.approx(stats.ks_2samp(train_losses[:20], test_losses).statistic)
  shifted = dict(m, test_acc=m["test_acc"] - 0.6)
  assert evaluation.gap_to_retrain(shifted, m) == pytest.approx(0.6 / 6)


def test_classwise_auditor_has_one_attacker_and_no_forgotten_class_among_non_members():
  config = config_lib.load_config(CONFIG, "smoke")
  splits = data_lib.load_splits(300, seed=0, pixel_noise=0.5)
  forget = data_lib.forget_mask(splits.y_train, "classwise", 3)
  samples = reproduction.auditor_samples(splits, forget, int(forget.sum()), config, 3,
                                         "classwise")
  assert samples.train_weights.shape[0] == 1
  members = samples.member_sign > 0
  nonmembers = (samples.member_sign < 0)
  assert set(samples.y[members].tolist()) == {3} and 3 not in set(samples.y[nonmembers].tolist())
  random = reproduction.auditor_samples(splits, data_lib.forget_mask(splits.y_train, "random", 3),
                                        30, config, 3, "random")
  assert random.train_weights.shape[0] == data_lib.NUM_CLASSES


def test_claims_are_decided_over_seeds_at_the_selected_and_at_matched_alphas():
  rng = np.random.default_rng(0)
  def method(test_acc, mia, selection):
    runs = [{"test_acc": test_acc + 0.001 * rng.normal(), "mia_acc": mia + 0.002 * rng.normal(),
             "mia_auc": mia + 0.1 + 0.002 * rng.normal()} for _ in range(6)]
    for r in runs:
      r.update({k: 0.0 for k in evaluation.METRICS if k not in r}, selection=selection)
    return runs
  outcome = {"random": {"retrain": method(0.9, 0.5, 0.0), "ft": method(0.9, 0.6, 0.0),
                        "sg_alpha_1": method(0.905, 0.52, 0.2),
                        "sg_alpha_5": method(0.85, 0.5, 0.1)}}
  summary = reproduction.summarize(outcome)
  assert len(summary["random"]["ft"]["per_seed"]["mia_acc_gap"]) == 6
  claims, _ = reproduction.claims(summary)
  selected, frontier = claims
  assert selected["holds"] and "sg_alpha_1" in selected["statement"]
  assert frontier["holds"] and frontier["ours"]["matched_alphas"] == ["sg_alpha_1"]
  assert selected["paired"]["mia_acc"]["n"] == 6
