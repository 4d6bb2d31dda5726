"""The protocol's statistics against values known from the textbooks and against cases whose answer is clear."""

import math

import numpy as np
import pytest

from experiments import stats


def test_cell_ci_is_student_t():
  c = stats.cell([20.0, 21.0, 22.0, 23.0, 24.0])
  # mean 22, SD sqrt(2.5), t(0.975, 4) = 2.7764 (a printed table value)
  half = 2.7764 * math.sqrt(2.5) / math.sqrt(5)
  assert (c.n, c.mean) == (5, 22.0)
  assert c.sd == pytest.approx(math.sqrt(2.5))
  assert (c.low, c.high) == pytest.approx((22 - half, 22 + half), abs=1e-3)


def test_one_seed_has_no_spread_and_is_not_tested():
  c = stats.cell([20.0])
  assert c.n == 1 and math.isnan(c.sd) and math.isnan(c.low)
  out = stats.compare([1.0, 2.0, 3.0], {"one": [5.0]})
  assert out["one"].verdict == "not tested" and out["one"].diff == pytest.approx(3.0)


def test_clear_difference_is_separated_with_its_sign():
  reference = [20.0, 20.2, 19.9, 20.1, 19.8]
  out = stats.compare(reference, {"better": [x + 3 for x in reference], "worse": [x - 3 for x in reference]},
                      reference_name="sinusoidal")
  assert out["better"].verdict == "better > sinusoidal" and out["worse"].verdict == "worse < sinusoidal"
  assert out["better"].low < 3.0 < out["better"].high
  assert out["better"].p_holm < 0.05


def test_holm_within_the_table():
  reference = [0.0, 1.0, 2.0, 3.0, 4.0]
  cells = {"a": [1.5, 2.5, 3.5, 4.5, 5.5], "b": [3.0, 4.0, 5.0, 6.0, 7.0], "c": [0.2, 1.2, 2.2, 3.2, 4.2]}
  out = stats.compare(reference, cells)
  ps = sorted((c.p, c.p_holm) for c in out.values())
  m = len(ps)
  # Holm: the smallest p is multiplied by m, the next by m - 1 (and kept monotone), capped at 1
  assert ps[0][1] == pytest.approx(min(1.0, m * ps[0][0]))
  assert ps[1][1] == pytest.approx(min(1.0, max(m * ps[0][0], (m - 1) * ps[1][0])))
  assert all(adj >= raw for raw, adj in ps)


def test_mde_matches_the_power_table_and_shrinks_with_seeds():
  unit = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) / math.sqrt(2.5)  # SD 1
  # Two groups of 5 with equal spreads at alpha 0.05, power 0.8: Welch's test is the pooled one, and the MDE is
  # Cohen's d of about 2.02 SDs (noncentral t, not the normal's 1.77)
  assert stats.mde(unit, unit + 10, alpha=0.05) == pytest.approx(2.02, abs=0.01)
  ten = np.concatenate([unit, unit]) * math.sqrt(9 / 8)  # 10 values, SD 1 again
  assert np.std(ten, ddof=1) == pytest.approx(1.0)
  assert stats.mde(ten, ten, alpha=0.05) < stats.mde(unit, unit, alpha=0.05)
  assert stats.mde(unit, unit, alpha=0.05 / 4) > stats.mde(unit, unit, alpha=0.05)


def test_mde_is_welchs_so_unequal_spreads_on_few_seeds_raise_it():
  # The translation pilot at 4,000 steps (test BLEU): two seeds each, spreads 0.74 and 0.03. Welch's test has
  # about 1 degree of freedom there, so a difference of 3.96 is not separated; the MDE must say more than that.
  shaw, sinusoidal = [20.066, 21.118], [16.648, 16.612]
  out = stats.compare(sinusoidal, {"shaw": shaw})["shaw"]
  assert out.verdict == "not separated"
  assert out.mde > abs(out.diff) == pytest.approx(3.96, abs=0.01)


def test_not_separated_always_sits_beside_an_mde_above_its_difference():
  # If |diff| reached the MDE at a level, Welch's test would pass that level; compare() sets the MDE at the first
  # Holm step's level (alpha / m), the strictest, so no cell Holm leaves "not separated" can differ by the MDE.
  from scipy import stats as scipy_stats

  rng, near = np.random.default_rng(0), 0
  for _ in range(200):
    n, m = rng.integers(2, 7, size=2)
    a, b = rng.normal(rng.normal(0, 1.5), rng.uniform(0.1, 2), n), rng.normal(0, rng.uniform(0.1, 2), m)
    alpha = 0.05 / rng.integers(1, 8)
    p, diff, mde = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue, abs(a.mean() - b.mean()), stats.mde(a, b, alpha)
    assert p < alpha or diff < mde, (p, alpha, diff, mde)
    near += p >= alpha and diff > mde / 2
  assert near >= 15  # differences of the MDE's size that were not separated: the property is exercised near its edge
  out = stats.compare([20.0, 21.5, 19.0, 20.7, 19.6], {"a": [21.1, 20.2, 22.0, 21.1, 21.6], "b": [20.3, 19.2, 21.0]})
  assert all(c.mde > abs(c.diff) for c in out.values() if c.verdict == "not separated")


def test_not_separated_carries_an_mde_larger_than_the_difference():
  reference = [20.0, 21.5, 19.0, 20.7, 19.6]
  out = stats.compare(reference, {"same": [20.3, 19.2, 21.0, 20.1, 20.6]})["same"]
  assert out.verdict == "not separated"
  assert out.mde > abs(out.diff) > 0


def test_paired_bootstrap_on_decoded_outputs():
  references = [f"the cat number {i} sat on the mat today" for i in range(60)]
  good = list(references)
  bad = [f"a dog {i} stood" for i in range(60)]
  assert stats.paired_bootstrap(references, bad, good, resamples=200) < 0.05
  # Two systems each wrong on a different tenth of the sentences: no difference to find. (A system against
  # itself is no case: sacrebleu's p is then 1 / (resamples + 1) by construction.)
  one = [("a dog stood" if i < 6 else r) for i, r in enumerate(references)]
  other = [("a dog stood" if 6 <= i < 12 else r) for i, r in enumerate(references)]
  assert stats.paired_bootstrap(references, one, other, resamples=200) > 0.2
  with pytest.raises(ValueError, match="differ in length"):
    stats.paired_bootstrap(references, good[:-1], good)


def test_the_budget_rule_picks_the_smallest_budget_within_one_pooled_sd_of_the_next_for_every_cell():
  values = {4000: {"shaw": [14.5, 15.4], "sin": [11.6, 11.7]}, 8000: {"shaw": [19.9, 19.5], "sin": [16.0, 16.6]},
            16000: {"shaw": [20.0, 19.6], "sin": [16.2, 16.4]}, 32000: {"shaw": [20.1], "sin": []}}
  steps, chosen = stats.budget_rule(values)
  assert [(s.budget, s.larger) for s in steps] == [(4000, 8000), (8000, 16000)]  # 32,000 has < 2 seeds a cell
  sd = math.sqrt((np.var([20.0, 19.6], ddof=1) + np.var([16.2, 16.4], ddof=1)) / 2)  # equal seeds: mean variance
  assert steps[1].sd == pytest.approx(sd) and steps[1].means["sin"] == pytest.approx((16.3, 16.3))
  assert [s.within for s in steps] == [False, True] and chosen == 8000  # shaw 19.7 vs 19.8, sin 16.3 vs 16.3
  values[16000]["sin"] = [17.0, 17.2]  # sinusoidal still gains 0.8, more than the SD (0.2): the rule fails
  assert stats.budget_rule(values) == (stats.budget_rule(values)[0], None)
  assert not stats.budget_rule(values)[0][1].within
  values[32000] = {"shaw": [21.0, 21.1], "sin": [18.0, 18.1]}  # every pair judged, none holds: the largest
  steps, chosen = stats.budget_rule(values)
  assert [s.within for s in steps] == [False, False, False] and chosen == 32000
