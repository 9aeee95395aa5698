"""Side-by-side timing: rows read seconds per unit of work from steps/s, the ratio per round."""
from benchmarks import common


def test_seconds_row_inverts_rates_and_takes_the_median_of_per_round_ratios():
  result = common.SideBySide(ours=[4.0, 5.0, 6.0, 5.0, 5.0], official=[1.0, 2.0, 2.0, 1.0, 2.0],
                             loads=[1.25, 1.5, 1.0, 1.5, 1.25, 1.5, 1.5, 1.0, 1.5, 1.5])
  # Per-round ratios 4, 2.5, 3, 5, 2.5: median 3 (not 5 / 2 from the medians of each side).
  assert result.ratio == 3.0
  assert result.seconds_row("jvf", 1000) == "| jvf | 200.0 | 500.0 | 3.0x | 1.0-1.5 |\n"
  assert result.seconds_row("nst", 1, digits=(3, 2)) == "| nst | 0.200 | 0.50 | 3.0x | 1.0-1.5 |\n"
