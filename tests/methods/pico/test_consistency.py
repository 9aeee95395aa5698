"""pico.consistency, baselines and ranking: scores by hand, gradients, one compilation, vmap,
fractions, elimination, the baselines on obvious cases and rank()'s input checks."""
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.pico import baselines
from jaxlab.methods.pico import battles as battles_lib
from jaxlab.methods.pico import consistency
from jaxlab.methods.pico import ranking

NUM_MODELS = 6


def make_battles(seed=0, num_battles=240, num_models=NUM_MODELS, models=None):
  """Random battles where a lower index tends to win (model 0 the strongest)."""
  rng = np.random.default_rng(seed)
  a = rng.integers(0, num_models, num_battles)
  b = (a + rng.integers(1, num_models, num_battles)) % num_models
  p_a = 1.0 / (1.0 + np.exp(0.6 * (a - b)))
  u = rng.random(num_battles)
  score = np.where(u < 0.8 * p_a, 1.0, np.where(u < 0.8, 0.0, 0.5))
  names = models or tuple(f"m{i}" for i in range(num_models))
  return battles_lib.Battles(names, a.astype(np.int32), b.astype(np.int32),
                             rng.integers(0, num_models, num_battles).astype(np.int32),
                             score.astype(np.float32),
                             rng.integers(0, 20, num_battles).astype(np.int32))


@pytest.fixture(scope="module")
def small():
  return make_battles()


def hand_battles():
  # (a, b, reviewer, score_a): 0 beats 1 (judge 2); 1 ties 2 (judge 0); 0 beats 2 (judge 1,
  # written as 2 losing to 0); 2 beats 1 (judge 0), an upset under w's ranks.
  rows = np.array([(0, 1, 2, 1.0), (1, 2, 0, 0.5), (2, 0, 1, 0.0), (2, 1, 0, 1.0)])
  return battles_lib.Battles(("x", "y", "z"), rows[:, 0].astype(np.int32),
                             rows[:, 1].astype(np.int32), rows[:, 2].astype(np.int32),
                             rows[:, 3].astype(np.float32), np.zeros(4, np.int32))


def test_scores_on_a_three_model_case_by_hand():
  data = consistency.arrays(hand_battles())
  w = jnp.array([0.9, 0.5, 0.2])          # ranks 0, 1, 2
  plain = np.asarray(consistency.scores(data, w))
  np.testing.assert_allclose(plain, [(0.2 + 0.5) / 2, (0.45 + 0.0 + 0.0) / 3,
                                     (0.45 + 0.0 + 0.9) / 3], rtol=1e-6)
  ranked = np.asarray(consistency.scores(data, w, ranks=consistency.ranks_of(w)))
  # Winner: 1 + (rank(winner) - rank(loser)) / 200; ties stay 1/2, losers 0.
  np.testing.assert_allclose(ranked, [((1 - 1 / 200) * 0.2 + (1 - 2 / 200) * 0.5) / 2,
                                      (0.45 + 0.0 + 0.0) / 3,
                                      (0.45 + 0.0 + (1 + 1 / 200) * 0.9) / 3], rtol=1e-6)
  # Without reviewer 0's judgments, battles 2 and 4 are gone from the sums and the counts.
  keep = consistency.included(data, reviewer_mask=jnp.array([0.0, 1.0, 1.0]))
  np.testing.assert_allclose(np.asarray(consistency.scores(data, w, keep)),
                             [(0.2 + 0.5) / 2, 0.0, 0.0], rtol=1e-6)
  # Elo: each rating starts at 1000; an even battle moves the pair by K w_r / 2.
  elo = np.asarray(consistency.elo_ratings(data, w, jnp.array([1.0, 0.0, 0.0, 0.0])))
  np.testing.assert_allclose(elo, [1000 + 4 * 0.2 / 2, 1000 - 4 * 0.2 / 2, 1000], rtol=1e-7)


@pytest.mark.parametrize("variant", ["rank", "elo"])
def test_gradient_with_frozen_ranks_matches_finite_differences(small, variant):
  with jax.enable_x64(True):
    data = consistency.BattleArrays(*(jnp.asarray(x) for x in (
        small.model_a, small.model_b, small.reviewer, small.score_a.astype(np.float64))))
    include = jnp.ones(small.num_battles, jnp.float64)
    params, u = consistency.init(jax.random.key(3), NUM_MODELS)
    params = jax.tree.map(lambda x: x.astype(jnp.float64), params)
    u = u.astype(jnp.float64)
    ranks = consistency.ranks_of(consistency.weights_of(params, u))

    @jax.jit
    def loss(p):
      return consistency.loss_fn(p, u, data, include, variant, ranks)[0]

    grads = jax.jit(jax.grad(loss))(params)
    # The rank-freezing inside loss_fn (ranks=None) gives the same gradient.
    free = jax.jit(jax.grad(lambda p: consistency.loss_fn(p, u, data, include, variant)[0]))(
        params)
    chex.assert_trees_all_close(grads, free, rtol=1e-10)
    rng = np.random.default_rng(0)
    for _ in range(3):
      direction = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape)), params)
      eps = 1e-5
      step = lambda sign: jax.tree.map(lambda p, d: p + sign * eps * d, params, direction)
      numeric = (loss(step(1)) - loss(step(-1))) / (2 * eps)
      analytic = sum(jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grads),
                                                      jax.tree.leaves(direction)))
      np.testing.assert_allclose(float(analytic), float(numeric), rtol=1e-5, atol=1e-9)


def test_fit_compiles_once_for_one_battle_size(small):
  chex.clear_trace_counter()
  counted = jax.jit(chex.assert_max_traces(consistency.pico_fit, n=1),
                    static_argnames=("num_models", "variant", "num_steps"))
  data = consistency.arrays(small)
  other = consistency.arrays(make_battles(seed=1))   # same size, other battles
  first = counted(data, jax.random.key(0), jnp.ones(NUM_MODELS), jnp.ones(small.num_battles),
                  num_models=NUM_MODELS)
  second = counted(other, jax.random.key(1), jnp.ones(NUM_MODELS).at[2].set(0.0),
                   jnp.asarray(consistency.subsample_mask(small, 0.5, 0), jnp.float32),
                   num_models=NUM_MODELS)
  assert not np.allclose(first.scores, second.scores)
  before = consistency.fit._cache_size()
  consistency.fit(data, jax.random.key(0), num_models=NUM_MODELS)
  consistency.fit(other, jax.random.key(5), num_models=NUM_MODELS)
  assert consistency.fit._cache_size() - before <= 1


def test_fit_lowers_the_loss_and_orders_by_the_last_scores(small):
  result = consistency.fit(consistency.arrays(small), jax.random.key(0), num_models=NUM_MODELS)
  losses = np.asarray(result.losses)
  assert losses.shape == (consistency.NUM_STEPS,) and losses[-1] < losses[0]
  np.testing.assert_array_equal(result.order, np.argsort(-np.asarray(result.scores)))
  assert float(result.loss) == losses[-1]


def test_vmapped_seeds_and_masks_equal_one_by_one_fits(small):
  data = consistency.arrays(small)
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  masks = jnp.ones((3, NUM_MODELS)).at[1, 0].set(0.0).at[2, 4].set(0.0)
  run = lambda key, mask: consistency.fit(data, key, mask, num_models=NUM_MODELS)
  batched = jax.vmap(run)(keys, masks)
  for i in range(3):
    single = run(keys[i], masks[i])
    np.testing.assert_allclose(batched.weights[i], single.weights, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(batched.scores[i], single.scores, rtol=1e-5, atol=1e-7)
  # Different seeds draw different u and initialisations.
  assert not np.allclose(batched.weights[0], run(keys[1], masks[0]).weights)


def test_subsample_keeps_the_fraction_of_each_reviewer(small):
  counts = np.bincount(small.reviewer, minlength=NUM_MODELS)
  for fraction in (0.7, 0.4):
    keep = consistency.subsample_mask(small, fraction, seed=2)
    kept = np.bincount(small.reviewer[keep], minlength=NUM_MODELS)
    np.testing.assert_array_equal(kept, [round(fraction * c) for c in counts])
    np.testing.assert_array_equal(keep, consistency.subsample_mask(small, fraction, seed=2))
    sub = consistency.subsample(small, fraction, seed=2)
    np.testing.assert_array_equal(sub.score_a, small.score_a[keep])   # file order kept
  assert consistency.subsample_mask(small, 1.0, seed=0).all()
  with pytest.raises(ValueError, match="fraction"):
    consistency.subsample_mask(small, 0.0, seed=0)


def test_elimination_starts_at_the_plain_fit_and_drops_the_lowest_weight(small):
  data = consistency.arrays(small)
  key = jax.random.key(7)
  result = consistency.eliminate(data, key, num_models=NUM_MODELS, max_eliminated=3)
  plain = consistency.fit(data, key, num_models=NUM_MODELS)
  np.testing.assert_allclose(result.weights[0], plain.weights, rtol=1e-6)
  np.testing.assert_allclose(result.scores[0], plain.scores, rtol=1e-6)
  first = int(result.eliminated[0])
  assert first == int(np.argmin(plain.weights))
  assert result.reviewer_mask[1, first] == 0 and result.reviewer_mask[1].sum() == NUM_MODELS - 1
  refit = consistency.fit(data, key, result.reviewer_mask[1], num_models=NUM_MODELS)
  np.testing.assert_allclose(result.scores[1], refit.scores, rtol=1e-6)
  assert len(set(np.asarray(result.eliminated).tolist())) == 3
  assert int(result.chosen_k) == int(np.argmin(result.loss))


def test_baselines_find_the_obvious_best_model():
  # Model 0 wins every battle it is in; the others tie among themselves.
  rows = [(q, a, b, r) for q in range(3) for a, b in ((0, 1), (2, 0), (1, 2), (3, 0), (2, 3))
          for r in (1, 2, 3)]
  rows = np.array(rows)
  score = np.where(rows[:, 1] == 0, 1.0, np.where(rows[:, 2] == 0, 0.0, 0.5))
  battles = battles_lib.Battles(("a", "b", "c", "d"), rows[:, 1].astype(np.int32),
                                rows[:, 2].astype(np.int32), rows[:, 3].astype(np.int32),
                                score.astype(np.float32), rows[:, 0].astype(np.int32))
  for result in (baselines.majority(battles), baselines.pagerank(battles),
                 baselines.prd(battles)):
    assert result.order[0] == 0
  np.testing.assert_allclose(baselines.majority(battles).scores, [1.0, 0.25, 1 / 3, 0.25])


def test_majority_counts_a_battle_once_by_its_reviewers_majority():
  # Question 0, pair (0, 1), three reviewers: two prefer 1 (one as model_b, one with the pair
  # written the other way round), one prefers 0: model 1 wins the battle once.
  battles = battles_lib.Battles(("a", "b", "c"), np.array([0, 1, 0], np.int32),
                                np.array([1, 0, 1], np.int32), np.array([2, 2, 1], np.int32),
                                np.array([0.0, 1.0, 1.0], np.float32), np.zeros(3, np.int32))
  np.testing.assert_allclose(baselines.majority(battles).scores, [0.0, 1.0, 0.0])


def test_schedules_and_the_error_penalty():
  order = [2, 0, 1]   # model 2 is the best
  np.testing.assert_allclose(baselines.schedule_weights("order", 3, order), [2 / 3, 1 / 3, 1])
  np.testing.assert_allclose(baselines.schedule_weights("reversed", 3, order), [0.5, 1.0, 0])
  battles = hand_battles()
  errors = np.array([False, True, False, False])   # reviewer 0 erred in 1 of its 2 judgments
  plain = baselines.schedule(battles, "uniform").scores
  penalised = baselines.schedule(battles, "uniform", errors=errors).scores
  np.testing.assert_allclose(penalised, plain - np.array([0.05 * 1 * 0.5, 0.0, 0.0]), rtol=1e-6)
  with pytest.raises(ValueError, match="true_order"):
    baselines.schedule_weights("order", 3)


def records(models, seed=0, num=120):
  rng = np.random.default_rng(seed)
  out = []
  for n in range(num):
    a, b = rng.choice(len(models), 2, replace=False)
    first, second = rng.choice(["model_1", "model_2", "tie"], 2, p=[0.5, 0.3, 0.2])
    out.append({"question_id": 81000 + n, "model_1": models[a], "model_2": models[b],
                "g1_winner": str(first), "g2_winner": str(second),
                "judge": [models[rng.integers(len(models))], "pair-v2"], "turn": 1})
  return out


def test_rank_inputs_and_their_validation(tmp_path):
  names = ["beta", "alpha", "gamma", "delta"]
  data = records(names)
  path = tmp_path / "judgments.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in data))
  # Without true_order the models are the sorted names.
  battles, _ = ranking.as_battles(data)
  assert battles.models == ("alpha", "beta", "delta", "gamma")
  for method in ranking.METHODS:
    order, scores, weights = ranking.rank(path, method, true_order=names)
    assert sorted(order.tolist()) == [0, 1, 2, 3] and scores.shape == weights.shape == (4,)
    if method in ("uniform", "majority", "pagerank"):
      assert np.all(weights == 1.0)
  np.testing.assert_array_equal(ranking.rank(data, "uniform")[1],
                                ranking.rank(path, "uniform")[1])
  sub = ranking.rank(data, "prd", seed=1, fraction=0.5)
  assert sub[0].shape == (4,)

  with pytest.raises(ValueError, match="'borda'"):
    ranking.rank(data, "borda")
  for method in ("order", "reversed"):
    with pytest.raises(ValueError, match="true_order"):
      ranking.rank(data, method)
  with pytest.raises(ValueError, match="damping"):
    ranking.rank(data, "majority", damping=0.5)
  with pytest.raises(ValueError, match="'maybe'"):
    ranking.rank([dict(data[0], g2_winner="maybe")] + data[1:], "uniform")
  with pytest.raises(ValueError, match="'omega'"):
    ranking.rank([dict(data[0], judge=["omega", "pair-v2"])] + data[1:], "uniform")
  with pytest.raises(ValueError, match="no battles"):
    ranking.rank(data, "uniform", true_order=names + ["epsilon"])
  with pytest.raises(ValueError, match="fraction"):
    ranking.rank(data, "uniform", fraction=1.5)
