"""experiments/corpus_stats.py: a row's median and 95th percentile are lengths that occur (nearest rank)."""

from experiments import corpus_stats


def test_a_row_counts_sums_and_takes_nearest_rank_percentiles():
  lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 35]  # median by interpolation would be 4.5, a length that never occurs
  assert corpus_stats.row("sotu", "test", "address", lengths) == [
      "sotu", "test", "address", "10", "71", "4", "35", "35"]
  assert corpus_stats.row("c", "s", "u", [1_500] * 3)[4:] == ["4,500", "1,500", "1,500", "1,500"]
