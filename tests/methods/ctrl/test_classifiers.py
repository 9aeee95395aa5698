"""The reward classifier (with temperature scaling) and the noisy classifier on a 2-D task."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.data import toy2d
from jaxlab.diffusion import schedules
from jaxlab.methods.ctrl import classifiers


def labelled_ring(num, seed):
  x = toy2d.gaussian_ring(num, seed=seed)
  rng = np.random.default_rng(seed)
  y = (rng.uniform(size=num) < 1 / (1 + np.exp(-4 * x[:, 0]))).astype(np.int32)
  return x, y


def test_reward_classifier_learns_the_labelling_and_reports_calibration():
  x, y = labelled_ring(1000, 0)
  classifier, report = classifiers.fit(x, y, 2, hidden=(32, 32), steps=300,
                                       key=jax.random.key(0), validation_fraction=0.2)
  assert set(report) == {"acc", "ece_raw", "ece_scaled", "temperature"}
  assert report["acc"] > 0.8 and report["temperature"] > 0
  x_test, y_test = labelled_ring(2000, 1)
  log_p = classifier.log_prob(jnp.asarray(x_test), jnp.asarray(y_test))
  assert log_p.shape == (2000,) and float(jnp.max(log_p)) <= 0.0
  predicted = np.asarray(classifier.probabilities(jnp.asarray(x_test))).argmax(-1)
  assert np.mean(predicted == y_test) > 0.8


def test_noisy_classifier_is_sharp_at_low_noise_and_flat_at_high_noise():
  x, y = labelled_ring(1000, 0)
  schedule = schedules.cosine_schedule(50)
  log_prob = classifiers.fit_noisy(x, y, 2, schedule, hidden=(32, 32), steps=400,
                                   key=jax.random.key(1))
  x0, labels = jnp.asarray(x[:400]), jnp.asarray(y[:400])
  low = jnp.mean(log_prob(x0, jnp.zeros(400, jnp.int32), labels))
  noise = jax.random.normal(jax.random.key(2), x0.shape)
  t_high = jnp.full(400, 49, jnp.int32)
  high = jnp.mean(log_prob(schedules.q_sample(schedule, x0, t_high, noise), t_high, labels))
  assert float(low) > float(high) and float(high) > np.log(0.5) - 0.1
