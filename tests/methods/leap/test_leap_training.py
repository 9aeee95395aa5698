"""leap.training and the experiment's config checks: relabelled inputs are the student's own
history, the losses, one compile of the training step across iterations, bad configs."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.core import parallel
from jaxlab.methods.leap import env as env_lib
from jaxlab.methods.leap import student as student_lib
from jaxlab.methods.leap import teachers
from jaxlab.methods.leap import training
from experiments import leap as leap_experiment

ENV = env_lib.EnvSpec(num_receptacles=4, horizon=5)
MODEL = student_lib.ModelSpec(width=16, depth=1, num_heads=2, mlp_dim=32)


def replicas(count, seed=0):
  agent = student_lib.Student(MODEL, ENV)
  return jax.vmap(agent.init)(jax.random.split(jax.random.key(seed), count))


def test_relabelled_inputs_are_the_students_own_history():
  tasks = env_lib.sample_tasks(ENV, jax.random.key(0), 64)
  params = replicas(2)
  choices = training.TeacherChoice(is_share=np.asarray([False, True]),
                                   percent=np.asarray([0.0, 100.0], np.float32))
  played, chosen, keep = training.play_and_relabel(MODEL, ENV, params, choices, tasks,
                                                   jax.random.split(jax.random.key(1), 2))
  agent = student_lib.Student(MODEL, ENV)
  for r in range(2):
    replica = jax.tree.map(lambda a: a[r], params)
    # The stored buffer is exactly what the student produced, step by step.
    logits = agent.action_logits(replica, played.final.tokens[r])
    greedy = np.asarray(jnp.argmax(logits, -1))
    acted = np.asarray(played.actions[r]) >= 0
    np.testing.assert_array_equal(greedy[acted], np.asarray(played.actions[r])[acted])
    np.testing.assert_array_equal(np.asarray(keep[r]), ~np.asarray(played.success[r]))
    for t in range(ENV.horizon):
      state = jax.tree.map(lambda a: a[r, :, t], played.states)
      cut = env_lib.prediction_positions(ENV)[t] + 1
      np.testing.assert_array_equal(state.tokens[:, :cut], played.final.tokens[r][:, :cut])
      assert np.all(np.asarray(state.tokens[:, cut:]) == env_lib.PAD)
      # The label is the teacher's action in that state: leap for replica 0, expert for 1.
      teacher = teachers.leap if r == 0 else teachers.expert
      expected = jax.vmap(lambda s: teacher(ENV, s))(state)
      np.testing.assert_array_equal(np.asarray(chosen[r][:, t])[acted[:, t]],
                                    np.asarray(expected)[acted[:, t]])


def test_sft_and_dpo_losses():
  logits = jnp.log(jnp.asarray([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]]]))
  chosen = jnp.asarray([[0, -1]])
  np.testing.assert_allclose(training.sft_loss(logits, chosen), -np.log(0.7), rtol=1e-6)
  # At the reference, the DPO loss is log 2 on every pair; equal actions are not pairs.
  logp = jax.nn.log_softmax(logits)
  chosen, rejected = jnp.asarray([[0, 1]]), jnp.asarray([[2, 1]])
  ref_c = jnp.take_along_axis(logp, chosen[..., None], -1)[..., 0]
  ref_r = jnp.take_along_axis(logp, rejected[..., None], -1)[..., 0]
  np.testing.assert_array_equal(training.dpo_pairs(chosen, rejected), [[True, False]])
  loss = training.dpo_loss(logits, chosen, rejected, ref_c, ref_r, 0.1)
  np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-6)
  # Its gradient raises the chosen action's logit and lowers the rejected one's.
  grad = jax.grad(training.dpo_loss)(logits, chosen, rejected, ref_c, ref_r, 0.1)
  assert grad[0, 0, 0] < 0 < grad[0, 0, 2]


def test_the_training_step_compiles_once_across_iterations(monkeypatch, tmp_path):
  # The vmapped chunk of every iteration (SFT and DPO replicas, new data, new starting point)
  # reuses one compiled step: the loss is traced once.
  chex.clear_trace_counter()
  monkeypatch.setattr(training, "sft_loss", chex.assert_max_traces(training.sft_loss, n=1))
  training._phase_functions.cache_clear()
  spec = training.TrainSpec(steps=4, batch_size=4, chunk_steps=2, ckpt_every=4)
  tasks = env_lib.sample_tasks(ENV, jax.random.key(0), 16)
  demos = training.demonstrations(jax.tree.map(
      lambda a: a[0], training.play_references(ENV, tasks, jax.random.key(1))))
  mesh = parallel.make_mesh({"data": -1})
  params = replicas(2)
  for iteration in range(3):
    data = training.take_episodes(demos, np.arange(demos.size) < 8 + iteration)
    phase = training.stack_phase([demos, data], 64, learning_rates=[1e-3, 1e-3],
                                 is_dpo=[False, True], betas=[0.1, 0.1])
    phase = training.with_references(phase, MODEL, ENV, params)
    fit = training.fit_phase(MODEL, ENV, spec, params, phase,
                             jax.random.split(jax.random.key(iteration), 2), mesh=mesh,
                             workdir=tmp_path / f"iter{iteration}", progress=False)
    assert np.isfinite(fit.history[-1]["train/loss"])
    params = fit.params
  training._phase_functions.cache_clear()


def test_empty_datasets_train_on_nothing_and_capacity_is_checked():
  empty = training.Dataset(tokens=np.zeros((0, ENV.length), np.int32),
                           chosen=np.zeros((0, ENV.horizon), np.int32),
                           rejected=np.zeros((0, ENV.horizon), np.int32))
  phase = training.stack_phase([empty], 4, learning_rates=[1e-3], is_dpo=[False], betas=[0.1])
  assert phase.count.tolist() == [1] and np.all(phase.data.chosen == training.NO_LABEL)
  with pytest.raises(ValueError, match="capacity"):
    training.pad_to(training.pad_to(empty, 5), 4)


@pytest.mark.parametrize("override, key", [
    ({"students": "leap,share_120"}, "students"),
    ({"students": "leap,oracle"}, "students"),
    ({"env": {"horizon": 3}}, "env.horizon"),
    ({"num_seeds": 1}, "num_seeds"),
    ({"data": {"test_seed": 1}}, "data.test_seed"),
])
def test_bad_configs_fail_before_compiling_naming_the_key(override, key):
  config = config_lib.load_config(config_lib.__file__.replace("jaxlab/core/config.py",
                                                              "configs/leap.py"), "smoke")
  config = config_lib.with_overrides(config, override)
  with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
    leap_experiment.settings(config)
