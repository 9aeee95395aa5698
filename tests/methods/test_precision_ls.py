"""precision_ls: tasks, the hand-set exact GD step, the recipe's pieces, evaluation."""
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jaxlab.core import config as config_lib
from jaxlab.data import least_squares
from jaxlab.methods.precision_ls import evaluation
from jaxlab.methods.precision_ls import handset
from jaxlab.methods.precision_ls import recipe
from jaxlab.methods.precision_ls import tasks
from jaxlab.methods.precision_ls import training

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "precision_ls.py"


def quick_config(**overrides):
  return config_lib.with_overrides(config_lib.load_config(CONFIG, "quick"), overrides)


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


def test_gradient_task_target_is_the_scaled_least_squares_gradient(x64):
  p = least_squares.sample_problems(jax.random.key(0), 4, 7, 3)
  task = tasks.make_task("gradient", d=3, n=7)
  inputs, target = task.make(p)
  assert inputs.shape == (4, 8, 4) and target.shape == (4, 3)
  objective = lambda x, a, b: 0.5 * jnp.sum((a @ x - b) ** 2) / a.shape[0]
  autodiff = jax.vmap(jax.grad(objective))(p["x_init"], p["A"], p["b"])
  np.testing.assert_allclose(target, autodiff, rtol=1e-12, atol=1e-12)
  np.testing.assert_array_equal(inputs[:, 0, :3], p["x_init"])
  np.testing.assert_array_equal(inputs[:, 1:, 3], p["b"])


def test_kstep_and_e2e_tasks(x64):
  p = least_squares.sample_problems(jax.random.key(1), 2, 6, 2)
  inputs, target = tasks.make_task("kstep", d=2, n=6, k_steps=3, step_size=0.5).make(p)
  x = p["x_init"]
  for _ in range(3):
    x = x - 0.5 * tasks.ls_gradient(p["A"], p["b"], x)
  np.testing.assert_allclose(target, x, rtol=1e-12)
  np.testing.assert_array_equal(inputs[:, -1, :2], p["x_init"])
  inputs, target = tasks.make_task("e2e", d=2, n=6).make(p)
  assert inputs.shape == (2, 6, 3)
  np.testing.assert_array_equal(target, p["x_star"])


def test_primitive_tasks():
  u = jax.random.normal(jax.random.key(0), (3, 6, 4))
  _, mult = tasks.make_task("multiply", length=6, width=4).make({"u": u})
  np.testing.assert_allclose(mult, u[..., :2] * u[..., 2:])
  _, square = tasks.make_task("square", length=6, width=4).make({"u": u})
  np.testing.assert_allclose(square, u**2)
  read = tasks.make_task("read", length=6, width=4, seed=3)
  _, out = read.make({"u": u})
  changed = np.where(np.any(np.asarray(out != u), axis=(0, 2)))[0]
  assert len(changed) <= 1
  assert tasks.make_task("linear", length=6, width=4).make({"u": u})[1].shape == (3, 6, 1)
  with pytest.raises(ValueError, match="unknown task"):
    tasks.make_task("sort")


def handset_model(d, n, width=64, depth=3, conv_impl="toeplitz"):
  c = quick_config(precision="float64", data=dict(d=d, n=n),
                   model=dict(mixer="baseconv", width=width, depth=depth, conv_impl=conv_impl))
  task = training.make_task(c)
  model = training.make_model(c, task)
  return model, handset.handset_gradient_params(model.init(jax.random.key(0)), d=d, n=n)


@pytest.mark.parametrize("d,n", [(5, 20), (3, 9)])
def test_handset_baseconv_computes_one_exact_gd_step(x64, d, n):
  model, params = handset_model(d, n)
  p = least_squares.sample_problems(jax.random.key(2), 64, n, d)
  estimate = evaluation.model_gradient(model.apply, params)(p["A"], p["b"], p["x_init"])
  exact = tasks.ls_gradient(p["A"], p["b"], p["x_init"])
  np.testing.assert_allclose(estimate, exact, rtol=0, atol=1e-12)
  # The full (not last_only) forward pass reads the same value at the last position.
  full = model.apply(params, tasks.gradient_tokens(p["A"], p["b"], p["x_init"]))[:, -1]
  np.testing.assert_allclose(full, exact, rtol=0, atol=1e-12)


def test_handset_iterates_track_gd(x64):
  model, params = handset_model(5, 20)
  p = least_squares.sample_problems(jax.random.key(3), 32, 20, 5)
  learned = evaluation.iterate(evaluation.model_gradient(model.apply, params), p, steps=300,
                               step_size=0.5)
  exact = evaluation.iterate(evaluation.exact_gradient, p, steps=300, step_size=0.5)
  assert exact[-1] < 1e-13 * exact[0]
  np.testing.assert_allclose(learned, exact, rtol=1e-6, atol=1e-24)


def test_handset_rejects_a_too_small_model(x64):
  c = quick_config(precision="float64", model=dict(width=16))
  model = training.make_model(c, training.make_task(c))
  with pytest.raises(ValueError, match="width >= 46"):
    handset.handset_gradient_params(model.init(jax.random.key(0)), d=5, n=20)


def test_ema_filter_follows_its_recurrence():
  transform = recipe.ema_gradient_filter(decay=0.5, strength=2.0)
  state = transform.init({"w": jnp.zeros(2)})
  grads = [jnp.array([1.0, 2.0]), jnp.array([3.0, -2.0])]
  out0, state = transform.update({"w": grads[0]}, state)
  np.testing.assert_allclose(out0["w"], grads[0] + 2.0 * grads[0])      # e_0 = g_0
  out1, _ = transform.update({"w": grads[1]}, state)
  ema = 0.5 * grads[0] + 0.5 * grads[1]
  np.testing.assert_allclose(out1["w"], grads[1] + 2.0 * ema)


def test_recipe_uses_adam_eps_1e16_and_skips_bad_steps(x64):
  c = quick_config(precision="float64")
  for arm in ("recipe", "no_ema", "no_adaptive", "neither"):   # the official ablation
    assert c.variants[arm].optim.eps == 1e-16
    assert c.variants[arm].optim.lr == c.variants.recipe.optim.lr
  assert c.variants.adam_default.optim.eps == 1e-8
  # The official code skips on the norm after clipping: only non-finite gradients are skipped.
  assert recipe.should_skip(jnp.array(jnp.nan), 100.0, 1e3)
  assert recipe.should_skip(jnp.array(jnp.inf), 100.0, 1e3)
  assert not recipe.should_skip(jnp.array(2e3), 100.0, 1e3)
  assert not recipe.should_skip(jnp.array(5.0), 100.0, 1e3)
  old, new = {"w": jnp.zeros(3)}, {"w": jnp.ones(3)}
  np.testing.assert_array_equal(recipe.keep_if(jnp.array(True), old, new)["w"], old["w"])


def schedule_config(**kw):
  base = dict(lr=1.0, schedule="adaptive", gamma=0.5, period=2, min_lr=1e-10, stats_every=1,
              stats_batches=4, stats_ema=0.0, threshold=0.9, direction="decay_when_noisy",
              warmup=0, eps=1e-16)
  base.update(kw)
  return ml_collections.ConfigDict(base)


@pytest.mark.parametrize("direction,similarity,expected_lr", [
    ("decay_when_noisy", 0.1, 0.5), ("decay_when_noisy", 0.99, 2.0),
    ("official_code", 0.1, 2.0), ("official_code", 0.99, 0.5)])
def test_adaptive_schedule_direction(direction, similarity, expected_lr):
  optim = schedule_config(direction=direction)
  state = recipe.init_schedule_state(optim, jnp.float32)
  for step in range(2):
    state = recipe.next_schedule_state(optim, state, jnp.array(step),
                                       jnp.array(similarity, jnp.float32))
  np.testing.assert_allclose(state["lr"], expected_lr)


def test_step_schedule_has_a_floor():
  optim = schedule_config(schedule="step", gamma=0.1, period=1, min_lr=1e-3)
  state = recipe.init_schedule_state(optim, jnp.float32)
  for step in range(5):
    state = recipe.next_schedule_state(optim, state, jnp.array(step), jnp.array(1.0))
  np.testing.assert_allclose(state["lr"], 1e-3)


def test_gradient_similarity():
  same = recipe.gradient_similarity(lambda key: {"g": jnp.array([1.0, 2.0])},
                                    jax.random.split(jax.random.key(0), 4))
  np.testing.assert_allclose(same, 1.0, rtol=1e-6)
  independent = recipe.gradient_similarity(lambda key: {"g": jax.random.normal(key, (4000,))},
                                           jax.random.split(jax.random.key(0), 8))
  assert abs(float(independent)) < 0.05


def test_gradient_similarity_of_a_zero_gradient_is_finite_in_float32():
  zero = recipe.gradient_similarity(lambda key: {"g": jnp.zeros(3, jnp.float32)},
                                    jax.random.split(jax.random.key(0), 3))
  assert jnp.isfinite(zero) and float(zero) == 0.0


def test_gd_iterates_converge(x64):
  p = least_squares.sample_problems(jax.random.key(4), 16, 20, 5)
  curve = evaluation.iterate(evaluation.exact_gradient, p, steps=50, step_size=0.5)
  assert curve.shape == (51,) and curve[-1] < curve[0] * 1e-2


def test_training_reduces_the_loss_on_the_multiply_primitive():
  c = config_lib.with_overrides(config_lib.load_config(CONFIG, "smoke"), dict(
      precision="float32", data=dict(task="multiply", length=4, width=4),
      model=dict(width=16, depth=1), optim=dict(lr=3e-3, schedule="constant",
                                                ema_strength=0.0)))
  experiment = training.make_experiment(c)
  state = experiment.init(jax.random.key(0))
  update = jax.jit(experiment.update)
  batch = {"example": jnp.arange(64)}   # fresh data: the same 64 problems every step
  first = None
  for i in range(60):
    state, metrics = update(state, batch, jax.random.key(i))
    first = metrics["loss"] if first is None else first
  assert metrics["loss"] < 0.5 * first
  assert isinstance(state["opt_state"], tuple) and optax.tree.norm(state["params"]) > 0


def test_seeds_are_independent_vmapped_replicas(x64):
  c = config_lib.load_config(CONFIG, "smoke")
  experiment = training.make_experiment(c)
  state = experiment.init(jax.random.key(0))
  leaves = jax.tree.leaves(state["params"])
  assert {x.shape[0] for x in leaves} == {c.train.num_seeds} and state["step"].shape == ()
  assert any(not np.allclose(x[0], x[1]) for x in leaves)   # seeds start apart
  state, metrics = jax.jit(experiment.update)(state, {"example": jnp.arange(16)},
                                              jax.random.key(1))
  assert metrics["loss_seed0"] != metrics["loss_seed1"]   # and see different problems
  # Replica 0 alone, trained as a one-seed run, takes the same step.
  single = training.make_experiment(config_lib.with_overrides(c, dict(train=dict(num_seeds=1))))
  alone, _ = jax.jit(single.update)(single.init(jax.random.key(0)),
                                    {"example": jnp.arange(16)}, jax.random.key(1))
  for a, b in zip(jax.tree.leaves(alone["params"]), jax.tree.leaves(state["params"])):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12, atol=1e-15)


def test_fresh_examples_are_a_function_of_the_index(x64):
  task = tasks.make_task("gradient", d=2, n=4)
  key = jax.random.key(3)
  both = training.fresh_examples(task, key, jnp.array([7, 9]), jnp.float64)
  alone = training.fresh_examples(task, key, jnp.array([9]), jnp.float64)
  np.testing.assert_array_equal(both["A"][1], alone["A"][0])
  assert both["A"].shape == (2, 4, 2) and not np.allclose(both["A"][0], both["A"][1])


def test_the_statistics_batch_does_not_follow_the_training_batch():
  c = config_lib.load_config(CONFIG, "quick")
  assert c.optim.stats_batch_size == 1024 and c.train.batch_size < 1024
  assert c.train.num_seeds >= 3


def test_a_microbatched_update_equals_the_whole_batch_update(x64):
  def one_update(microbatch):
    c = config_lib.with_overrides(config_lib.load_config(CONFIG, "smoke"),
                                  dict(train=dict(batch_size=16, microbatch=microbatch)))
    experiment = training.make_experiment(c)
    batch = {"example": jnp.arange(16)}
    state, metrics = jax.jit(experiment.update)(experiment.init(jax.random.key(0)), batch,
                                                jax.random.key(2))
    return state["params"], metrics["loss"]

  (whole, whole_loss), (split, split_loss) = one_update(0), one_update(4)
  np.testing.assert_allclose(split_loss, whole_loss, rtol=1e-13)
  for a, b in zip(jax.tree.leaves(split), jax.tree.leaves(whole)):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


def test_a_microbatch_that_does_not_divide_the_batch_is_refused_by_name():
  c = config_lib.with_overrides(config_lib.load_config(CONFIG, "smoke"),
                                dict(train=dict(batch_size=16, microbatch=5)))
  with pytest.raises(config_lib.ConfigError, match="train.microbatch"):
    training.make_experiment(c)


def test_summarize_decides_claims_over_seeds_on_log_mse():
  from jaxlab.methods.precision_ls import reproduction  # pylint: disable=g-import-not-at-top
  reference = {"handset_iterated_mse": 2e-14, "handset_grad_mse": 1e-31,
               "gd_iterated_mse": 2e-14}
  seeds = lambda *values: {"grad_mse": list(values), "iterated_mse": list(values)}
  per_variant = {
      "recipe": seeds(1e-9, 2e-9, 5e-10),
      "no_ema": seeds(1e-8, 3e-8, 5e-9),            # consistently 10x worse: recipe wins
      "no_adaptive": seeds(1e-9, 2e-7, 1e-11),      # worse on average, not consistently
      "linear_attention": {"grad_mse": [1e-4, 2e-4, 1e-4], "iterated_mse": [None, 1e-3, None]},
      "softmax": seeds(1e-3, 2e-3, 1e-3),
      "multiply_baseconv": {"test_mse": [1e-5, 1e-5, 2e-5]},
      "multiply_softmax": {"test_mse": [1e-4, 1e-4, 1e-4]},
  }
  metrics, claims, headline = reproduction.summarize(per_variant, reference,
                                                     {"recipe": [100, 200, None]})
  holds = {c["name"]: c["holds"] for c in claims}
  assert holds == {"handset_matches_gd": True, "baseconv_beats_softmax_gradient": True,
                   "linear_attention_beats_softmax_gradient": False,
                   "polynomial_beats_softmax_multiply": False, "recipe_beats_no_ema": True,
                   "recipe_beats_no_adaptive": False}
  by_name = {c["name"]: c for c in claims}
  assert by_name["recipe_beats_no_ema"]["paired"]["n"] == 3
  assert metrics["multiply_mse"] == {"baseconv": 1e-5, "softmax": 1e-4}
  assert metrics["grad_mse_seeds"]["recipe"] == [1e-9, 2e-9, 5e-10]
  assert metrics["iterated_mse"]["linear_attention"] is None   # most seeds diverge
  assert metrics["iterated_diverged"] == {"linear_attention": "2 of 3 seeds"}
  assert metrics["steps_to_leave_plateau"] == {"recipe": [100, 200, None]}
  assert headline["ours"] == 1e-9


def test_steps_to_leave_plateau():
  from jaxlab.methods.precision_ls import reproduction  # pylint: disable=g-import-not-at-top
  steps = np.array([100, 200, 300])
  assert reproduction.steps_to_leave_plateau(steps, np.array([0.3, 0.05, 0.01]), 0.3) == 300
  assert reproduction.steps_to_leave_plateau(steps, np.array([0.3, 0.2, 0.1]), 0.3) is None


def test_a_warm_started_variant_runs_after_its_source():
  from jaxlab.methods.precision_ls import reproduction  # pylint: disable=g-import-not-at-top
  c = config_lib.load_config(CONFIG, "paper")
  c.run_variants = "continue_plain,softmax"
  assert reproduction.selected_variants(c) == ["recipe", "continue_plain", "softmax"]
  c.variants.continue_plain.train.init_from = "nonexistent"
  with pytest.raises(config_lib.ConfigError, match="continue_plain.train.init_from"):
    reproduction.selected_variants(c)


def test_the_cpu_warm_start_is_the_handset_model_perturbed_per_seed(x64):
  from jaxlab.methods.precision_ls import reproduction  # pylint: disable=g-import-not-at-top
  c = config_lib.load_config(CONFIG, "smoke")
  assert quick_config().variants.continue_recipe.train.init_from == reproduction.HANDSET_SOURCE
  variant = reproduction.variant_config(c, "continue_recipe")
  assert reproduction.selected_variants(c)[0] == "continue_recipe"   # needs no other variant
  exact = reproduction.initial_params(
      config_lib.with_overrides(variant, dict(train=dict(init_noise=0.0))), "handset", {})
  assert reproduction.evaluate_variant(variant, exact)["grad_mse"] == pytest.approx(
      [0.0, 0.0], abs=1e-25)
  noisy = reproduction.initial_params(variant, "handset", {})
  errors = reproduction.evaluate_variant(variant, noisy)["grad_mse"]
  assert all(1e-14 < e < 1e-4 for e in errors) and errors[0] != errors[1]   # seeds differ
  too_narrow = config_lib.with_overrides(variant, dict(model=dict(width=8)))
  with pytest.raises(config_lib.ConfigError, match="needs width"):
    reproduction.initial_params(too_narrow, "handset", {})


def test_summarize_records_where_warm_starts_began():
  from jaxlab.methods.precision_ls import reproduction  # pylint: disable=g-import-not-at-top
  reference = {"handset_iterated_mse": 2e-14, "handset_grad_mse": 1e-31,
               "gd_iterated_mse": 2e-14}
  seeds = lambda *values: {"grad_mse": list(values), "iterated_mse": list(values)}
  per_variant = {"continue_recipe": seeds(1e-12, 3e-12, 2e-12),
                 "continue_plain": seeds(1e-9, 2e-9, 4e-9)}
  metrics, claims, _ = reproduction.summarize(
      per_variant, reference, {}, {name: [5e-7, 6e-7, 5.5e-7] for name in per_variant})
  assert metrics["start_grad_mse"] == {"continue_recipe": 5.5e-7, "continue_plain": 5.5e-7}
  by_name = {c["name"]: c for c in claims}
  assert by_name["recipe_beats_plain_from_warm_start"]["holds"]
