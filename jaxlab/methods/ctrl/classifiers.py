"""The classifiers CTRL and its baselines use, trained by one jitted `lax.scan` each.

* The reward classifier p_hat(y | x): an MLP fitted by cross-entropy on the offline labelled
  set, then temperature-scaled on a held-out 20% of it (`fit`, `validation_fraction`).
* The oracle: an independent classifier of another architecture (wider and deeper MLP) trained on
  the whole training split, which scores generated samples (never seen by any method).
* The noisy classifier of classifier guidance: p(y | x_t, t), trained on q_sample(x0, t) with
  t ~ U{0..T-1} and the time as an extra input feature.

`Classifier.log_prob(x, y)` is log softmax(logits / T)[y]; every function is pure and jittable.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import special

from jaxlab.diffusion import schedules
from jaxlab.methods.ctrl import evaluation
from jaxlab.zoo import functional
from jaxlab.zoo import mlp

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Classifier:
  """An MLP classifier on flattened samples, with its temperature."""
  apply: Callable[[PyTree, jax.Array], jax.Array]    # (params, x [B, ...]) -> logits [B, C]
  params: PyTree
  temperature: float = 1.0

  def logits(self, x: jax.Array) -> jax.Array:
    return self.apply(self.params, x) / self.temperature

  def log_prob(self, x: jax.Array, y: jax.Array) -> jax.Array:
    """log p(y | x) [B]."""
    log_probs = jax.nn.log_softmax(self.logits(x), -1)
    return jnp.take_along_axis(log_probs, y[:, None].astype(jnp.int32), -1)[:, 0]

  def probabilities(self, x: jax.Array) -> jax.Array:
    return jax.nn.softmax(self.logits(x), -1)


def mlp_classifier(sample_shape: Sequence[int], num_classes: int, hidden: Sequence[int],
                   extra_features: int = 0):
  """(model, apply) of a GELU MLP on the flattened sample (plus `extra_features` inputs)."""
  features = int(np.prod(sample_shape)) + extra_features
  model = functional.Functional(lambda rngs: mlp.MLP([features, *hidden, num_classes],
                                                     activation="gelu", rngs=rngs))

  def apply(params, x, extra=None):
    flat = x.reshape(x.shape[0], -1)
    if extra is not None:
      flat = jnp.concatenate([flat, extra], -1)
    return model.apply(params, flat)
  return model, apply


def _train(loss_fn, params: PyTree, steps: int, lr: float, weight_decay: float,
           key: jax.Array) -> PyTree:
  """AdamW with cosine decay for `steps` full- or mini-batch steps, one `lax.scan`."""
  optimizer = optax.adamw(optax.cosine_decay_schedule(lr, max(steps, 1)),
                          weight_decay=weight_decay)

  def step(carry, step_key):
    params, opt_state = carry
    grads = jax.grad(loss_fn)(params, step_key)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)),
                                jax.random.split(key, steps))
  return params


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1),
                                       labels[:, None].astype(jnp.int32), -1))


def fit(x: np.ndarray, y: np.ndarray, num_classes: int, *, hidden: Sequence[int], steps: int,
        key: jax.Array, lr: float = 3e-3, weight_decay: float = 1e-4, batch_size: int = 256,
        validation_fraction: float = 0.0) -> tuple[Classifier, dict[str, float]]:
  """A classifier of x -> y; with `validation_fraction` > 0, that share of the examples (a seeded
  random subset) is held out to fit the temperature and to measure ECE before and after.

  Returns (classifier, {"acc", "ece_raw", "ece_scaled", "temperature"} on the held-out part;
  empty without one).
  """
  x, y = np.asarray(x, np.float32), np.asarray(y, np.int32)
  init_key, split_key, train_key = jax.random.split(key, 3)
  order = np.asarray(jax.random.permutation(split_key, len(x)))
  num_val = int(round(validation_fraction * len(x)))
  if validation_fraction > 0 and not 2 <= num_val < len(x):
    raise ValueError(f"validation_fraction {validation_fraction} of {len(x)} examples leaves "
                     "no usable validation or training split")
  val, train = order[:num_val], order[num_val:]
  model, apply = mlp_classifier(x.shape[1:], num_classes, hidden)
  x_train, y_train = jnp.asarray(x[train]), jnp.asarray(y[train])
  batch = min(batch_size, len(train))

  def loss_fn(params, step_key):
    rows = jax.random.choice(step_key, len(train), (batch,), replace=False)
    return cross_entropy(apply(params, x_train[rows]), y_train[rows])

  params = jax.jit(_train, static_argnums=(0, 2, 3, 4))(loss_fn, model.init(init_key), steps,
                                                         lr, weight_decay, train_key)
  classifier = Classifier(apply=apply, params=params)
  if not num_val:
    return classifier, {}
  val_logits = np.asarray(apply(params, jnp.asarray(x[val])), np.float64)
  temperature = evaluation.fit_temperature(val_logits, y[val])
  report = {"acc": float(np.mean(val_logits.argmax(-1) == y[val])),
            "ece_raw": evaluation.expected_calibration_error(special.softmax(val_logits, -1), y[val]),
            "ece_scaled": evaluation.expected_calibration_error(
                special.softmax(val_logits / temperature, -1), y[val]),
            "temperature": temperature}
  return dataclasses.replace(classifier, temperature=temperature), report


def fit_noisy(x0: np.ndarray, y: np.ndarray, num_classes: int, schedule: schedules.Schedule, *,
              hidden: Sequence[int], steps: int, key: jax.Array, lr: float = 3e-3,
              batch_size: int = 256) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """p(y | x_t, t) for classifier guidance: returns log_prob(x_t, t, y) -> [B]."""
  x0, y = jnp.asarray(x0, jnp.float32), jnp.asarray(y, jnp.int32)
  model, apply = mlp_classifier(x0.shape[1:], num_classes, hidden, extra_features=2)
  num_steps = schedule.num_steps

  def time_features(t):
    phase = t.astype(jnp.float32)[:, None] / num_steps
    return jnp.concatenate([phase, jnp.sqrt(schedule.alphas_cumprod[t])[:, None]], -1)

  def loss_fn(params, step_key):
    row_key, t_key, noise_key = jax.random.split(step_key, 3)
    batch = min(batch_size, x0.shape[0])
    rows = jax.random.choice(row_key, x0.shape[0], (batch,), replace=False)
    t = jax.random.randint(t_key, (batch,), 0, num_steps)
    x_t = schedules.q_sample(schedule, x0[rows], t, jax.random.normal(noise_key, x0[rows].shape))
    return cross_entropy(apply(params, x_t, time_features(t)), y[rows])

  init_key, train_key = jax.random.split(key)
  params = jax.jit(_train, static_argnums=(0, 2, 3, 4))(loss_fn, model.init(init_key), steps,
                                                         lr, 1e-4, train_key)

  def log_prob(x_t, t, labels):
    log_probs = jax.nn.log_softmax(apply(params, x_t, time_features(t)), -1)
    return jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), -1)[:, 0]
  return log_prob

