"""One entry point for every ranking: `rank(battles, method, seed, fraction, true_order)`.

`battles` is a `Battles`, a JSONL path, or judgment records in the official schema. For a path
or records the ranked models are `true_order` when given (it must then name every model of the
file, judges included), else the sorted set of the answering models (`model_1`, `model_2`); a
judge outside that set, a model without battles or an unknown verdict raises, naming it. The
error flags of the Uniform / Reversed / Order penalty come from the records; a `Battles` carries
none (pass `errors=` to apply the penalty).

`fraction` < 1 keeps that fraction of each reviewer's battles (`consistency.subsample`, seeded
by `seed`), before any method. `seed` also draws PiCO's u and initialisation and breaks exact
score ties (at random, never by model index: models are often indexed in the true order).
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from jaxlab.methods.pico import baselines
from jaxlab.methods.pico import battles as battles_lib
from jaxlab.methods.pico import consistency

METHODS = ("pico", "pico_elo", "uniform", "reversed", "order", "majority", "pagerank", "prd")
# The options each method takes (anything else raises).
OPTIONS = {
    "pico": ("num_steps", "learning_rate", "k_rank", "eliminate"),
    "pico_elo": ("num_steps", "learning_rate", "eliminate"),
    "uniform": ("errors", "error_penalty"),
    "reversed": ("errors", "error_penalty"),
    "order": ("errors", "error_penalty"),
    "majority": (),
    "pagerank": ("damping", "num_iterations"),
    "prd": ("num_iterations",),
}

BattleSource = battles_lib.Battles | str | os.PathLike | Sequence[dict]


def _read_jsonl(path: str | os.PathLike) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def as_battles(source: BattleSource, true_order: Sequence[str] | None = None
               ) -> tuple[battles_lib.Battles, np.ndarray | None]:
  """(Battles, errors [B] bool or None): a path or records parsed with `battles.from_records`
  (models: `true_order` if given, else the sorted answering models); a `Battles` as it is."""
  if isinstance(source, battles_lib.Battles):
    return source, None
  records = _read_jsonl(source) if isinstance(source, (str, os.PathLike)) else list(source)
  if true_order is not None and all(isinstance(m, str) for m in true_order):
    models = tuple(true_order)
  else:
    models = tuple(sorted({r["model_1"] for r in records} | {r["model_2"] for r in records}))
  return battles_lib.from_records(records, models), baselines.judge_errors(records)


def _true_indices(true_order: Sequence[Any] | None, models: Sequence[str]) -> np.ndarray | None:
  """The true order as model indices, best first (from names or indices)."""
  if true_order is None:
    return None
  if all(isinstance(m, str) for m in true_order):
    unknown = [m for m in true_order if m not in models]
    if unknown:
      raise ValueError(f"true_order names model(s) {unknown} that are not ranked models")
    index = {name: i for i, name in enumerate(models)}
    true_order = [index[m] for m in true_order]
  true_order = np.asarray(true_order, np.int64)
  if sorted(true_order.tolist()) != list(range(len(models))):
    raise ValueError(f"true_order must list each of the {len(models)} models once, got "
                     f"{true_order.tolist()}")
  return true_order


def _pico(battles: battles_lib.Battles, seed: int, variant: str,
          num_steps: int = consistency.NUM_STEPS,
          learning_rate: float = consistency.LEARNING_RATE, k_rank: float = consistency.K_RANK,
          eliminate: int = 0) -> baselines.Ranking:
  data = consistency.arrays(battles)
  key = jax.random.key(seed)
  settings = dict(num_models=battles.num_models, variant=variant, num_steps=num_steps,
                  learning_rate=learning_rate, k_rank=k_rank)
  if eliminate:
    result = consistency.eliminate(data, key, max_eliminated=int(eliminate), **settings)
    chosen = int(result.chosen_k)
    weights, scores = result.weights[chosen], result.scores[chosen]
  else:
    result = consistency.fit(data, key, **settings)
    weights, scores = result.weights, result.scores
  return baselines.as_ranking(np.asarray(scores), np.asarray(weights))


def rank(battles: BattleSource, method: str = "pico", seed: int = 0, fraction: float = 1.0,
         true_order: Sequence[Any] | None = None, **options
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(order, scores, weights): model indices best first, a score per model, a weight per
  reviewer (ones for methods without reviewer weights).

  Methods: `pico` (rank variant; options num_steps, learning_rate, k_rank, and eliminate=K to
  run unsupervised elimination up to K reviewers and keep the chosen k), `pico_elo` (Elo
  variant), `uniform` / `reversed` / `order` (the official weight schedules; options errors,
  error_penalty; reversed and order need `true_order`), `majority`, `pagerank` (damping,
  num_iterations), `prd` (num_iterations). `true_order`: model names or indices, best first.
  """
  if method not in METHODS:
    raise ValueError(f"unknown ranking method {method!r}; expected one of {METHODS}")
  unknown = sorted(set(options) - set(OPTIONS[method]))
  if unknown:
    raise ValueError(f"method {method!r} takes no option(s) {unknown}; it takes "
                     f"{OPTIONS[method]}")
  if method in ("reversed", "order") and true_order is None:
    raise ValueError(f"method {method!r} weights reviewers by the true order (an oracle): "
                     "pass true_order")
  battles, errors = as_battles(battles, true_order)
  truth = _true_indices(true_order, battles.models)
  if "errors" in options:
    errors = options.pop("errors")
  if fraction != 1.0:
    keep = np.flatnonzero(consistency.subsample_mask(battles, fraction, seed))
    battles = battles.take(keep)
    errors = None if errors is None else np.asarray(errors)[keep]

  if method in ("pico", "pico_elo"):
    result = _pico(battles, seed, "rank" if method == "pico" else "elo", **options)
  elif method in baselines.SCHEDULES:
    result = baselines.schedule(battles, method, truth, errors, **options)
  elif method == "majority":
    result = baselines.majority(battles)
  elif method == "pagerank":
    result = baselines.pagerank(battles, **options)
  else:
    result = baselines.prd(battles, **options)
  # Exact ties broken at random (seeded), not by model index, which may be the true order.
  result = baselines.as_ranking(result.scores, result.weights, seed)
  return result.order, result.scores, result.weights
