"""PiCO's consistency optimisation: reviewer weights that make ability and score agree.

Every model is also a reviewer, with a confidence weight w_r. A model's score is the weighted
average of its battle outcomes,

  G_j = (1/N_j) sum_{battles b of j} s_j(b) w_{reviewer(b)},

(N_j: the battles j took part in), and PiCO looks for the w that best agrees with the scores it
induces: minimise 1 - Pearson(w, G(w)) over the 15 models (the consistency assumption: strong
models answer better and also judge better). As the official `main.py`:

- w = sigmoid(A u + c), u ~ N(0, I_n) drawn once per seed and fixed, (A, c) an n x n linear
  layer initialised like `torch.nn.Linear` (U(-1/sqrt(n), 1/sqrt(n))), n the number of models;
- SGD, learning rate 0.1 times 0.1 every 10 steps, 30 full-batch steps (one `lax.scan`);
- the "rank" score (the default): a winner gets 1 + (rank(winner) - rank(loser)) / K instead
  of 1, ranks from the current w (0 = largest weight) held constant, K = 200; a tie gives both
  1/2, a loser 0. An upset (a lower-ranked model beating a higher-ranked one) earns a little more;
- the ranking is the last step's G, descending.

Also here: the Elo score (`variant="elo"`, BASE 10, SCALE 400, initial rating 1000, K-factor 4
scaled by the battle's reviewer weight, sequential over battles in file order: the update rule
is reconstructed, the official code only names the constants), the per-reviewer subsampling of
the official fraction runs, and unsupervised elimination (reconstructed: see `eliminate`).

Shapes: B battles, n models. Everything traced takes a `BattleArrays` plus two masks, so a
different fraction (a battle mask) or an eliminated reviewer (a reviewer mask) is a different
value, not a different shape: one compilation per battle-array size, and seeds, fractions and
eliminations can be `jax.vmap`ped.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.methods.pico import battles as battles_lib

K_RANK = 200              # main.py (main_ablation.py uses 1000)
NUM_STEPS = 30
LEARNING_RATE = 0.1
DECAY_EVERY = 10          # StepLR(step_size=10, gamma=0.1)
DECAY = 0.1
ELO_BASE = 10.0
ELO_SCALE = 400.0
ELO_K = 4.0
ELO_INIT = 1000.0
MAX_ELIMINATED = 8
VARIANTS = ("rank", "elo")


class BattleArrays(NamedTuple):
  """The traced part of `Battles` (a pytree), all [B]."""
  model_a: jax.Array      # int32
  model_b: jax.Array      # int32
  reviewer: jax.Array     # int32
  score_a: jax.Array      # float32 in {0, 1/2, 1}; model_b's is 1 - score_a


def arrays(battles: battles_lib.Battles) -> BattleArrays:
  return BattleArrays(jnp.asarray(battles.model_a, jnp.int32),
                      jnp.asarray(battles.model_b, jnp.int32),
                      jnp.asarray(battles.reviewer, jnp.int32),
                      jnp.asarray(battles.score_a, jnp.float32))


class Params(NamedTuple):
  """The trainable layer: w = sigmoid(A u + c)."""
  A: jax.Array            # [n, n]
  c: jax.Array            # [n]


class Fit(NamedTuple):
  """One fit's last step (the official code returns the w and G of its last iteration)."""
  weights: jax.Array      # [n] w of the last step
  scores: jax.Array       # [n] G(w) of the last step
  order: jax.Array        # [n] model indices by descending score, best first (exact ties,
                          # degenerate here, by index; `ranking.rank` breaks them at random)
  loss: jax.Array         # [] 1 - Pearson(w, G) of the last step
  losses: jax.Array       # [num_steps] the loss at every step


# ----------------------------------------------------------------------------------------------
# Scores.


def ranks_of(w: jax.Array) -> jax.Array:
  """[n] int32 rank of each model by weight, 0 = largest (ties by index), with no gradient."""
  w = jax.lax.stop_gradient(w)
  return jnp.argsort(jnp.argsort(-w, stable=True), stable=True).astype(jnp.int32)


def included(data: BattleArrays, reviewer_mask: jax.Array | None = None,
             battle_mask: jax.Array | None = None) -> jax.Array:
  """[B] float 0/1: the battles kept by `battle_mask` [B] and judged by a reviewer still in
  `reviewer_mask` [n] (None keeps all)."""
  keep = jnp.ones(data.score_a.shape, jnp.float32)
  if battle_mask is not None:
    keep = keep * jnp.asarray(battle_mask, jnp.float32)
  if reviewer_mask is not None:
    keep = keep * jnp.asarray(reviewer_mask, jnp.float32)[data.reviewer]
  return keep


def battle_counts(data: BattleArrays, include: jax.Array, num_models: int) -> jax.Array:
  """[n] N_j, the kept battles model j took part in."""
  return (jax.ops.segment_sum(include, data.model_a, num_segments=num_models)
          + jax.ops.segment_sum(include, data.model_b, num_segments=num_models))


def scores(data: BattleArrays, w: jax.Array, include: jax.Array | None = None,
           ranks: jax.Array | None = None, k_rank: float = K_RANK) -> jax.Array:
  """[n] G_j = (1/N_j) sum over the kept battles of j of s_j * w_reviewer.

  `ranks` None: s is the plain outcome (1, 1/2, 0). `ranks` [n] given: the rank variant, the
  winner's s is 1 + (ranks[winner] - ranks[loser]) / k_rank. A model with no kept battle gets 0
  (the official code would divide by zero).
  """
  num_models = w.shape[0]
  if include is None:
    include = jnp.ones(data.score_a.shape, jnp.float32)
  s_a = data.score_a
  s_b = 1.0 - data.score_a
  if ranks is not None:
    gap = (ranks[data.model_a] - ranks[data.model_b]).astype(jnp.float32) / k_rank
    # Only a strict winner (s = 1) gets the bonus; ties stay 1/2 and losers 0.
    s_a = jnp.where(data.score_a == 1.0, 1.0 + gap, s_a)
    s_b = jnp.where(data.score_a == 0.0, 1.0 - gap, s_b)
  weight = w[data.reviewer] * include
  total = (jax.ops.segment_sum(s_a * weight, data.model_a, num_segments=num_models)
           + jax.ops.segment_sum(s_b * weight, data.model_b, num_segments=num_models))
  count = battle_counts(data, include, num_models)
  return total / jnp.maximum(count, 1.0)


def elo_ratings(data: BattleArrays, w: jax.Array, include: jax.Array | None = None) -> jax.Array:
  """[n] Elo ratings after one sequential pass over the kept battles in array order.

  Every rating starts at 1000; a battle moves model_a by K w_r (s_a - E_a) and model_b by the
  opposite, E_a = 1 / (1 + BASE^((R_b - R_a) / SCALE)). Differentiable in w through the scan.
  """
  if include is None:
    include = jnp.ones(data.score_a.shape, jnp.float32)

  def step(ratings, battle):
    a, b, r, s_a, keep = battle
    expected_a = 1.0 / (1.0 + ELO_BASE ** ((ratings[b] - ratings[a]) / ELO_SCALE))
    delta = ELO_K * w[r] * keep * (s_a - expected_a)
    return ratings.at[a].add(delta).at[b].add(-delta), None

  start = jnp.full(w.shape, ELO_INIT, w.dtype)
  ratings, _ = jax.lax.scan(
      step, start, (data.model_a, data.model_b, data.reviewer, data.score_a, include))
  return ratings


def pearson_loss(x: jax.Array, y: jax.Array) -> jax.Array:
  """1 - Pearson(x, y) (the official `pearson_correlation`)."""
  dx = x - jnp.mean(x)
  dy = y - jnp.mean(y)
  # The floor only keeps a constant vector (0/0) from giving NaN gradients.
  denominator = jnp.sqrt(jnp.maximum(jnp.sum(dx * dx) * jnp.sum(dy * dy), 1e-30))
  return 1.0 - jnp.sum(dx * dy) / denominator


# ----------------------------------------------------------------------------------------------
# The fit.


def init(key: jax.Array, num_models: int) -> tuple[Params, jax.Array]:
  """(Params, u): (A, c) ~ U(-1/sqrt(n), 1/sqrt(n)) as `torch.nn.Linear(n, n)`, u ~ N(0, I_n)."""
  key_u, key_a, key_c = jax.random.split(key, 3)
  bound = 1.0 / np.sqrt(num_models)
  params = Params(
      A=jax.random.uniform(key_a, (num_models, num_models), jnp.float32, -bound, bound),
      c=jax.random.uniform(key_c, (num_models,), jnp.float32, -bound, bound))
  u = jax.random.normal(key_u, (num_models,), jnp.float32)
  return params, u


def weights_of(params: Params, u: jax.Array) -> jax.Array:
  return jax.nn.sigmoid(params.A @ u + params.c)


def objective(w: jax.Array, data: BattleArrays, include: jax.Array, variant: str = "rank",
              ranks: jax.Array | None = None, k_rank: float = K_RANK
              ) -> tuple[jax.Array, jax.Array]:
  """(1 - Pearson(w, G(w)), G) for one w. The rank variant freezes ranks at `ranks`, or at
  ranks_of(w) when None (the official code's constants: no gradient through the ranks)."""
  if variant == "rank":
    g = scores(data, w, include, ranks_of(w) if ranks is None else ranks, k_rank)
  elif variant == "elo":
    g = elo_ratings(data, w, include)
  else:
    raise ValueError(f"unknown PiCO variant {variant!r}; expected one of {VARIANTS}")
  return pearson_loss(w, g), g


def loss_fn(params: Params, u: jax.Array, data: BattleArrays, include: jax.Array,
            variant: str = "rank", ranks: jax.Array | None = None, k_rank: float = K_RANK
            ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """(loss, (w, G)) as a function of the trainable layer."""
  w = weights_of(params, u)
  loss, g = objective(w, data, include, variant, ranks, k_rank)
  return loss, (w, g)


def optimizer(learning_rate: float = LEARNING_RATE) -> optax.GradientTransformation:
  """Plain SGD with the official StepLR(10, 0.1) schedule."""
  return optax.sgd(optax.exponential_decay(learning_rate, transition_steps=DECAY_EVERY,
                                           decay_rate=DECAY, staircase=True))


def pico_fit(data: BattleArrays, key: jax.Array, reviewer_mask: jax.Array | None = None,
             battle_mask: jax.Array | None = None, *, num_models: int, variant: str = "rank",
             num_steps: int = NUM_STEPS, learning_rate: float = LEARNING_RATE,
             k_rank: float = K_RANK) -> Fit:
  """The 30-step consistency fit (pure; `fit` is its jitted form).

  `key` draws u and the layer's initialisation (one seed); `reviewer_mask` [n] drops the
  judgments of reviewers set to 0 (their models stay ranked and keep their weight in the
  Pearson term); `battle_mask` [B] drops battles (a subsampled fraction). vmap over any of
  the three.
  """
  include = included(data, reviewer_mask, battle_mask)
  params, u = init(key, num_models)
  tx = optimizer(learning_rate)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(carry, _):
    params, opt_state = carry
    (loss, (w, g)), grads = grad_fn(params, u, data, include, variant, None, k_rank)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), (loss, w, g)

  _, (losses, ws, gs) = jax.lax.scan(step, (params, tx.init(params)), None, length=num_steps)
  return Fit(weights=ws[-1], scores=gs[-1], order=jnp.argsort(-gs[-1], stable=True),
             loss=losses[-1], losses=losses)


fit = jax.jit(pico_fit,
              static_argnames=("num_models", "variant", "num_steps", "learning_rate", "k_rank"))
fit.__doc__ = pico_fit.__doc__


# ----------------------------------------------------------------------------------------------
# Unsupervised elimination (reconstructed).


class Elimination(NamedTuple):
  """Fits after eliminating k = 0..K reviewers; index k of every field is the fit with k gone."""
  weights: jax.Array        # [K+1, n]
  scores: jax.Array         # [K+1, n]
  order: jax.Array          # [K+1, n]
  loss: jax.Array           # [K+1] final consistency loss
  reviewer_mask: jax.Array  # [K+1, n] the reviewers whose judgments fit k used
  eliminated: jax.Array     # [K] the reviewer dropped after fit k (-1: none left to drop)
  chosen_k: jax.Array       # [] argmin of `loss`


def pico_eliminate(data: BattleArrays, key: jax.Array, battle_mask: jax.Array | None = None, *,
                   num_models: int, max_eliminated: int = MAX_ELIMINATED, variant: str = "rank",
                   num_steps: int = NUM_STEPS, learning_rate: float = LEARNING_RATE,
                   k_rank: float = K_RANK) -> Elimination:
  """Fit, drop every judgment of the lowest-weight reviewer still judging, refit, ... for
  k = 0..max_eliminated; choose k by the lowest final consistency loss (pure; `eliminate` is
  its jitted form).

  Reconstructed from the paper's description: every refit uses the same `key` (same u and
  initialisation), so fits differ only by the reviewers removed; an eliminated model stays
  ranked and in the Pearson term (its score comes from the remaining reviewers), as a model
  that never judges does in the official code. k = 0 is exactly `fit`.
  """
  fit_one = functools.partial(pico_fit, data, key, battle_mask=battle_mask,
                              num_models=num_models, variant=variant, num_steps=num_steps,
                              learning_rate=learning_rate, k_rank=k_rank)
  judged = jax.ops.segment_sum(included(data, None, battle_mask), data.reviewer,
                               num_segments=num_models)

  def step(mask, _):
    result = fit_one(mask)
    # Only a reviewer that still has judgments can be eliminated.
    candidate = (mask > 0) & (judged > 0)
    lowest = jnp.argmin(jnp.where(candidate, result.weights, jnp.inf))
    drop = jnp.where(jnp.any(candidate), lowest, -1)
    new_mask = jnp.where(jnp.arange(num_models) == drop, 0.0, mask)
    return new_mask, (result, mask, drop)

  _, (results, masks, drops) = jax.lax.scan(
      step, jnp.ones((num_models,), jnp.float32), None, length=max_eliminated + 1)
  return Elimination(weights=results.weights, scores=results.scores, order=results.order,
                     loss=results.loss, reviewer_mask=masks, eliminated=drops[:-1],
                     chosen_k=jnp.argmin(results.loss))


eliminate = jax.jit(pico_eliminate, static_argnames=(
    "num_models", "max_eliminated", "variant", "num_steps", "learning_rate", "k_rank"))
eliminate.__doc__ = pico_eliminate.__doc__


# ----------------------------------------------------------------------------------------------
# Fractions (host side: they decide which battles exist, not how they are scored).


def subsample_mask(battles: battles_lib.Battles, fraction: float, seed: int) -> np.ndarray:
  """[B] bool: a random `fraction` of each reviewer's battles, round(fraction * count) of them
  (as the official `df.sample(frac=fraction, random_state=seed)` per reviewer file)."""
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must be in (0, 1], got {fraction}")
  keep = np.zeros(battles.num_battles, bool)
  rng = np.random.default_rng(seed)
  for reviewer in range(battles.num_models):   # a loop over reviewers, not battles
    index = np.flatnonzero(battles.reviewer == reviewer)
    count = int(round(fraction * len(index)))   # pandas rounds frac * n the same way
    keep[rng.choice(index, size=count, replace=False)] = True
  return keep


def subsample(battles: battles_lib.Battles, fraction: float, seed: int) -> battles_lib.Battles:
  """The battles `subsample_mask` keeps, in their original (file) order."""
  return battles.take(np.flatnonzero(subsample_mask(battles, fraction, seed)))
