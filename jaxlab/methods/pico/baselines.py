"""The rankings PiCO is compared with, on the same battles.

Fixed reviewer weights (the official `main_ablation.py` baselines, scored by its `cal_score`:
plain outcomes 1 / 1/2 / 0, no rank bonus, and an error penalty):

  G_j = (1/N_j) sum_{battles of j} s_j w_r  -  0.05 w_j (E_j / J_j),

E_j the battles reviewer j judged with at least one `error` verdict, J_j all battles it judged
(a model that judges nothing gets no penalty; the official code would divide by zero). Weights:
- Uniform: w = 1.
- Reversed: w rises from 0 (the best model in the true order) to 1 (the worst): i / (n - 1).
- Order: w falls from 1 (the best) by 1/n a place: 1 - i / n (an oracle: it needs the true order).
Reversed uses the true order as well (the official `model_list` is the human order), inverted.

Reviewer-weight-free and reconstructed baselines:
- Majority voting: a battle (a question and an unordered pair) counts once, won by the model
  more of its reviewers prefer (each reviewer's double verdict as in `battles`; a reviewer's tie
  abstains); a model's score is its mean outcome (1, 1/2, 0) over its battles.
- PageRank: every judged battle adds an edge loser -> winner of weight 1 (a tie 1/2 each way);
  PageRank with damping 0.85 by power iteration (a model that never lost spreads its rank
  uniformly).
- PRD-style (Li et al.'s Peer Rank, reconstructed): start from w = 1; a reviewer's weight is its
  own score, w <- G(w) / max G(w), iterated to the fixed point. G is linear in w (G = M w), so
  the fixed point is the Perron vector of M, found by power iteration.

Battles are `battles.Battles`; the true order is model indices, best first.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from jaxlab.methods.pico import battles as battles_lib
from jaxlab.methods.pico import consistency

ERROR_PENALTY = 0.05
DAMPING = 0.85
SCHEDULES = ("uniform", "reversed", "order")


class Ranking(NamedTuple):
  order: np.ndarray       # [n] int, model indices best first
  scores: np.ndarray      # [n] float
  weights: np.ndarray     # [n] float, reviewer weights (ones where a method has none)


def as_ranking(scores: np.ndarray, weights: np.ndarray | None = None, seed: int = 0) -> Ranking:
  """Order by descending score. Exact ties are broken by a seeded random permutation, never by
  model index: models are often indexed in the true order, and an index tie-break would hand
  a degenerate ranking (e.g. all scores equal) a perfect correlation."""
  scores = np.asarray(scores, np.float64)
  weights = np.ones_like(scores) if weights is None else np.asarray(weights, np.float64)
  tie_break = np.random.default_rng(seed).permutation(len(scores))
  return Ranking(np.lexsort((tie_break, -scores)), scores, weights)


def judge_errors(records: Sequence[dict]) -> np.ndarray:
  """[B] bool: the records with an `error` verdict in either game (the penalty's E)."""
  return np.array([r["g1_winner"] == "error" or r["g2_winner"] == "error" for r in records],
                  bool)


def _positions(true_order: Sequence[int], num_models: int) -> np.ndarray:
  """[n] each model's place in the true order (0 = best); the order must be a permutation."""
  true_order = np.asarray(true_order, np.int64)
  if sorted(true_order.tolist()) != list(range(num_models)):
    raise ValueError(f"true_order must be a permutation of the {num_models} model indices, "
                     f"got {true_order.tolist()}")
  positions = np.empty(num_models, np.int64)
  positions[true_order] = np.arange(num_models)
  return positions


def schedule_weights(schedule: str, num_models: int,
                     true_order: Sequence[int] | None = None) -> np.ndarray:
  """[n] the official baseline weights, indexed by model."""
  if schedule == "uniform":
    return np.ones(num_models)
  if schedule not in SCHEDULES:
    raise ValueError(f"unknown weight schedule {schedule!r}; expected one of {SCHEDULES}")
  if true_order is None:
    raise ValueError(f"the {schedule!r} weights follow the true order: pass true_order")
  positions = _positions(true_order, num_models)
  if schedule == "reversed":   # torch.arange(0, 1 + 1/(n-1), 1/(n-1))[i]
    return positions / (num_models - 1)
  return 1.0 - positions / num_models   # torch.arange(0, 1 + 1/n, 1/n).flip(0)[i]


def weighted(battles: battles_lib.Battles, weights: np.ndarray, errors: np.ndarray | None = None,
             error_penalty: float = ERROR_PENALTY) -> Ranking:
  """The official `cal_score` with fixed weights: plain weighted scores minus the error
  penalty (`errors` [B] bool, None = no errors known)."""
  data = consistency.arrays(battles)
  w = jnp.asarray(weights, jnp.float32)
  scores = np.asarray(consistency.scores(data, w), np.float64)
  if errors is not None:
    errors = np.asarray(errors, bool)
    if errors.shape != (battles.num_battles,):
      raise ValueError(f"errors has shape {errors.shape}, expected ({battles.num_battles},)")
    judged = np.bincount(battles.reviewer, minlength=battles.num_models)
    erred = np.bincount(battles.reviewer, weights=errors, minlength=battles.num_models)
    rate = erred / np.maximum(judged, 1)
    scores = scores - error_penalty * np.asarray(weights, np.float64) * rate
  return as_ranking(scores, weights)


def schedule(battles: battles_lib.Battles, name: str, true_order: Sequence[int] | None = None,
             errors: np.ndarray | None = None, error_penalty: float = ERROR_PENALTY) -> Ranking:
  """Uniform, Reversed or Order (the last two need `true_order`)."""
  return weighted(battles, schedule_weights(name, battles.num_models, true_order), errors,
                  error_penalty)


def majority(battles: battles_lib.Battles) -> Ranking:
  """Majority voting: one outcome per (question, unordered pair) from its reviewers' votes."""
  low = np.minimum(battles.model_a, battles.model_b)
  high = np.maximum(battles.model_a, battles.model_b)
  # +1: the lower-indexed model of the pair won this reviewer's battle, -1: the other, 0: a tie.
  low_score = np.where(battles.model_a == low, battles.score_a, 1.0 - battles.score_a)
  vote = np.sign(low_score - 0.5)
  keys = np.stack([battles.question, low, high], axis=1)
  groups, group = np.unique(keys, axis=0, return_inverse=True)
  tally = np.bincount(group.reshape(-1), weights=vote, minlength=len(groups))
  low_outcome = 0.5 + 0.5 * np.sign(tally)
  n = battles.num_models
  total = (np.bincount(groups[:, 1], weights=low_outcome, minlength=n)
           + np.bincount(groups[:, 2], weights=1.0 - low_outcome, minlength=n))
  count = np.bincount(groups[:, 1], minlength=n) + np.bincount(groups[:, 2], minlength=n)
  return as_ranking(total / np.maximum(count, 1))


def pagerank(battles: battles_lib.Battles, damping: float = DAMPING, num_iterations: int = 200,
             tolerance: float = 1e-12) -> Ranking:
  """PageRank of the win graph (edges loser -> winner, weighted by wins; a tie 1/2 each way)."""
  n = battles.num_models
  # links[i, j]: how much i lost to j (i -> j).
  links = np.zeros((n, n))
  np.add.at(links, (battles.model_b, battles.model_a), battles.score_a)
  np.add.at(links, (battles.model_a, battles.model_b), 1.0 - battles.score_a)
  out = links.sum(axis=1, keepdims=True)
  # Row-stochastic transitions; a model that never lost links to everyone.
  transition = np.where(out > 0, links / np.maximum(out, 1e-300), 1.0 / n)
  rank = np.full(n, 1.0 / n)
  for _ in range(num_iterations):
    new = (1.0 - damping) / n + damping * rank @ transition
    converged = np.abs(new - rank).sum() < tolerance
    rank = new
    if converged:
      break
  return as_ranking(rank)


def prd(battles: battles_lib.Battles, num_iterations: int = 200,
        tolerance: float = 1e-12) -> Ranking:
  """PRD-style iterative reviewer weighting: w <- G(w) / max G(w) from w = 1 to the fixed point."""
  n = battles.num_models
  # G = M w: M[j, r] = (1/N_j) sum over the battles of j judged by r of s_j.
  m = np.zeros((n, n))
  np.add.at(m, (battles.model_a, battles.reviewer), battles.score_a)
  np.add.at(m, (battles.model_b, battles.reviewer), 1.0 - battles.score_a)
  count = np.bincount(battles.model_a, minlength=n) + np.bincount(battles.model_b, minlength=n)
  m /= np.maximum(count, 1)[:, None]
  w = np.ones(n)
  for _ in range(num_iterations):
    g = m @ w
    new = g / max(g.max(), 1e-300)
    converged = np.abs(new - w).max() < tolerance
    w = new
    if converged:
      break
  return as_ranking(m @ w, w)
