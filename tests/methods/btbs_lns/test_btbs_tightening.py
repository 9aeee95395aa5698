"""btbs_lns.tightening and scoring: the binarized-tightening interval and the primal integral."""
import itertools

import numpy as np
import pytest

from jaxlab.methods.btbs_lns import scoring
from jaxlab.methods.btbs_lns import tightening


def test_bits_encode_the_offset_most_significant_first():
  np.testing.assert_array_equal(tightening.num_bits([0, 0, 5, 3], [1, 100, 5, 10]), [1, 7, 0, 3])
  bits = tightening.encode([1, 37, 5, 9], [0, 0, 5, 3], [1, 100, 5, 10])
  np.testing.assert_array_equal(bits[1], [0, 1, 0, 0, 1, 0, 1])        # 37 = 0b0100101
  np.testing.assert_array_equal(bits[3, :3], [1, 1, 0])                # 9 - 3 = 6 = 0b110
  assert bits[2].sum() == 0 and bits[0, 0] == 1


@pytest.mark.parametrize("lower, upper", [(0, 100), (3, 10), (-4, 4), (0, 1), (7, 8)])
def test_the_interval_holds_the_incumbent_with_the_stated_width(lower, upper):
  d = int(tightening.num_bits([lower], [upper])[0])
  for x in range(lower, upper + 1):
    for pattern in itertools.product([False, True], repeat=d):
      released = np.asarray([pattern])
      low, high = tightening.tightened_bounds([x], [lower], [upper], released)
      low, high = int(low[0]), int(high[0])
      assert lower <= low <= x <= high <= upper
      k = pattern.index(True) if any(pattern) else d
      assert high - low + 1 == min(2 ** (d - k), upper - low + 1)
      if not any(pattern):
        assert low == high == x
      if pattern and pattern[0]:
        assert (low, high) == (lower, upper)


def test_padding_bits_are_ignored():
  released = np.asarray([[False, False, True], [False, False, False]])
  low, high = tightening.tightened_bounds([1, 4], [0, 0], [1, 6], released)
  assert (low[0], high[0]) == (1, 1)        # a binary has one bit; bit 2 is padding
  assert (low[1], high[1]) == (4, 4)


def test_primal_gap_and_integral_on_a_hand_trace():
  assert scoring.primal_gap(None, 10.0) == 1.0
  assert scoring.primal_gap(12.0, 10.0) == pytest.approx(2 / 12)
  assert scoring.primal_gap(0.0, 0.0) == 0.0 and scoring.primal_gap(-1.0, 2.0) == 1.0
  # Gap 1 for 2 s, then 0.5 (obj 20 vs 10) for 3 s, then 0 for the last 5 s: (2 + 1.5) / 10.
  trace = [(5.0, 10.0), (2.0, 20.0)]
  assert scoring.primal_integral(trace, 10.0, 10.0) == pytest.approx(0.35)
  assert scoring.primal_integral([], 10.0, 4.0) == 1.0
  with pytest.raises(ValueError, match="time_limit"):
    scoring.primal_integral(trace, 10.0, 0.0)
