"""Every MI estimator behind one name, and `estimate(x, y, method=...)` for users' own samples.

Trained (through `fitting.fit`): the paper's JVF, NVF, NVG and the critic baselines InfoNCE, NWJ,
DV, MINE. Closed form: JVG (the Gaussian MI of the held-out half: identity flows need no
training), CCA (the Gaussian MI of all samples) and KSG (k nearest neighbours, all samples).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.core import metrics as metrics_lib
from jaxlab.methods.flow_mi import fitting
from jaxlab.methods.flow_mi import gaussian
from jaxlab.methods.flow_mi import ksg as ksg_lib
from jaxlab.methods.flow_mi import models
from jaxlab.methods.flow_mi import objectives
from jaxlab.zoo import functional

PAPER_METHODS = ("jvg", "jvf", "nvg", "nvf")
CRITIC_METHODS = ("infonce", "nwj", "mine", "dv")
CLOSED_FORM = ("jvg", "cca", "ksg")
ALL_METHODS = PAPER_METHODS + CRITIC_METHODS + ("cca", "ksg")
TRAINED_METHODS = tuple(m for m in ALL_METHODS if m not in CLOSED_FORM)
NV_METHODS = ("nvf", "nvg")


@dataclasses.dataclass(frozen=True)
class Options:
  """Estimator settings; the defaults are the official ones (see the method README)."""
  # Flows: masked autoregressive rational-quadratic splines.
  flow_layers: int = 1
  flow_hidden: int = 8
  flow_depth: int = 2
  num_bins: int = 128
  bound: float = 8.0
  dropout: float = 0.2
  head_hidden: tuple[int, ...] = (16, 8)      # NV's mean / Cholesky MLPs
  critic_hidden: tuple[int, ...] = (16, 8)    # the baselines' critic
  # Optimisation (shared loop; learning rates per family, as in the two official codes).
  flow_lr: float = 5e-3
  critic_lr: float = 0.1
  weight_decay: float = 1e-5
  steps: int = 10_000
  # The NV family's own budget (None: `steps`): its conditional-mean MLP learns a regression,
  # which on large-MI tasks takes thousands of steps (the official large-MI runs train 3,000).
  nv_steps: int | None = None
  batch_size: int = 256
  eval_every: int = 250
  ckpt_every: int = 2_500
  plateau_factor: float = 0.1
  plateau_patience: int = 1
  mine_decay: float = 0.9
  ksg_neighbors: int = 5
  train_fraction: float = 0.5
  standardize: bool = True

  def schedule(self, method: str | None = None) -> fitting.Schedule:
    """The training-loop fields (every field of `fitting.Schedule` is also one of ours), with
    `nv_steps` as the step budget of `method` when it is NVF or NVG."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(fitting.Schedule)}
    if method in NV_METHODS and self.nv_steps is not None:
      fields["steps"] = self.nv_steps
    return fitting.Schedule(**fields)

  @classmethod
  def from_mapping(cls, values: dict[str, Any]) -> "Options":
    known = sorted(f.name for f in dataclasses.fields(cls))
    for key in values:
      _require_known("estimator option", key, known)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**values)


def _require_known(kind: str, name: str, known: Sequence[str]) -> None:
  """A ValueError naming `name`, the closest known name and all of them, unless it is known."""
  if name not in known:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown {kind} {name!r}{hint}; choose one of {', '.join(known)}")


def check_method(method: str) -> str:
  _require_known("MI estimator", method, ALL_METHODS)
  return method


def _flow_options(options: Options) -> dict[str, Any]:
  return dict(layers=options.flow_layers, hidden=options.flow_hidden, depth=options.flow_depth,
              num_bins=options.num_bins, bound=options.bound, dropout=options.dropout)


# Options that only the training loop or the data split read: they never change a Trainable.
_LOOP_OPTIONS = ("steps", "nv_steps", "batch_size", "eval_every", "ckpt_every", "plateau_factor",
                 "plateau_patience", "ksg_neighbors", "train_fraction", "standardize")


def trainable(method: str, dim_x: int, dim_y: int, options: Options) -> fitting.Trainable:
  """The Trainable of a trained method for data of these dimensions (cached, so estimates that
  differ only in loop settings such as `steps` share one compiled training chunk)."""
  defaults = Options()
  model_options = dataclasses.replace(
      options, **{name: getattr(defaults, name) for name in _LOOP_OPTIONS})
  return _trainable(check_method(method), dim_x, dim_y, model_options)


@functools.lru_cache(maxsize=None)
def _trainable(method: str, dim_x: int, dim_y: int, options: Options) -> fitting.Trainable:
  if method in ("jvf",):
    model = functional.Functional(lambda rngs: models.JointFlows(
        dim_x, dim_y, use_flow=True, rngs=rngs, **_flow_options(options)))
    objective = objectives.joint_variational
  elif method in ("nvf", "nvg"):
    model = functional.Functional(lambda rngs: models.NeuralVariational(
        dim_x, dim_y, use_flow=method == "nvf", head_hidden=options.head_hidden, rngs=rngs,
        **_flow_options(options)))
    objective = objectives.neural_variational
  elif method in CRITIC_METHODS:
    model = functional.Functional(lambda rngs: models.PairCritic(
        dim_x, dim_y, hidden=options.critic_hidden, rngs=rngs))
    objective = functools.partial(objectives.critic_bound, method)
  else:
    raise ValueError(f"{method!r} is closed-form; it has no trainable")

  def test_metrics(params, x, y):
    return objective(model.module(params), x, y)

  if method == "mine":
    def train_loss(params, moving_average, x, y, rng):
      del rng
      return objectives.mine_training_loss(model.module(params), moving_average, x, y,
                                           options.mine_decay)
    init_extra = lambda: jnp.ones((), jnp.result_type(float))
  else:
    def train_loss(params, extra, x, y, rng):
      loss, mi = objective(model.module(params), x, y, rng)
      return loss, (extra, mi)
    init_extra = lambda: {}

  lr = options.critic_lr if method in CRITIC_METHODS else options.flow_lr
  optimizer = optax.adamw(lr, weight_decay=options.weight_decay)
  return fitting.Trainable(name=method, model=model, train_loss=train_loss,
                           test_metrics=test_metrics, optimizer=optimizer,
                           init_extra=init_extra)


# Module-level, so that repeated closed-form estimates (a design study calls it at every
# experiment) reuse one compiled function per shape.
_seedwise_gaussian_mi = jax.jit(jax.vmap(gaussian.gaussian_mi))


def closed_form(method: str, data: fitting.FitData, options: Options) -> np.ndarray:
  """JVG / CCA / KSG for every seed of `data` ([S] estimates)."""
  if method == "jvg":
    return np.asarray(_seedwise_gaussian_mi(data.x_test, data.y_test))
  x = jnp.concatenate([data.x_train, data.x_test], axis=1)
  y = jnp.concatenate([data.y_train, data.y_test], axis=1)
  if method == "cca":
    return np.asarray(_seedwise_gaussian_mi(x, y))
  if method == "ksg":
    return np.asarray([float(ksg_lib.ksg(x[s], y[s], k=options.ksg_neighbors))
                       for s in range(x.shape[0])])
  raise ValueError(f"{method!r} is not closed-form")


def validate_samples(x: Any, y: Any, train_fraction: float, batch_size: int
                     ) -> tuple[np.ndarray, np.ndarray]:
  """[N, dx], [N, dy] float arrays (1-D inputs become one column) or a ValueError saying why."""
  x, y = np.asarray(x), np.asarray(y)
  x = x[:, None] if x.ndim == 1 else x
  y = y[:, None] if y.ndim == 1 else y
  if x.ndim != 2 or y.ndim != 2:
    raise ValueError(f"x and y must be [N, dx] and [N, dy] arrays, got shapes {x.shape} and "
                     f"{y.shape}")
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"x and y must hold the same number of samples, got {x.shape[0]} and "
                     f"{y.shape[0]}")
  for name, array in (("x", x), ("y", y)):
    if not np.issubdtype(array.dtype, np.number):
      raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    if not np.all(np.isfinite(array)):
      raise ValueError(f"{name} contains {np.sum(~np.isfinite(array))} NaN/Inf values")
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
  num_train = int(round(x.shape[0] * train_fraction))
  smallest = max(batch_size, 2 * max(x.shape[1], y.shape[1]) + 2)
  if num_train < smallest or x.shape[0] - num_train < 2 * (x.shape[1] + y.shape[1]):
    raise ValueError(
        f"{x.shape[0]} samples are too few: the training split ({num_train}) must hold at least "
        f"one batch ({batch_size}) and the held-out split enough points for a "
        f"{x.shape[1] + y.shape[1]}-dimensional covariance; pass more samples or a smaller "
        "batch_size")
  return x, y


def split(x: jax.Array, y: jax.Array, key: jax.Array, train_fraction: float,
          standardize: bool) -> fitting.FitData:
  """Standardise (before splitting, like the official code), then a random split."""
  if standardize:
    x, y = gaussian.standardize(x), gaussian.standardize(y)
  order = jax.random.permutation(key, x.shape[0])
  num_train = int(round(x.shape[0] * train_fraction))
  train, test = order[:num_train], order[num_train:]
  return fitting.FitData(x[train], y[train], x[test], y[test])


def estimate(x: Any, y: Any, method: str = "jvf", seed: int = 0, *,
             workdir: str | None = None, progress: bool = False, **options: Any) -> float:
  """Estimates I(X; Y) in nats from paired samples x [N, dx], y [N, dy] (numpy or JAX arrays).

  `method`: one of `ALL_METHODS`; `options`: any field of `Options` (e.g. `steps=2000`). The data
  are standardised, split in halves (train / held-out), and a trained estimator reports its
  held-out MI at its lowest held-out loss. Runs in float32 unless float64 is enabled.
  """
  check_method(method)
  opts = Options.from_mapping(options)
  x, y = validate_samples(x, y, opts.train_fraction, opts.batch_size)
  dtype = jnp.result_type(float)
  key = jax.random.key(seed)
  split_key, fit_key = jax.random.split(key)
  data = split(jnp.asarray(x, dtype), jnp.asarray(y, dtype), split_key, opts.train_fraction,
               opts.standardize)
  stacked = jax.tree.map(lambda a: a[None], data)
  if method in CLOSED_FORM:
    return float(closed_form(method, stacked, opts)[0])
  result = fitting.fit(trainable(method, x.shape[1], y.shape[1], opts), stacked,
                       fit_key[None], opts.schedule(method), workdir=workdir, progress=progress)
  value = float(result.best_mi[0])
  if not np.isfinite(value):
    raise metrics_lib.NonFiniteError(
        f"{method} produced no finite held-out estimate in {opts.schedule(method).steps} steps "
        f"({int(result.skipped_steps[0])} steps skipped as non-finite); lower the learning rate")
  return value
