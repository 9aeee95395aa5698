"""ctrl.tasks: exact toy reward, offline sets, ink labels, rejection sampling."""
import numpy as np
import pytest

from jaxlab.methods.ctrl import tasks


def test_toy2d_log_prob_is_a_normalised_bernoulli():
  x = np.random.default_rng(0).normal(size=(100, 2))
  total = np.exp(tasks.toy2d_log_prob(x, np.zeros(100))) + np.exp(tasks.toy2d_log_prob(x, np.ones(100)))
  np.testing.assert_allclose(total, 1.0, rtol=1e-12)
  np.testing.assert_allclose(np.exp(tasks.toy2d_log_prob(np.array([[0.5, 0.0]]), np.array([1]))),
                             1 / (1 + np.exp(-2.0)))


def test_toy2d_offline_labels_follow_the_law():
  x, y = tasks.toy2d_offline(4000, seed=1, ring_options={})
  p_one = np.exp(tasks.toy2d_log_prob(x, np.ones(len(x))))
  assert abs(y.mean() - p_one.mean()) < 3 * np.sqrt(0.25 / len(x))
  assert y[x[:, 0] > 1.5].mean() > 0.95 and y[x[:, 0] < -1.5].mean() < 0.05


def test_ink_offline_shares_exactly_num_both_images():
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, size=(300, 4, 4, 1)).astype(np.float32)
  labels = rng.integers(0, 10, 300)
  rule = tasks.ink_rule(images)
  assert 0.45 < rule.labels(images).mean() < 0.55
  data = tasks.ink_offline(images, labels, rule, num_digit=40, num_ink=30, num_both=10, seed=3)
  assert len(data.digit_x) == 40 and len(data.ink_x) == 30 and len(data.joint_x) == 10
  key = lambda a: {row.tobytes() for row in a}
  assert key(data.digit_x) & key(data.ink_x) == key(data.joint_x)
  digit, ink_label = tasks.split_joint_label(data.joint_y)
  np.testing.assert_array_equal(ink_label, rule.labels(data.joint_x))
  with pytest.raises(ValueError, match="num_both"):
    tasks.ink_offline(images, labels, rule, num_digit=5, num_ink=30, num_both=10, seed=3)


def test_rejection_sampling_accepts_with_p_label():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(20000, 2))
  kept = tasks.rejection_sample(x, tasks.toy2d_log_prob, 1, rng=rng)
  expected = np.exp(tasks.toy2d_log_prob(x, np.ones(len(x)))).sum()
  assert abs(len(kept) - expected) < 4 * np.sqrt(expected)
  assert kept[:, 0].mean() > 0.5


def test_unknown_task_and_oversized_offline_set_fail():
  with pytest.raises(ValueError, match="unknown ctrl task"):
    tasks.num_labels("mnist")
  with pytest.raises(ValueError, match="1 <= N <= 10"):
    tasks.subset(11, 10, seed=0)
