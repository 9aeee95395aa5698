"""metametrics.data and metrics: MQM aggregation equals the shipped scores, the splits, and the
metric wrappers against sacrebleu's corpus functions and hand cases."""
import numpy as np
import pytest
import sacrebleu

from jaxlab.methods.metametrics import data
from jaxlab.methods.metametrics import metrics


@pytest.mark.parametrize("pair", data.PAIRS)
def test_segment_scores_equal_the_shipped_avg_seg_scores(pair):
  scored = data.item_scores(data.read_error_rows(pair))
  shipped = {k: v for k, v in data.read_avg_seg_scores(pair).items() if v is not None}
  assert len(shipped) > 6877
  assert set(shipped) <= set(scored)
  worst = max(abs(scored[k][0] - v) for k, v in shipped.items())
  assert worst < 1e-9


def test_load_pair_keeps_the_candidates_and_strips_span_marks():
  items = data.load_pair("en-de")
  assert len(items) == 6877 and len(set(items.system)) == 13
  assert not set(items.system) & set(data.REFERENCE_SYSTEMS)
  assert not any("<v>" in h or "</v>" in h for h in items.hypothesis)
  assert np.unique(items.seg_id).size == 529 and np.all(items.mqm <= 0)
  # One reference per segment, the same for every system.
  for seg in np.unique(items.seg_id)[[0, 200, -1]]:
    assert len({r for r, s in zip(items.reference, items.seg_id) if s == seg}) == 1


def test_weights_of_error_rows():
  assert data.error_weight("Accuracy/Mistranslation", "Major") == 5
  assert data.error_weight("Fluency/Punctuation", "Minor") == 0.1
  assert data.error_weight("Style/Awkward", "Minor") == 1
  assert data.error_weight("Non-translation!", "Major") == 25
  assert data.error_weight("No-error", "No-error") == 0


def test_splits_never_share_a_source_segment_and_are_seeded():
  seg_ids = np.repeat(np.arange(1, 41), 13)
  train = data.split_by_source(seg_ids, seed=3)
  assert not set(seg_ids[train]) & set(seg_ids[~train])
  assert np.unique(seg_ids[train]).size == 20
  np.testing.assert_array_equal(train, data.split_by_source(seg_ids, seed=3))
  assert not np.array_equal(train, data.split_by_source(seg_ids, seed=4))
  with pytest.raises(ValueError, match="train_fraction"):
    data.split_by_source(seg_ids, seed=0, train_fraction=1.0)


SENTENCES = [("The cat sat on the mat today.", "The cat was sitting on the mat today."),
             ("Das ist ein kleiner Test mit Größe.", "Das ist ein großer Test mit Größe."),
             ("completely different words", "nothing in common here at all")]


@pytest.mark.parametrize("hyp,ref", SENTENCES)
def test_wrappers_equal_sacrebleu_corpus_functions_on_one_sentence(hyp, ref):
  raw = metrics.raw_scores([hyp], [ref], "en", ("bleu", "chrf", "chrf_pp", "ter"))
  bleu = sacrebleu.corpus_bleu([hyp], [[ref]], lowercase=True, tokenize="13a",
                               smooth_method="exp", use_effective_order=True)
  assert raw["bleu"][0] == pytest.approx(bleu.score, abs=1e-9)
  assert raw["chrf"][0] == pytest.approx(sacrebleu.corpus_chrf(
      [hyp], [[ref]], eps_smoothing=True).score, abs=1e-9)
  assert raw["chrf_pp"][0] == pytest.approx(sacrebleu.corpus_chrf(
      [hyp], [[ref]], word_order=2, eps_smoothing=True).score, abs=1e-9)
  assert raw["ter"][0] == pytest.approx(sacrebleu.corpus_ter([hyp], [[ref]]).score, abs=1e-9)


@pytest.mark.parametrize("lang", metrics.LANGUAGES)
def test_identical_strings_score_one_and_every_score_is_in_unit_interval(lang):
  text = "Die Größe des Hauses überrascht uns alle, sagte er." if lang == "de" else (
      "The size of the house surprises all of us, he said.")
  same = metrics.score_segments([text], [text], lang)
  assert set(same) == set(metrics.METRICS)
  for name, value in same.items():
    assert value[0] == pytest.approx(1.0), name
  hyps = [h for h, _ in SENTENCES] + ["", "x"]
  refs = [r for _, r in SENTENCES] + ["a reference", ""]
  for name, values in metrics.score_segments(hyps, refs, lang).items():
    assert np.all((values >= 0) & (values <= 1)), name


def test_german_rouge_keeps_umlauts():
  # The default rouge-score tokenizer reads "Größe" as "gr e": "Größe" and "Grüße" would match.
  scores = metrics.score_segments(["Größe"], ["Grüße"], "de", ("rouge1",))
  assert scores["rouge1"][0] == 0.0
  assert metrics.UnicodeWordTokenizer().tokenize("Die Größe, bitte!") == ["die", "größe", "bitte"]


def test_ter_is_inverted_and_clipped_at_100():
  raw = metrics.raw_scores(["a b c d e f"], ["x"], "en", ("ter",))["ter"]
  assert raw[0] > 100
  assert metrics.NORMALISERS["ter"](raw)[0] == 0.0
  assert metrics.NORMALISERS["ter"](np.asarray([25.0]))[0] == pytest.approx(0.75)


def test_length_agreement():
  assert metrics.length_agreement("a b", "a b c d") == 0.5
  assert metrics.length_agreement("", "") == 1.0
  assert metrics.length_agreement("", "a") == 0.0


def test_bad_inputs_fail_naming_the_argument():
  with pytest.raises(ValueError, match="same length"):
    metrics.score_segments(["a"], ["a", "b"], "en")
  with pytest.raises(ValueError, match="unknown metric 'bleurt'"):
    metrics.score_segments(["a"], ["a"], "en", ("bleu", "bleurt"))
  with pytest.raises(ValueError, match="lang"):
    metrics.score_segments(["a"], ["a"], "fr")
  with pytest.raises(TypeError, match=r"refs\[0\]"):
    metrics.score_segments(["a"], [None], "en")


def test_cache_computes_once(tmp_path):
  hyps, refs = ["the cat sat", "a dog"], ["the cat sat down", "the dog"]
  first, cached = metrics.cached_scores("t", hyps, refs, "en", cache_dir=tmp_path)
  assert not cached
  second, cached = metrics.cached_scores("t", hyps, refs, "en", cache_dir=tmp_path)
  assert cached
  for name in metrics.METRICS:
    np.testing.assert_array_equal(first[name], second[name])
  _, cached = metrics.cached_scores("t", hyps, ["other", "refs"], "en", cache_dir=tmp_path)
  assert not cached


def test_missing_extra_names_it():
  with pytest.raises(ImportError, match=r"'metametrics' extra.*\.\[metametrics\]"):
    metrics.require_extra("a_package_that_is_not_installed")
