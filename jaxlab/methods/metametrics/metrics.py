"""Lexical base metrics that install and run offline, normalised to [0, 1] (higher = better).

sacrebleu gives sentence BLEU, chrF, chrF++ and TER; rouge-score gives ROUGE-1/2/L F1; length
agreement is min(h/r, r/h) in words. Each raw score is mapped to [0, 1] with a fixed
(min, max, invert, clip) `Normaliser`, as the official code maps each of its metrics. The neural
metrics the paper combines (BERTScore, COMET, BLEURT, MetricX, YiSi, GEMBA) need model weights or
an API; METEOR needs NLTK's WordNet download: none is here.

`score_segments(hyps, refs, lang)` is the public entry point; `pair_scores(items)` caches a
pair's scores on disk (`$JAXLAB_CACHE/metametrics`, else `~/.cache/jaxlab/metametrics`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import pathlib
import re
from typing import Callable, Mapping, Sequence

import numpy as np

EXTRA = "metametrics"
CACHE_ENV = "JAXLAB_CACHE"
# Bump when a metric's definition changes: cached scores of the old version are not reused.
CACHE_VERSION = 1
PROGRESS_CHUNK = 500


def require_extra(module: str):
  """Imports `module` from the `metametrics` extra, failing with the install command."""
  try:
    return importlib.import_module(module)
  except ImportError as error:
    raise ImportError(f"{module!r} is missing: metametrics needs the '{EXTRA}' extra; run "
                      f"`pip install -e \".[{EXTRA}]\"` (or `make install`)") from error


@dataclasses.dataclass(frozen=True)
class Normaliser:
  """Maps raw scores to [0, 1]: (x - min) / (max - min), then 1 - that if `invert`; `clip` clips
  to [min, max] first."""
  minimum: float
  maximum: float
  invert: bool = False
  clip: bool = True

  def __call__(self, raw: np.ndarray) -> np.ndarray:
    raw = np.asarray(raw, np.float64)
    if self.clip:
      raw = np.clip(raw, self.minimum, self.maximum)
    scaled = (raw - self.minimum) / (self.maximum - self.minimum)
    return 1.0 - scaled if self.invert else scaled


class UnicodeWordTokenizer:
  """rouge-score's default tokenizer keeps only [a-z0-9]: "Größe" would become "gr e". This one
  lowercases and keeps every Unicode word character."""

  def tokenize(self, text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _sacrebleu_metrics():
  sacrebleu_metrics = require_extra("sacrebleu.metrics")
  # Official settings: BLEU lowercased, 13a tokens, exp smoothing, effective order; chrF with the
  # official chrF++ script's epsilon smoothing (a missing n-gram order counts as 0).
  return {
      "bleu": sacrebleu_metrics.BLEU(lowercase=True, tokenize="13a", smooth_method="exp",
                                     effective_order=True),
      "chrf": sacrebleu_metrics.CHRF(word_order=0, eps_smoothing=True),
      "chrf_pp": sacrebleu_metrics.CHRF(word_order=2, eps_smoothing=True),
      "ter": sacrebleu_metrics.TER(),
  }


def _rouge_scorer(lang: str):
  rouge_scorer = require_extra("rouge_score.rouge_scorer")
  tokenizer = None if lang == "en" else UnicodeWordTokenizer()
  return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False,
                                  tokenizer=tokenizer)


def length_agreement(hypothesis: str, reference: str) -> float:
  """min(h/r, r/h) over whitespace word counts; 1 when both are empty, 0 when one is."""
  h, r = len(hypothesis.split()), len(reference.split())
  if h == 0 or r == 0:
    return float(h == r)
  return min(h / r, r / h)


NORMALISERS: dict[str, Normaliser] = {
    "bleu": Normaliser(0.0, 100.0),
    "chrf": Normaliser(0.0, 100.0),
    "chrf_pp": Normaliser(0.0, 100.0),
    "ter": Normaliser(0.0, 100.0, invert=True, clip=True),
    "rouge1": Normaliser(0.0, 1.0),
    "rouge2": Normaliser(0.0, 1.0),
    "rougeL": Normaliser(0.0, 1.0),
    "length": Normaliser(0.0, 1.0),
}
METRICS = tuple(NORMALISERS)
LANGUAGES = ("en", "de")


def _check_texts(hyps: Sequence[str], refs: Sequence[str], lang: str) -> None:
  if isinstance(hyps, str) or isinstance(refs, str):
    raise TypeError("hyps and refs must be sequences of strings, not one string")
  if len(hyps) != len(refs):
    raise ValueError(f"hyps and refs must have the same length; got {len(hyps)} hyps and "
                     f"{len(refs)} refs")
  if lang not in LANGUAGES:
    raise ValueError(f"lang must be one of {', '.join(LANGUAGES)} (the target language); "
                     f"got {lang!r}")
  for name, texts in (("hyps", hyps), ("refs", refs)):
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
      raise TypeError(f"{name}[{bad[0]}] is {type(texts[bad[0]]).__name__}, not str")


def raw_scores(hyps: Sequence[str], refs: Sequence[str], lang: str,
               metrics: Sequence[str] = METRICS,
               progress: Callable[[Sequence[range]], Sequence[range]] | None = None
               ) -> dict[str, np.ndarray]:
  """{metric: [N] raw score} (BLEU, chrF, TER in 0..100+; ROUGE, length in 0..1). `progress`
  wraps the list of chunks of `PROGRESS_CHUNK` items (a progress bar)."""
  _check_texts(hyps, refs, lang)
  unknown = [m for m in metrics if m not in NORMALISERS]
  if unknown:
    raise ValueError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
  sentence = _sacrebleu_metrics()
  scorer = _rouge_scorer(lang) if any(m.startswith("rouge") for m in metrics) else None
  out = {m: np.zeros(len(hyps)) for m in metrics}
  chunks = [range(start, min(start + PROGRESS_CHUNK, len(hyps)))
            for start in range(0, len(hyps), PROGRESS_CHUNK)]
  for chunk in (progress(chunks) if progress else chunks):
    for i in chunk:
      hyp, ref = hyps[i], refs[i]
      rouge = scorer.score(ref, hyp) if scorer else {}
      for m in metrics:
        if m in sentence:
          out[m][i] = sentence[m].sentence_score(hyp, [ref]).score
        elif m.startswith("rouge"):
          out[m][i] = rouge[m].fmeasure
        else:
          out[m][i] = length_agreement(hyp, ref)
  return out


def normalise(raw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {m: NORMALISERS[m](values) for m, values in raw.items()}


def score_segments(hyps: Sequence[str], refs: Sequence[str], lang: str,
                   metrics: Sequence[str] = METRICS) -> dict[str, np.ndarray]:
  """{metric: [N] score in [0, 1], higher = better} for each hypothesis against its reference;
  `lang` is the target language ("en" or "de")."""
  return normalise(raw_scores(hyps, refs, lang, metrics))


def cache_root(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  if cache_dir:
    return pathlib.Path(cache_dir)
  if os.environ.get(CACHE_ENV):
    return pathlib.Path(os.environ[CACHE_ENV]) / "metametrics"
  return pathlib.Path.home() / ".cache" / "jaxlab" / "metametrics"


def _texts_key(hyps: Sequence[str], refs: Sequence[str], lang: str,
               metrics: Sequence[str]) -> str:
  digest = hashlib.sha256(json.dumps([CACHE_VERSION, lang, list(metrics), list(hyps),
                                      list(refs)]).encode("utf-8"))
  return digest.hexdigest()[:16]


def cached_scores(name: str, hyps: Sequence[str], refs: Sequence[str], lang: str,
                  metrics: Sequence[str] = METRICS, cache_dir: str | os.PathLike | None = None,
                  progress: Callable[[Sequence[range]], Sequence[range]] | None = None
                  ) -> tuple[dict[str, np.ndarray], bool]:
  """`score_segments`, computed once and kept in `<cache>/<name>-<hash of texts>.npz`; returns
  the scores and whether they came from the cache."""
  path = cache_root(cache_dir) / f"{name}-{_texts_key(hyps, refs, lang, metrics)}.npz"
  if path.exists():
    with np.load(path) as stored:
      return {m: stored[m] for m in metrics}, True
  scores = normalise(raw_scores(hyps, refs, lang, metrics, progress=progress))
  path.parent.mkdir(parents=True, exist_ok=True)
  temporary = path.with_suffix(".tmp.npz")
  np.savez(temporary, **scores)
  os.replace(temporary, path)
  return scores, False
