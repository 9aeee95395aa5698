"""Simulated peer review of the 15 MT-Bench models: a reconstructed design, calibrated to real data.

Only one reviewer's judgments (gpt-3.5-turbo's) exist offline, so the multi-reviewer claims are
tested on simulated review. The design:

- Models: the 15 names of `data.true_order()`; ability a_k evenly spaced along that order, the
  best highest (from +spread/2 down to -spread/2).
- Questions: 80. Answer quality q[question, k] = a_k + N(0, sigma_q^2).
- Pairs, as the official pairing script: per question each model meets `opponents` (4) distinct
  random others; the unordered pairs are deduplicated, and a coin decides which is `model_1`.
  A pair is picked unless neither side drew the other, so a question holds on average
  C(15, 2) (1 - (10/14)^2) = 51.4 pairs, and a data set 80 x 51.4 x 15 x 0.85 = 52,457 judged
  battles in expectation (the issue's "about 49,000" assumes about 48 pairs a question).
- Reviewers: all 15 models. Each judges each battle with probability 0.85, in both orders. A game
  with answers (first, second) is won by the first if d > t, by the second if d < -t, tied
  otherwise (t: the tie band), with
      d = q_first - q_second + b_r + s ([r is first] - [r is second]) + N(0, sigma_r^2):
  b_r the position bias (favouring the first answer; the same b for every reviewer), s the
  self-preference, sigma_r the reviewer's noise. The battle's outcome is `battles.outcome` of
  the two verdicts, in the original labels.
- Reviewer noise, `default` family (the consistency assumption: better models review better):
  sigma_r rises linearly as the ability falls, from sigma_top for the best model to
  weak_noise_ratio * sigma_top for the worst, whose verdicts are then close to coin flips (and,
  with the same b, hardly position-biased). `violated` family: every sigma_r equals the mean of
  the default ones, so reviewing skill no longer follows ability.

Calibration: the real file is the top model's (gpt-3.5-turbo, rank 0) judgments, so only that
reviewer is fitted: `calibrate_top_reviewer` chooses its b and sigma so that its disagreement
rate and first-position share (`data.double_verdict_rates`) match the real file's (41.8% and
39.1%). The other reviewers' noise follows from sigma_top by the rule above; b is shared. The
defaults of `SimulationSpec` are that fit (checked by a test).

Scale (chosen, not fitted; quality units are arbitrary, so sigma_q = 0.5 fixes them): the
ability spread 0.5 makes the top reviewer alone rank about as well as the real file does (mean
Spearman of its mean-score ranking 0.91 over 20 seeds; the real file's is 0.918); the tie band
0.05 gives 3.5% tied games for it (real: 3.1%); self-preference s = 0.25 is half an answer's
quality noise; with weak_noise_ratio = 6 the decisive battles of the worst reviewer follow the
ability order 52% of the time, the best reviewer's 63% (seed 0; pairs close in ability are
often decided by the answers' quality noise). With this scale the calibration gives b = 0.525,
sigma_top = 0.717.

The random streams for pairs, qualities, judging and game noise are separate (`default_rng([seed,
stream])`): the two families, or specs differing only in b or sigma, see the same pairs, answers
and standard-normal draws for a seed (common random numbers).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.optimize
import scipy.special

from jaxlab.methods.pico import battles as battles_lib
from jaxlab.methods.pico import data as data_lib

FAMILIES = ("default", "violated")
_PAIRS, _QUALITY, _JUDGING, _NOISE = range(4)  # random stream ids (see the module docstring)

# The verdict codes used below index battles.VERDICTS: 0 model_1, 1 model_2, 2 tie.
_MODEL_1, _MODEL_2, _TIE = (battles_lib.VERDICTS.index(v) for v in ("model_1", "model_2", "tie"))


@dataclasses.dataclass(frozen=True)
class SimulationSpec:
  """One simulated peer-review data set (see the module docstring for the model).

  `position_bias` and `sigma_top` are the top reviewer's fit to the real file
  (`calibrate_top_reviewer`); quality units are those of the abilities.
  """
  family: str = "default"         # "default" (sigma_r falls with ability) or "violated"
  num_questions: int = 80
  opponents: int = 4              # random opponents each model meets per question
  judge_probability: float = 0.85
  ability_spread: float = 0.5     # a_best - a_worst (see "Scale" in the module docstring)
  sigma_q: float = 0.5            # answer-quality noise per (question, model)
  position_bias: float = 0.525    # b, added to the first answer's side by every reviewer
  sigma_top: float = 0.717        # reviewer noise of the best model
  weak_noise_ratio: float = 6.0   # noise of the worst model / sigma_top (default family)
  self_preference: float = 0.25   # s, added to the reviewer's own answer
  tie_band: float = 0.05          # t: |d| <= t is a tie

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(f"family {self.family!r} is not one of {FAMILIES}")
    num_models = len(data_lib.true_order())
    if not 1 <= self.opponents <= num_models - 1:
      raise ValueError(f"opponents={self.opponents} must lie in [1, {num_models - 1}]")
    if not 0.0 < self.judge_probability <= 1.0:
      raise ValueError(f"judge_probability={self.judge_probability} must lie in (0, 1]")
    if self.num_questions < 1:
      raise ValueError(f"num_questions={self.num_questions} must be positive")
    for name in ("sigma_q", "sigma_top", "tie_band", "ability_spread"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be non-negative")
    if self.weak_noise_ratio < 1:
      raise ValueError(f"weak_noise_ratio={self.weak_noise_ratio} must be at least 1")

  @property
  def models(self) -> tuple[str, ...]:
    return data_lib.true_order()

  def abilities(self) -> np.ndarray:
    """[M] a_k, evenly spaced along the true order, best (index 0) highest."""
    return np.linspace(self.ability_spread / 2, -self.ability_spread / 2, len(self.models))

  def reviewer_noise(self) -> np.ndarray:
    """[M] sigma_r: linear in ability from sigma_top (best) to weak_noise_ratio * sigma_top."""
    abilities = self.abilities()
    weakness = (abilities[0] - abilities) / max(abilities[0] - abilities[-1], 1e-12)  # 0 .. 1
    noise = self.sigma_top * (1.0 + (self.weak_noise_ratio - 1.0) * weakness)
    if self.family == "violated":
      noise = np.full_like(noise, noise.mean())
    return noise


def expected_battles(spec: SimulationSpec) -> float:
  """The expected number of judged battles: questions x pairs per question x reviewers x p."""
  num_models = len(spec.models)
  # An unordered pair is drawn unless neither of its two models picked the other.
  unpicked = (1.0 - spec.opponents / (num_models - 1)) ** 2
  pairs_per_question = math.comb(num_models, 2) * (1.0 - unpicked)
  return spec.num_questions * pairs_per_question * num_models * spec.judge_probability


def _pairs(spec: SimulationSpec, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """[P] question, model_1 and model_2 of the deduplicated pairs, sorted by question."""
  rng = np.random.default_rng([seed, _PAIRS])
  num_models = len(spec.models)
  keys = rng.random((spec.num_questions, num_models, num_models))
  keys[:, np.arange(num_models), np.arange(num_models)] = np.inf  # nobody meets itself
  opponents = np.argsort(keys, axis=2)[:, :, :spec.opponents]     # [Q, M, opponents]
  question, model, _ = np.indices(opponents.shape)
  low = np.minimum(model, opponents).ravel()
  high = np.maximum(model, opponents).ravel()
  codes = np.unique((question.ravel() * num_models + low) * num_models + high)
  question, rest = np.divmod(codes, num_models * num_models)
  low, high = np.divmod(rest, num_models)
  # Which answer is model_1 (shown first in game 1) should not follow the model index.
  swap = rng.random(len(codes)) < 0.5
  return question, np.where(swap, high, low), np.where(swap, low, high)


def _quality(spec: SimulationSpec, seed: int) -> np.ndarray:
  """[Q, M] answer quality a_k + N(0, sigma_q^2)."""
  rng = np.random.default_rng([seed, _QUALITY])
  noise = rng.standard_normal((spec.num_questions, len(spec.models)))
  return spec.abilities()[None, :] + spec.sigma_q * noise


def _margin(quality: np.ndarray, question: np.ndarray, model_a: np.ndarray, model_b: np.ndarray,
            reviewer: np.ndarray, self_preference: float) -> np.ndarray:
  """[B] what model_a's answer is worth over model_b's to the reviewer, position aside."""
  own = (reviewer == model_a).astype(float) - (reviewer == model_b).astype(float)
  return quality[question, model_a] - quality[question, model_b] + self_preference * own


def _verdicts(margin: np.ndarray, bias: float | np.ndarray, sigma: float | np.ndarray,
              tie_band: float, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """[B] verdict codes of the two games, both in the original labels.

  `noise` is [2, B] standard normal. Game 1 shows model_a first, game 2 model_b first.
  """
  first_game = margin + bias + sigma * noise[0]       # > 0 favours model_a (shown first)
  second_game = -margin + bias + sigma * noise[1]     # > 0 favours model_b (shown first)
  g1 = np.where(first_game > tie_band, _MODEL_1,
                np.where(first_game < -tie_band, _MODEL_2, _TIE))
  g2 = np.where(second_game > tie_band, _MODEL_2,
                np.where(second_game < -tie_band, _MODEL_1, _TIE))
  return g1, g2


# model_1's score for every pair of verdict codes, from the official rule in battles.outcome.
_OUTCOME = np.array([[battles_lib.outcome(first, second) for second in battles_lib.VERDICTS]
                     for first in battles_lib.VERDICTS], np.float32)


def simulate_verdicts(spec: SimulationSpec, seed: int
                      ) -> tuple[battles_lib.Battles, np.ndarray, np.ndarray]:
  """`simulate` plus the [B] verdict codes of the two games (indices into battles.VERDICTS)."""
  question, model_a, model_b = _pairs(spec, seed)
  num_models = len(spec.models)
  judged = np.random.default_rng([seed, _JUDGING]).random((len(question), num_models))
  pair, reviewer = np.nonzero(judged < spec.judge_probability)   # sorted by pair, then reviewer
  question, model_a, model_b = question[pair], model_a[pair], model_b[pair]
  margin = _margin(_quality(spec, seed), question, model_a, model_b, reviewer,
                   spec.self_preference)
  noise = np.random.default_rng([seed, _NOISE]).standard_normal((2, len(pair)))
  g1, g2 = _verdicts(margin, spec.position_bias, spec.reviewer_noise()[reviewer], spec.tie_band,
                     noise)
  simulated = battles_lib.Battles(
      models=spec.models, model_a=model_a.astype(np.int32), model_b=model_b.astype(np.int32),
      reviewer=reviewer.astype(np.int32), score_a=_OUTCOME[g1, g2],
      question=question.astype(np.int32))
  return simulated, g1, g2


def simulate(spec: SimulationSpec, seed: int) -> battles_lib.Battles:
  """One simulated data set: every judged battle, `models` = `data.true_order()`, question ids
  0..num_questions-1. About 52,500 battles at the default size (`expected_battles`)."""
  return simulate_verdicts(spec, seed)[0]


def simulated_rates(spec: SimulationSpec, seed: int, reviewer: int = 0) -> dict[str, float]:
  """`data.double_verdict_rates` of one reviewer's simulated battles (as for the real file)."""
  if not 0 <= reviewer < len(spec.models):
    raise ValueError(f"reviewer {reviewer} is not a model index in [0, {len(spec.models)})")
  simulated, g1, g2 = simulate_verdicts(spec, seed)
  mine = simulated.reviewer == reviewer
  names = np.asarray(battles_lib.VERDICTS)
  return data_lib.double_verdict_rates(names[g1[mine]], names[g2[mine]])


def _expected_rates(margin: np.ndarray, bias: float, sigma: float, tie_band: float
                    ) -> tuple[float, float]:
  """(disagree, first_position) in expectation over the game noise, for the given margins.

  Given the margin the two games are independent, so each rate is a product of normal CDFs:
  smooth in (bias, sigma), unlike a Monte Carlo count, which a root finder needs.
  """
  first_wins_1 = scipy.special.ndtr((margin + bias - tie_band) / sigma)
  first_wins_2 = scipy.special.ndtr((-margin + bias - tie_band) / sigma)
  second_wins_1 = scipy.special.ndtr((-margin - bias - tie_band) / sigma)
  second_wins_2 = scipy.special.ndtr((margin - bias - tie_band) / sigma)
  first_both = np.mean(first_wins_1 * first_wins_2)
  second_both = np.mean(second_wins_1 * second_wins_2)
  return float(first_both + second_both), float(first_both)


def calibrate_top_reviewer(real_rates: dict[str, float], spec: SimulationSpec | None = None,
                           seed: int = 0, num_questions: int = 2000) -> tuple[float, float]:
  """(position bias b, noise sigma) of the top reviewer (index 0) matching `real_rates`.

  `real_rates` is `data.disagreement_rate()` of the real file ({"disagree", "first_position"}).
  The margins (quality difference plus self-preference) of reviewer 0's battles are drawn from
  `spec`'s design with `num_questions` questions (deterministic per seed); the rates are then
  their expectation over the game noise, solved for (b, sigma) by least squares in log space.
  """
  spec = spec or SimulationSpec()
  design = dataclasses.replace(spec, num_questions=num_questions)
  question, model_a, model_b = _pairs(design, seed)
  margin = _margin(_quality(design, seed), question, model_a, model_b,
                   np.zeros_like(question), spec.self_preference)
  target = np.array([real_rates["disagree"], real_rates["first_position"]])

  def residual(log_parameters):
    bias, sigma = np.exp(log_parameters)
    return np.array(_expected_rates(margin, bias, sigma, spec.tie_band)) - target

  start = np.log([max(spec.position_bias, 1e-3), max(spec.sigma_top, 1e-3)])
  fit = scipy.optimize.least_squares(residual, start, xtol=1e-12, ftol=1e-12)
  if np.max(np.abs(fit.fun)) > 1e-4:
    raise ValueError(f"no (bias, sigma) reaches the rates {real_rates} under this design; "
                     f"closest {dict(zip(('disagree', 'first_position'), fit.fun + target))}")
  bias, sigma = np.exp(fit.x)
  return float(bias), float(sigma)


def calibrated_spec(real_rates: dict[str, float] | None = None, **overrides) -> SimulationSpec:
  """A `SimulationSpec` (fields from `overrides`) with b and sigma_top fitted to `real_rates`
  (by default the real file's)."""
  spec = SimulationSpec(**overrides)
  bias, sigma = calibrate_top_reviewer(real_rates or data_lib.disagreement_rate(), spec)
  return dataclasses.replace(spec, position_bias=bias, sigma_top=sigma)
