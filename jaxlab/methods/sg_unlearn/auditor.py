"""The auditor (follower) of adversarial unlearning: a differentiable membership-inference attack.

The unlearner (leader, parameters theta) minimises retain loss + alpha * U_a(theta, w*(theta)).
The auditor attacks membership: for every class c and every cross-validation fold k it fits a
linear attacker w_ck on per-example scores s(theta) [N, F] (the cross-entropy, optionally the
logits too) that tells forget examples (members, label +1) from validation examples
(non-members, label -1). Folds are stratified shuffle-splits on the class label (3 folds, 30%
held out, as the paper); `fold_masks` turns them into 0/1 weights [C, K, N] so that all C*K
attackers are one `vmap`ed solve over fixed shapes. The attacker's utility is minus its logistic
loss on each fold's held-out part, summed over folds and classes, divided by N: higher means
the attack separates members from non-members better.

Deviation from the paper. The paper's attacker is an unregularised hinge-loss linear SVM solved
by SCS inside cvxpylayers. Its optimum need not be unique (any separating hyperplane of
separable data is optimal up to scale, and the hinge is flat or kinked at the solution), so the
KKT system does not define a unique derivative dw*/ds. We instead fit an L2-regularised logistic
regression, a smooth and strongly convex objective: it has exactly one optimum w*(s), its Hessian
there is positive definite, and the implicit function theorem gives
    dw*/ds = -H^{-1} d(grad_w objective)/ds.
`fit_attacker` solves by Newton's method with a fixed number of damped steps and wraps the
solve in `jax.lax.custom_root`, so JAX differentiates the optimality condition (the gradient of
the objective) at the returned point instead of backpropagating through the Newton iterations.

What the leader's gradient consists of. d U_a / d s has two paths: the direct one, through the
held-out scores inside the utility with w* held fixed, and the implicit one, through w*(s) of
every attacker (whose training scores also depend on theta). Chaining with ds/dtheta happens in
the caller; this module only sees the scores.

Bias. `attacker_features` appends a constant-1 column, so every attacker is w = [weights, bias]
[F+1]. The weights carry the penalty `l2`; the bias carries its own `bias_l2`, tiny by default
(`BIAS_L2`) rather than zero, because a (class, fold) problem whose weights are all masked off,
or whose training part holds one label only, would otherwise have a singular Hessian (an
unpenalised bias runs to +-infinity). Such problems contribute nothing anyway; this just keeps
their solves finite. With `bias_l2=0` the objective is exactly scikit-learn's
LogisticRegression with an unpenalised intercept and C = 1 / (l2 * sum(weights)).

Scale. The penalty is not scale-invariant: scores are used as given, so `l2` should be chosen
for the scale of s (the cross-entropy of a trained model is O(0.01..10)).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Default penalty on the attacker's bias; see the module docstring. It moves a well-posed
# attacker's bias by about bias_l2 / (curvature of the data term), far below float32 resolution
# for any sensible problem.
BIAS_L2 = 1e-6

# Damping of Newton's method: the largest step 2^-j (j < NUM_STEP_HALVINGS) that satisfies the
# Armijo sufficient-decrease condition. Undamped Newton on a logistic loss can overshoot when the
# data are nearly separable and l2 is small; all candidate steps are evaluated at once (fixed
# shapes, no data-dependent loop), which is cheap because the logits are linear in the step.
NUM_STEP_HALVINGS = 20
ARMIJO_FRACTION = 1e-4


def membership_labels(members: jax.Array | np.ndarray) -> jax.Array:
  """+1 for members (forget examples), -1 for non-members (validation examples): [N] float."""
  return jnp.where(jnp.asarray(members, bool), 1.0, -1.0)


def attacker_features(scores: jax.Array) -> jax.Array:
  """The attacker's design matrix: scores [N, F] and a constant-1 (bias) column: [N, F+1]."""
  return jnp.concatenate([scores, jnp.ones((scores.shape[0], 1), scores.dtype)], axis=1)


def _penalty_diagonal(num_params: int, l2: float, bias_l2: float, dtype) -> jax.Array:
  """Per-coordinate L2 penalty [F+1]: `l2` on the weights, `bias_l2` on the trailing bias."""
  return jnp.concatenate([jnp.full((num_params - 1,), l2, dtype), jnp.full((1,), bias_l2, dtype)])


def _data_weights(weights: jax.Array) -> jax.Array:
  """Weights normalised by max(sum, 1): a masked-off problem has zero data term, not 0/0."""
  return weights / jnp.maximum(weights.sum(), 1.0)


def attacker_objective(params: jax.Array, features: jax.Array, labels: jax.Array,
                       weights: jax.Array, *, l2: float, bias_l2: float = BIAS_L2) -> jax.Array:
  """The attacker's training objective at params [F+1] (scalar).

  sum_i weights_i softplus(-labels_i <params, [x_i, 1]>) / max(sum weights, 1)
    + 1/2 l2 ||params[:F]||^2 + 1/2 bias_l2 params[F]^2,
  for features x [N, F], labels [N] in {-1, +1} and weights [N] >= 0.
  """
  design = attacker_features(features)
  margins = labels * (design @ params)
  penalty = _penalty_diagonal(params.shape[0], l2, bias_l2, params.dtype)
  return (jnp.sum(_data_weights(weights) * jax.nn.softplus(-margins))
          + 0.5 * jnp.sum(penalty * params**2))


def _newton_solve(design: jax.Array, labels: jax.Array, weights: jax.Array,
                  penalty: jax.Array, newton_steps: int) -> jax.Array:
  """Damped Newton from zero on the attacker objective, in closed form: params [F+1]."""
  data_weights = _data_weights(weights)
  step_sizes = 2.0 ** -jnp.arange(NUM_STEP_HALVINGS, dtype=design.dtype)

  def objective_along(logits: jax.Array, params: jax.Array) -> jax.Array:
    # logits [T, N], params [T, F+1]: the objective at T points at once.
    data = jnp.sum(data_weights[None, :] * jax.nn.softplus(-labels[None, :] * logits), axis=1)
    return data + 0.5 * jnp.sum(penalty[None, :] * params**2, axis=1)

  def newton_step(_, params):
    logits = design @ params
    # d softplus(-y z)/dz = -y sigmoid(-y z); the curvature sigmoid(z) sigmoid(-z) is label-free.
    slope = -labels * jax.nn.sigmoid(-labels * logits)
    curvature = jax.nn.sigmoid(logits) * jax.nn.sigmoid(-logits)
    gradient = design.T @ (data_weights * slope) + penalty * params
    hessian = design.T @ ((data_weights * curvature)[:, None] * design) + jnp.diag(penalty)
    direction = -jnp.linalg.solve(hessian, gradient)
    candidates = params[None, :] + step_sizes[:, None] * direction[None, :]
    values = objective_along(logits[None, :] + step_sizes[:, None] * (design @ direction)[None, :],
                             candidates)
    current = objective_along(logits[None, :], params[None, :])[0]
    sufficient = values <= current + ARMIJO_FRACTION * step_sizes * (gradient @ direction)
    # The first (largest) step that decreases enough; none does only once the objective is flat
    # to rounding error, i.e. at the optimum, where staying put is right.
    step = jnp.where(sufficient.any(), step_sizes[jnp.argmax(sufficient)], 0.0)
    return params + step * direction

  return jax.lax.fori_loop(0, newton_steps, newton_step, jnp.zeros_like(penalty))


def _solve_linearised(linear_fn, rhs: jax.Array) -> jax.Array:
  """Solves linear_fn(x) = rhs for the Hessian-vector map custom_root linearises at the optimum."""
  # Materialise the [F+1, F+1] matrix column by column; F is small.
  matrix = jax.vmap(linear_fn)(jnp.eye(rhs.shape[0], dtype=rhs.dtype)).T
  return jnp.linalg.solve(matrix, rhs)


def fit_attacker(features: jax.Array, labels: jax.Array, weights: jax.Array, *, l2: float,
                 newton_steps: int, bias_l2: float = BIAS_L2) -> jax.Array:
  """The optimal attacker w* = [weights, bias] [F+1] for features [N, F], labels [N], weights [N].

  w* minimises `attacker_objective`. Derivatives with respect to features, labels and weights
  come from the implicit function theorem at the returned point (`jax.lax.custom_root`), never
  from the Newton iterations; they are exact once `newton_steps` has converged (about 10-20 from
  zero for well-scaled scores).
  """
  # custom_root traces its functions to jaxprs, which reject host numpy constants.
  features, labels, weights = jnp.asarray(features), jnp.asarray(labels), jnp.asarray(weights)
  design = attacker_features(features)
  penalty = _penalty_diagonal(design.shape[1], l2, bias_l2, design.dtype)
  optimality = jax.grad(
      lambda params: attacker_objective(params, features, labels, weights, l2=l2,
                                        bias_l2=bias_l2))
  # The solver gets no derivatives (custom_root discards them), so it may see the data directly.
  solve = lambda _, initial: _newton_solve(design, labels, weights, penalty, newton_steps)
  return jax.lax.custom_root(optimality, jnp.zeros_like(penalty), solve, _solve_linearised)


def fit_attackers(features: jax.Array, labels: jax.Array, train_weights: jax.Array, *, l2: float,
                  newton_steps: int, bias_l2: float = BIAS_L2) -> jax.Array:
  """One attacker per (class, fold): train_weights [C, K, N] -> params [C, K, F+1]."""
  train_weights = jnp.asarray(train_weights)
  num_classes, num_folds, num_samples = train_weights.shape
  fit = lambda weights: fit_attacker(features, labels, weights, l2=l2, newton_steps=newton_steps,
                                     bias_l2=bias_l2)
  params = jax.vmap(fit)(train_weights.reshape(num_classes * num_folds, num_samples))
  return params.reshape(num_classes, num_folds, params.shape[-1])


def attacker_utility(features: jax.Array, labels: jax.Array, train_weights: jax.Array,
                     test_weights: jax.Array, *, l2: float, newton_steps: int,
                     bias_l2: float = BIAS_L2) -> jax.Array:
  """U_a: minus the attackers' held-out logistic loss, summed over (class, fold), over N (scalar).

  features [N, F] are the scores s(theta); labels [N] are `membership_labels`; train_weights
  and test_weights [C, K, N] come from `fold_masks`. Gradients with respect to features carry
  both the direct path (held-out losses at fixed w*) and the implicit one (through w*).
  """
  params = fit_attackers(features, labels, train_weights, l2=l2, newton_steps=newton_steps,
                         bias_l2=bias_l2)
  logits = jnp.einsum("ckf,nf->ckn", params, attacker_features(features))
  held_out_loss = jnp.sum(test_weights * jax.nn.softplus(-labels[None, None, :] * logits))
  return -held_out_loss / features.shape[0]


def fold_masks(classes: np.ndarray, members: np.ndarray, *, num_folds: int = 3,
               test_fraction: float = 0.3, num_classes: int,
               seed: int, per_class: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """Per-(class, fold) 0/1 sample weights: (train_weights, test_weights), each [C, K, N] float32.

  With `per_class=False` there is a single attacker per fold over every class (C = 1), still on
  folds stratified by class: the official code's choice when a whole class is forgotten, where
  the members all share one class and per-class attackers would have no non-members to face.

  The folds are scikit-learn's StratifiedShuffleSplit(num_folds, test_fraction, seed) stratified
  on `classes` [N]. Classes with fewer than 2 samples cannot be stratified (the paper drops
  them): their samples are left out of the split and get all-zero weights. If any such samples
  exist the split is drawn over the remaining ones, so it differs from a split of all N. A
  (class, fold) attacker whose training part lacks members or non-members (`members` [N]) has
  nothing to learn: both its train and its test weights are zeroed.
  """
  from sklearn.model_selection import StratifiedShuffleSplit  # pylint: disable=g-import-not-at-top
  classes = np.asarray(classes)
  members = np.asarray(members).astype(bool)
  num_samples = classes.shape[0]
  train = np.zeros((num_classes, num_folds, num_samples), np.float32)
  test = np.zeros((num_classes, num_folds, num_samples), np.float32)
  counts = np.bincount(classes, minlength=num_classes)
  kept = np.flatnonzero(counts[classes] >= 2)
  if kept.size == 0:
    return train, test
  splitter = StratifiedShuffleSplit(n_splits=num_folds, test_size=test_fraction,
                                    random_state=seed)
  attacker_of = classes if per_class else np.zeros_like(classes)
  for fold, (train_part, test_part) in enumerate(splitter.split(kept, classes[kept])):
    for part, out in ((kept[train_part], train), (kept[test_part], test)):
      out[attacker_of[part], fold, part] = 1.0
  if not per_class:
    train, test = train[:1], test[:1]
  has_members = np.einsum("ckn,n->ck", train, members.astype(np.float32)) > 0
  has_non_members = np.einsum("ckn,n->ck", train, (~members).astype(np.float32)) > 0
  valid = (has_members & has_non_members).astype(np.float32)[:, :, None]
  return train * valid, test * valid
