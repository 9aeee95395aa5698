"""pico data and metrics: the real file, the official logs, the metrics against brute force."""
import itertools
import math

import numpy as np
import pytest

from jaxlab.methods.pico import battles
from jaxlab.methods.pico import data
from jaxlab.methods.pico import metrics


@pytest.fixture(scope="module")
def logs():
  return data.official_logs()


@pytest.fixture(scope="module")
def records():
  return data.read_jsonl(data.REAL_FILE)


def test_true_order_is_the_official_model_list():
  order = data.true_order()
  assert len(order) == len(set(order)) == 15
  assert order[0] == "gpt-3.5-turbo" and order[-1] == "llama-13b"


def test_all_sixteen_logs_parse_and_their_cin_and_lis_match(logs):
  assert len(logs) == 16
  assert {log["method"] for log in logs.values()} == {"Peer_review", "Uniform", "Order", "Reversed"}
  for stem, log in logs.items():
    assert sorted(log["order"]) == list(range(15)), stem
    assert metrics.inversions(log["order"]) == log["cin"], stem
    assert metrics.longest_increasing_subsequence(log["order"]) == log["lis"], stem
  assert all(log["num_blocks"] == (2 if log["method"] == "Reversed" else 1)
             for log in logs.values())


def test_headline_log_values(logs):
  """The issue's numbers: PiCO CIN 17 / LIS 8, Uniform 22 / 7; PiCO took 7 min 15 s."""
  pico, uniform = logs["frac1_Peer_review_seed4"], logs["frac1_Uniform_seed4"]
  assert (pico["cin"], pico["lis"], uniform["cin"], uniform["lis"]) == (17, 8, 22, 7)
  assert pico["seconds"] == pytest.approx(7 * 60 + 15, abs=1)
  assert pico["ranking"][0] == "WizardLM-13B-V1.2" and pico["order"][0] == 3


def test_logged_entropies_are_in_nats(logs):
  """The consecutive-window entropy reproduces the logs exactly in nats; the logged random-triple
  entropy scatters around the exact all-triples value by sampling noise only."""
  for stem, log in logs.items():
    assert metrics.permutation_entropy_consecutive(log["order"]) == pytest.approx(
        log["pen_consecutive"], abs=1e-12), stem
  gaps = [metrics.permutation_entropy(log["order"]) - log["pen_random"] for log in logs.values()]
  assert max(map(abs, gaps)) < 0.1 and abs(np.mean(gaps)) < 0.03


def brute_force_entropy(order, n):
  """Entropy over all position subsets, each pattern encoded by its pairwise comparisons."""
  counts = {}
  for positions in itertools.combinations(range(len(order)), n):
    values = [order[p] for p in positions]
    pattern = tuple(values[i] < values[j] for i, j in itertools.combinations(range(n), 2))
    counts[pattern] = counts.get(pattern, 0) + 1
  total = sum(counts.values())
  return -sum(c / total * math.log(c / total) for c in counts.values())


def test_entropy_is_zero_for_the_identity_and_matches_brute_force():
  assert metrics.permutation_entropy(np.arange(15)) == 0.0
  assert metrics.permutation_entropy_sampled(np.arange(15), seed=0) == 0.0
  rng = np.random.default_rng(0)
  for size, n in ((5, 3), (7, 3), (8, 4), (15, 3)):
    order = rng.permutation(size)
    assert metrics.permutation_entropy(order, n=n) == pytest.approx(
        brute_force_entropy(order.tolist(), n), abs=1e-12)
  assert metrics.permutation_entropy([1, 0, 2]) == 0.0  # one triple, one pattern
  # By hand: triples 021 (low-high-mid), 023 and 013 (increasing), 213 (mid-low-high).
  assert metrics.permutation_entropy([0, 2, 1, 3]) == pytest.approx(
      -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))


def test_sampled_entropy_is_seeded_and_estimates_the_exact_one():
  order = np.random.default_rng(1).permutation(15)
  first = metrics.permutation_entropy_sampled(order, seed=3)
  assert first == metrics.permutation_entropy_sampled(order, seed=3)
  assert first != metrics.permutation_entropy_sampled(order, seed=4)
  many = metrics.permutation_entropy_sampled(order, seed=3, num_samples=200_000)
  assert many == pytest.approx(metrics.permutation_entropy(order), abs=0.01)


def test_rank_correlations_and_counts_agree_with_their_formulas():
  rng = np.random.default_rng(2)
  for _ in range(20):
    order = rng.permutation(9)
    size = order.size
    cin = sum(order[i] > order[j] for i, j in itertools.combinations(range(size), 2))
    assert metrics.inversions(order) == cin
    assert metrics.kendall(order) == pytest.approx(1 - 4 * cin / (size * (size - 1)))
    squared = np.sum((order - np.arange(size)) ** 2)
    assert metrics.spearman(order) == pytest.approx(1 - 6 * squared / (size * (size**2 - 1)))
    lis = max(len(s) for k in range(1, size + 1) for s in itertools.combinations(order, k)
              if all(a < b for a, b in zip(s, s[1:])))
    assert metrics.longest_increasing_subsequence(order) == lis
  assert metrics.all_metrics(np.arange(15)) == {"spearman": 1.0, "kendall": 1.0, "pen": 0.0,
                                                "cin": 0, "lis": 15}
  reverse = metrics.all_metrics(np.arange(15)[::-1])
  assert (reverse["spearman"], reverse["cin"], reverse["lis"]) == (-1.0, 105, 1)


def test_orders_must_be_permutations():
  for bad in ([0, 0, 1], [1, 2, 3], [[0, 1], [1, 0]], [0.5, 1, 0]):
    with pytest.raises(ValueError):
      metrics.all_metrics(bad)


def test_the_real_file_parses_to_3291_battles_of_15_models():
  real = data.load_real()
  assert real.models == data.true_order()
  assert real.num_battles == 3291 and real.num_models == 15
  assert set(real.reviewer.tolist()) == {0}  # gpt-3.5-turbo, the top model, judges alone
  assert set(np.unique(real.score_a).tolist()) == {0.0, 0.5, 1.0}
  assert np.all(real.model_a != real.model_b)


def test_bad_records_raise_naming_the_culprit(records):
  models = data.true_order()
  bad_verdict = [dict(records[0], g2_winner="model_3")] + records[1:]
  with pytest.raises(ValueError, match="model_3"):
    battles.from_records(bad_verdict, models)
  unknown_judge = [dict(records[0], judge=["claude-3", "pair-v2"])] + records[1:]
  with pytest.raises(ValueError, match="claude-3"):
    battles.from_records(unknown_judge, models)
  no_llama = [r for r in records if "llama-13b" not in (r["model_1"], r["model_2"])]
  with pytest.raises(ValueError, match="llama-13b"):
    battles.from_records(no_llama, models)


def test_disagreement_rates_of_the_real_file(records):
  rates = data.disagreement_rate(records)
  assert rates == data.disagreement_rate()  # the default reads the same file
  assert rates["disagree"] == pytest.approx(0.42, abs=0.005)         # 1375 / 3291
  assert rates["first_position"] == pytest.approx(0.39, abs=0.005)   # 1286 / 3291
  assert rates["disagree"] == pytest.approx(1375 / 3291)
  with pytest.raises(TypeError, match="raw verdicts"):
    data.disagreement_rate(data.load_real())
