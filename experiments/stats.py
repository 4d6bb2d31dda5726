"""The protocol's statistics (experiments/results/protocol.md): every number comes from scipy, statsmodels or sacrebleu.

Per cell, over its seeds: n, mean, SD and the 95% CI of the mean (Student's t).
Per comparison of a cell with its table's reference row: the difference of
means with Welch's 95% CI and p-value, the p-values Holm-corrected within the
table, and the minimum detectable effect of that same test (Welch's, 80% power,
two-sided, at the first Holm step's level alpha / m). Over the test set:
sacrebleu's paired bootstrap between two runs' decoded outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats
from statsmodels.stats import multitest
from statsmodels.stats import power as sm_power

ALPHA = 0.05
POWER = 0.8
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Cell:
  """One cell over its seeds; ``sd``, ``low`` and ``high`` are NaN with fewer than 2 seeds."""
  n: int
  mean: float
  sd: float
  low: float
  high: float


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A cell against the reference row: ``diff`` = cell - reference, with Welch's CI, raw and Holm p, and the MDE."""
  diff: float
  low: float
  high: float
  p: float
  p_holm: float
  mde: float
  verdict: str


def cell(values: Sequence[float]) -> Cell:
  v = np.asarray(values, dtype=np.float64)
  if v.size == 0:
    raise ValueError("a cell needs at least one value")
  mean = float(v.mean())
  if v.size < 2:
    return Cell(1, mean, math.nan, math.nan, math.nan)
  sd = float(v.std(ddof=1))
  low, high = scipy_stats.t.interval(CONFIDENCE, v.size - 1, loc=mean, scale=sd / math.sqrt(v.size))
  return Cell(int(v.size), mean, sd, float(low), float(high))


def pooled_sd(*groups: Sequence[float]) -> float:
  """The within-group SD pooled over ``groups`` (each of 2 or more values)."""
  return math.sqrt(sum((len(v) - 1) * np.var(v, ddof=1) for v in groups) / sum(len(v) - 1 for v in groups))


def mde(values: Sequence[float], reference: Sequence[float], alpha: float) -> float:
  """The difference Welch's two-sided test on these seeds detects with 80% power at ``alpha``.

  statsmodels' two-sample power at Welch's degrees of freedom, with the SD that makes its noncentrality Welch's
  (``se / sqrt(1/n1 + 1/n2)``, ``se`` Welch's standard error): with equal counts and spreads it is the pooled
  t-test's MDE; with unequal spreads it grows as Welch's test loses power, so a "not separated" verdict never sits
  beside an MDE smaller than its own difference.
  """
  n1, n2 = len(values), len(reference)
  se = math.sqrt(np.var(values, ddof=1) / n1 + np.var(reference, ddof=1) / n2)
  df = scipy_stats.ttest_ind(values, reference, equal_var=False).df
  # One tail at alpha / 2: the other tail adds under 1e-5 of power at 80% (scipy's noncentral t can return NaN
  # there on one or two degrees of freedom).
  power = functools.partial(sm_power.TTestIndPower().power, nobs1=n1, alpha=alpha / 2, ratio=n2 / n1, df=df,
                            alternative="larger")
  high = 1.0
  while power(high) < POWER:
    high *= 2
  effect = optimize.brentq(lambda d: power(d) - POWER, 0.0, high)
  return float(effect) * se / math.sqrt(1 / n1 + 1 / n2)


def compare(reference: Sequence[float], cells: Mapping[str, Sequence[float]], reference_name: str = "reference",
            alpha: float = ALPHA) -> dict[str, Comparison]:
  """Each of ``cells`` against ``reference``, Holm-corrected over the cells that both have 2 or more seeds.

  A verdict is ``"<cell> > <reference>"`` or ``"<cell> < <reference>"`` when the Holm-adjusted p < ``alpha``,
  else ``"not separated"`` (read it with the MDE beside it); a cell with fewer than 2 seeds, or with no spread
  in either group, is ``"not tested"``.
  """
  tested, out = {}, {}
  for name, values in cells.items():
    if len(values) < 2 or len(reference) < 2 or pooled_sd(values, reference) == 0:
      out[name] = Comparison(float(np.mean(values) - np.mean(reference)), math.nan, math.nan, math.nan, math.nan,
                             math.nan, "not tested")
      continue
    result = scipy_stats.ttest_ind(values, reference, equal_var=False)
    ci = result.confidence_interval(CONFIDENCE)
    tested[name] = (float(np.mean(values) - np.mean(reference)), float(ci.low), float(ci.high), float(result.pvalue))
  if tested:
    _, adjusted, _, _ = multitest.multipletests([t[3] for t in tested.values()], alpha=alpha, method="holm")
    first_step = alpha / len(tested)
    for (name, (diff, low, high, p)), p_holm in zip(tested.items(), adjusted):
      m = mde(cells[name], reference, first_step)
      verdict = (f"{name} {'>' if diff > 0 else '<'} {reference_name}" if p_holm < alpha else "not separated")
      out[name] = Comparison(diff, low, high, p, float(p_holm), m, verdict)
  return {name: out[name] for name in cells}


def paired_bootstrap(references: Sequence[str], baseline: Sequence[str], system: Sequence[str],
                     resamples: int = 1000) -> float:
  """sacrebleu's paired bootstrap p-value of ``system`` against ``baseline`` on one test set (BLEU, 13a)."""
  from sacrebleu.metrics import BLEU
  from sacrebleu.significance import PairedTest

  if not len(references) == len(baseline) == len(system):
    raise ValueError(f"the outputs differ in length: {len(references)} references, {len(baseline)} and "
                     f"{len(system)} hypotheses")
  _, scores = PairedTest([("baseline", list(baseline)), ("system", list(system))], {"BLEU": BLEU()},
                         [list(references)], test_type="bs", n_samples=resamples)()
  return float(scores["BLEU"][1].p_value)


@dataclasses.dataclass(frozen=True)
class BudgetStep:
  """The budget rule for one budget against the next larger: each cell's mean at both, and the pooled SD there."""
  budget: int
  larger: int
  means: dict  # cell -> (mean at budget, mean at larger)
  sd: float  # the pooled within-cell SD of the larger budget's runs
  within: bool  # every cell's mean within one SD of its mean at the larger budget


def budget_rule(values: Mapping[int, Mapping[str, Sequence[float]]]) -> tuple[list[BudgetStep], Optional[int]]:
  """The protocol's budget rule: the smallest budget at which, for every cell, the mean final value is within one
  between-seed SD of the next larger budget's mean (SD pooled within cells over the larger budget's runs).

  Args:
    values: budget -> cell -> the final values of its seeds. A budget pair is judged once both budgets have at
      least 2 seeds of every cell.
  Returns:
    (each judged pair, the chosen budget): the smallest that holds; the largest once every pair is judged and
    none holds (the protocol stops there); None while no judged pair holds and a pair waits for seeds.
  """
  steps, budgets = [], sorted(values)
  for small, large in zip(budgets, budgets[1:]):
    cells = sorted(set(values[small]) | set(values[large]))
    if any(len(values[b].get(c, ())) < 2 for b in (small, large) for c in cells):
      continue
    sd = pooled_sd(*(values[large][c] for c in cells))
    means = {c: (float(np.mean(values[small][c])), float(np.mean(values[large][c]))) for c in cells}
    steps.append(BudgetStep(small, large, means, sd, all(abs(a - b) <= sd for a, b in means.values())))
  held = next((s.budget for s in steps if s.within), None)
  return steps, held if held or len(steps) < len(budgets) - 1 else budgets[-1]
