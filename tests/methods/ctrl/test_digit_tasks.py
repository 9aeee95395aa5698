"""ctrl.digit_tasks: the digits problems score real images as the oracle and the ink rule do, and
the joint reward is the digit and ink classifiers' sum (no prior or CTRL training needed)."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.core import config as config_lib
from jaxlab.methods.ctrl import digit_tasks
from jaxlab.methods.ctrl import tasks

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def setup():
  config = config_lib.load_config(ROOT / "configs" / "ctrl.py", "smoke")
  config = config_lib.override(config, {"digits.oracle.hidden": (64,),
                                        "digits.oracle.steps": 300, "reward.steps": 50})
  return config, digit_tasks.load_data(config)


def real_samples(data, labels_of, num_labels, per_label=6):
  return {y: data.train_x[labels_of == y][:per_label] for y in range(num_labels)}


def test_class_problem_scores_real_digits_as_accurate(setup):
  config, data = setup
  assert data.oracle_test_accuracy > 0.85
  problem, extra = digit_tasks.class_problem(config, data, data.train_x, 50)
  assert problem.num_labels == 10 and len(problem.labelled_x) == 50
  assert sum(extra["truth_accepted"].values()) > 0
  right = problem.score(real_samples(data, data.train_y, 10))
  shuffled = problem.score(real_samples(data, (data.train_y + 1) % 10, 10))
  assert right["accuracy"] > 0.8 > 0.2 > shuffled["accuracy"]
  assert right["fd_real"] < shuffled["fd_real"]
  assert 0 <= right["accuracy_binomial_se"] < 0.1


def test_ink_problem_reward_sums_digit_and_ink_and_scores_exact_ink(setup):
  config, data = setup
  problem, extra = digit_tasks.ink_problem(config, data, data.train_x)
  assert problem.num_labels == 20 and len(problem.labelled_x) == config.digits.ink.num_both
  assert set(extra["reward_classifier"]) == {"digit", "ink"}
  joint = tasks.joint_label(data.train_y, data.ink.labels(data.train_x))
  scores = problem.score(real_samples(data, joint, 20, per_label=4))
  assert scores["acc_ink"] == 1.0 and scores["acc_joint"] > 0.8
  x = jnp.asarray(data.train_x[:8])
  # log p(2d + i | x) summed over i is log p_digit(d | x) + log(sum_i p_ink(i | x)) = log p_digit.
  per_label = jnp.stack([problem.reward(x, jnp.full((8,), y)) for y in range(20)], -1)
  digit_log_prob = jax.nn.logsumexp(per_label.reshape(8, 10, 2), -1)
  np.testing.assert_allclose(jnp.sum(jnp.exp(digit_log_prob), -1), 1.0, rtol=1e-5)
