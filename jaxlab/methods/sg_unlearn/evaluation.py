"""Evaluation independent of the training auditor: accuracies, a separate MIA, loss distances.

* Accuracy on the test, retain and forget sets.
* MIA: a logistic regression on the log of the per-example loss (standardised), members = the
  forget set, non-members = as many test examples (drawn at random, so the classes are
  balanced), scored by stratified k-fold cross-validation: accuracy and AUC on each held-out fold,
  averaged over the folds. 0.5 means the forget set looks like unseen data. The log matters on a
  model that fits its training set: losses of 1e-4 (members) and 1e-2 (typical test images) are
  both "about 0" on a linear scale next to the few misclassified test images with losses near 10,
  and the attack then sees almost nothing. Per-fold scores (rather than pooling out-of-fold
  predictions of different fold models) avoid the spurious below-chance AUC that pooling gives
  when the signal is weak.
* KS statistic and 1-D Wasserstein distance between the forget and test loss distributions.
* `gap_to_retrain`: the mean absolute difference to the retrained model on the metrics that live
  on [0, 1] (accuracies, MIA accuracy and AUC, KS); W1 is left out of the mean because its scale
  is the loss's.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from scipy import stats
from sklearn import linear_model
from sklearn import metrics as sk_metrics
from sklearn import model_selection
from sklearn import pipeline
from sklearn import preprocessing

METRICS = ("test_acc", "retain_acc", "forget_acc", "mia_acc", "mia_auc", "ks", "w1")
GAP_METRICS = ("test_acc", "retain_acc", "forget_acc", "mia_acc", "mia_auc", "ks")
# Losses below this (float32 rounding of a confident softmax) are equal for the attack.
LOSS_FLOOR = 1e-12


def membership_attack(member_losses: np.ndarray, nonmember_losses: np.ndarray, *, folds: int,
                      seed: int) -> tuple[float, float]:
  """(accuracy, AUC) of a cross-validated logistic regression telling members from non-members
  by their loss; the non-members are subsampled to the members' count."""
  rng = np.random.default_rng(seed)
  count = min(len(member_losses), len(nonmember_losses))
  members = rng.choice(member_losses, count, replace=False)
  nonmembers = rng.choice(nonmember_losses, count, replace=False)
  losses = np.concatenate([members, nonmembers]).astype(np.float64)
  features = np.log(np.maximum(losses, LOSS_FLOOR))[:, None]
  labels = np.concatenate([np.ones(count), np.zeros(count)])
  splitter = model_selection.StratifiedKFold(n_splits=min(folds, count), shuffle=True,
                                             random_state=seed)
  accuracies, aucs = [], []
  for train, held_out in splitter.split(features, labels):
    attack = pipeline.make_pipeline(preprocessing.StandardScaler(),
                                    linear_model.LogisticRegression())
    attack.fit(features[train], labels[train])
    probability = attack.predict_proba(features[held_out])[:, 1]
    accuracies.append(np.mean((probability > 0.5) == labels[held_out]))
    aucs.append(sk_metrics.roc_auc_score(labels[held_out], probability))
  return float(np.mean(accuracies)), float(np.mean(aucs))


def evaluate(*, train_losses: np.ndarray, train_correct: np.ndarray, forget: np.ndarray,
             test_losses: np.ndarray, test_correct: np.ndarray, mia_folds: int = 10,
             seed: int = 0) -> dict[str, float]:
  """Every metric of one model. `forget` is the bool mask of the forget set over train."""
  forget = np.asarray(forget, bool)
  mia_acc, mia_auc = membership_attack(train_losses[forget], test_losses, folds=mia_folds,
                                       seed=seed)
  return {
      "test_acc": float(np.mean(test_correct)),
      "retain_acc": float(np.mean(train_correct[~forget])),
      "forget_acc": float(np.mean(train_correct[forget])),
      "mia_acc": mia_acc,
      "mia_auc": mia_auc,
      "ks": float(stats.ks_2samp(train_losses[forget], test_losses).statistic),
      "w1": float(stats.wasserstein_distance(train_losses[forget], test_losses)),
  }


def gap_to_retrain(metrics: Mapping[str, float], retrain: Mapping[str, float]) -> float:
  return float(np.mean([abs(metrics[k] - retrain[k]) for k in GAP_METRICS]))
