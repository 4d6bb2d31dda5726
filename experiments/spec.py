"""What a report shows, as a typed object: :class:`ReportSpec`.

A sweep declares its report as one (``experiments/sweeps.py``), ``python -m
experiments.report`` builds one from its flags, and :meth:`ReportSpec.args`
gives the flags back: each field is the flag of the same name, in field
order, so a spec and its command line are one thing.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class ReportSpec:
  """The report of a set of runs (``experiments.tabulate.write_report``).

  Attributes:
    metric: ``<split>/<metric>`` in metrics.jsonl, one value per run (its last); required unless ``by_length``.
    x: a numeric config key to order the groups by and to plot the metric against.
    also: more metrics of the same groups, a column each in a second table.
    curve: metrics drawn in order as one line per group (``curve.png``).
    steps: metrics drawn against the training step, one line per run, unfinished runs included
      (``learning_curves.png``, ``experiments.learning_curves``).
    shorter: globs of runs of the same cells at a shorter budget, set beside each group (``experiments.budgets``).
    judge: more metrics on which the pairs of groups are judged at both budgets, each against its own noise floor
      (``experiments.budgets``; needs ``shorter``).
    paper: Shaw et al.'s table whose number is set beside each group (``experiments.paper``).
    bound: arithmetic views (``bag``, ``reversal``) each group is held to (the ceiling column).
    target: a value every run of every unbounded group must reach (a check).
    attention: encoder attention maps of each group's lowest-seed checkpoint.
    by_length: exact match per input length instead of ``metric``.
    title: the plots' title (default: the metric).
  """
  metric: Optional[str] = None
  x: Optional[str] = None
  also: tuple[str, ...] = ()
  curve: tuple[str, ...] = ()
  steps: tuple[str, ...] = ()
  shorter: tuple[str, ...] = ()
  judge: tuple[str, ...] = ()
  paper: Optional[str] = None
  bound: tuple[str, ...] = ()
  target: Optional[float] = None
  attention: bool = False
  by_length: bool = False
  title: Optional[str] = None

  def __post_init__(self):
    for name in ("also", "curve", "steps", "shorter", "judge", "bound"):  # one string is one item; flags give lists
      value = getattr(self, name)
      object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value or ()))
    if not (self.metric or self.by_length):
      raise ValueError("--metric is required (or --by_length)")

  def args(self) -> tuple[str, ...]:
    """The flags of ``python -m experiments.report`` that make this spec, in field order.

    A repeated field repeats its flag (``--also a --also b``), a true bool is the bare flag, and an unset
    field (None, empty, False) is left out.
    """
    words = []
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, bool):
        words += [f"--{field.name}"] if value else []
      elif isinstance(value, tuple):
        words += [w for v in value for w in (f"--{field.name}", str(v))]
      elif value is not None:
        words += [f"--{field.name}", str(value)]
    return tuple(words)

  def set_fields(self) -> list[str]:
    """The names of the fields that differ from their defaults."""
    return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]
