"""The plateau rule: when a run has stopped improving on an evaluated metric.

At an evaluation step ``S``, the metric's smoothed value ``v(S)`` is the mean
of its ``smoothing`` latest evaluations at steps <= ``S``. The gain over the
last ``window`` of the steps is ``v(S) - v((1 - window) S)``, sign-flipped
for a metric where lower is better (loss, perplexity). The rule holds at
``S`` when ``S >= min_steps`` and the gain is below ``min_gain``.

The config keys ``plateau_metric`` (None: train to ``num_train_steps``),
``plateau_min_steps``, ``plateau_window``, ``plateau_min_gain`` and
``plateau_smoothing`` set it (configs/base.py); the run config's budget
section builds it (:meth:`rpr.config.Budget.plateau_rule`), so this module
knows the rule, not the config.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

# Metric names by their last part: which way is better.
HIGHER = ("bleu", "chrf", "accuracy", "exact_match")
LOWER = ("loss", "perplexity")


def higher_is_better(metric: str) -> bool:
  """``validation/bleu`` -> True, ``validation/perplexity`` -> False; ValueError for another name."""
  name = metric.rsplit("/", 1)[-1]
  if name in HIGHER:
    return True
  if name in LOWER:
    return False
  raise ValueError(f"plateau metric {metric!r}: allowed: '<split>/<name>' with name in {list(HIGHER + LOWER)}")


@dataclasses.dataclass(frozen=True)
class Rule:
  metric: str  # e.g. "validation/bleu"
  min_steps: int  # never stop before this step
  window: float  # the fraction of the steps the gain is measured over, in (0, 1)
  min_gain: float  # stop when the smoothed metric gained less than this over the window
  smoothing: int = 1  # evaluations averaged into one smoothed value

  def smoothed(self, curve: Sequence[tuple[int, float]], step: float) -> Optional[float]:
    """Mean of the ``smoothing`` latest values at steps <= ``step``; None when there are fewer."""
    values = [v for s, v in sorted(curve) if s <= step][-self.smoothing:]
    return sum(values) / len(values) if len(values) == self.smoothing else None

  def gain(self, curve: Sequence[tuple[int, float]], step: int) -> Optional[float]:
    """The smoothed improvement over the last ``window`` of the steps up to ``step``; None if not yet defined."""
    now, before = self.smoothed(curve, step), self.smoothed(curve, (1.0 - self.window) * step)
    if now is None or before is None:
      return None
    return now - before if higher_is_better(self.metric) else before - now

  def judge(self, records: Sequence[dict], step: int, value: Optional[float] = None) -> tuple[Optional[float], bool]:
    """``(gain, reached)`` at ``step`` from the metrics records, and ``value``: the metric just evaluated there."""
    points = curve(records, self.metric) + ([(step, value)] if value is not None else [])
    return self.gain(points, step), self.reached(points, step)

  def reached(self, curve: Sequence[tuple[int, float]], step: int) -> bool:
    """Whether the run has stopped improving at ``step``; never at a step ``curve`` has no evaluation at.

    Between evaluations the window's start can pass an older evaluation
    while its end stays, so the gain there is not the one the rule was
    fixed on (a run resumed at a step saved by a signal).
    """
    if step not in {s for s, _ in curve}:
      return False
    gain = self.gain(curve, step)
    return step >= self.min_steps and gain is not None and gain < self.min_gain

  def describe(self, records: Sequence[dict]) -> str:
    """The metric's latest value and the rule's gain there, beside what stops the run (``sweep --print``)."""
    points = curve(records, self.metric)
    if not points:
      return f"no {self.metric} yet"
    step, value = points[-1]
    gain = self.gain(points, step)
    means = f"(means of {self.smoothing} evaluations) " if self.smoothing > 1 else ""
    return (f"{self.metric} {value:.2f} at step {step:,}, gained "
            f"{'(not yet measured)' if gain is None else f'{gain:.2f}'} over the last {self.window:.0%} of the steps "
            f"{means}(the rule stops it at a step >= {self.min_steps:,} with a gain under {self.min_gain:g})")


def curve(records: Sequence[dict], metric: str) -> list[tuple[int, float]]:
  """``(step, value)`` of every record that holds ``metric`` (metrics.jsonl records)."""
  return [(int(r["step"]), float(r[metric])) for r in records if metric in r]
