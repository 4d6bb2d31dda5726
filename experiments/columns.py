"""Report columns and sections: each one registered function, found by the report at write time.

A column is a function of one group (``experiments.runs.Group``) and the
report being written (:class:`Report`), registered with :func:`column`::

  @columns.column("median", header="median", csv="median", text=columns.metric_digits)
  def median(group, report):
    return float(np.median(group.values))

Every registered column is in ``results.csv`` (if it names a CSV header) and
in the Markdown table of every report where its ``shown`` holds, ordered by
``order``; its value per group is kept in ``group.cells``, and under
``record`` in ``runs.json``. A section is a function of the report that
returns Markdown lines after the tables (:func:`section`). An experiment
registers its own columns and sections in its own module (the arithmetic
bounds: ``experiments/arithmetic.py``); this module holds the generic ones,
in this order: variant 0, x 5 (CSV only), runs 10, step 20, mean 30, std 40,
min 50, max 60, per seed 70, (default 80), train minutes 90, paper 100.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np

from experiments import paper
from experiments import render
from experiments import runs as runs_lib


@dataclasses.dataclass
class Report:
  """A report being written: what every column and section sees.

  Attributes:
    spec: what the report shows.
    runs: every run read, the unfinished ones included.
    groups: the groups of runs that hold ``spec.metric``, in table order.
    out: the output directory (columns may cache files there).
    cache: values a column computes once per report (e.g. bounds).
  """
  spec: Any  # experiments.report.ReportSpec
  runs: list[runs_lib.RunRecord]
  groups: list[runs_lib.Group]
  out: str
  cache: dict = dataclasses.field(default_factory=dict)

  @property
  def digits(self) -> int:
    """Decimals of the metric's cells: 4 for values in [-1, 1] (accuracies), else 2."""
    return 4 if all(abs(g.stats["max"]) <= 1 for g in self.groups) else 2


Value = Callable[[runs_lib.Group, Report], Any]


@dataclasses.dataclass(frozen=True)
class Column:
  """A registered column (see the module docstring); ``value`` is the function it was registered with."""
  name: str
  value: Value
  header: Callable[[Report], str]
  text: Callable[[Any, Report], str]
  csv: str = ""  # its header in results.csv; "" keeps it out
  order: float = 80.0
  shown: Callable[[Report], bool] = lambda report: True
  record: str = ""  # its key in runs.json; "" keeps it out
  lines: Optional[Callable[[Report], list[tuple[str, float]]]] = None  # reference lines it adds to plot.png
  axis: Optional[Callable[[Report], str]] = None  # plot.png draws its values on a second y axis of this name
  reads: tuple[str, ...] = ()  # the ReportSpec fields it serves


@dataclasses.dataclass(frozen=True)
class Section:
  """A registered section: Markdown lines after the tables, where ``shown`` holds, ordered by ``order``."""
  name: str
  lines: Callable[[Report], list[str]]
  order: float = 50.0
  shown: Callable[[Report], bool] = lambda report: True
  reads: tuple[str, ...] = ()


COLUMNS: dict[str, Column] = {}
SECTIONS: dict[str, Section] = {}


def _plain(value: Any, report: Report) -> str:
  return str(value)


def metric_digits(value: Optional[float], report: Report) -> str:
  """A cell in the metric's decimals (:attr:`Report.digits`); ``-`` for None or nan."""
  return render.fmt(value, report.digits)


def column(name: str, header, *, text: Callable[[Any, Report], str] = _plain, **options) -> Callable[[Value], Value]:
  """Registers the decorated function ``(group, report) -> value`` as the column ``name``.

  Args:
    name: its registry key (unique).
    header: its Markdown header: a string, or a function of the report.
    text: its Markdown cell from its value and the report (default ``str``).
    **options: the other fields of :class:`Column` (``csv``, ``order``, ``shown``, ``record``, ``lines``, ``axis``,
      ``reads``).

  Raises:
    ValueError: if ``name`` is taken.
  """
  def register(fn: Value) -> Value:
    if name in COLUMNS:
      raise ValueError(f"report column {name!r} is already registered")
    heading = header if callable(header) else (lambda report: header)
    COLUMNS[name] = Column(name, fn, heading, text, **options)
    return fn
  return register


def section(name: str, **options) -> Callable[[Callable[[Report], list[str]]], Callable[[Report], list[str]]]:
  """Registers the decorated function ``report -> Markdown lines`` as the section ``name``.

  Options are the other fields of :class:`Section` (``order``, ``shown``, ``reads``).
  """
  def register(fn):
    if name in SECTIONS:
      raise ValueError(f"report section {name!r} is already registered")
    SECTIONS[name] = Section(name, fn, **options)
    return fn
  return register


def in_table(report: Report) -> list[Column]:
  """The registered columns the report's Markdown table shows, in order."""
  return sorted((c for c in COLUMNS.values() if c.shown(report)), key=lambda c: c.order)


def in_csv() -> list[Column]:
  """The registered columns with a CSV header, in order."""
  return sorted((c for c in COLUMNS.values() if c.csv), key=lambda c: c.order)


def sections(report: Report) -> list[Section]:
  """The registered sections the report shows, in order."""
  return sorted((s for s in SECTIONS.values() if s.shown(report)), key=lambda s: s.order)


def readers(field: str) -> list[str]:
  """The registered columns and sections that serve the ReportSpec field ``field``."""
  return [p.name for p in (*COLUMNS.values(), *SECTIONS.values()) if field in p.reads]


# ----------------------------------------------------------------------------
# The generic columns: the variant, its runs and the metric's spread, the training time, the paper's number.


@column("variant", "variant", csv="variant", order=0)
def variant(group, report):
  return group.label


@column("x", "x", csv="x", order=5, shown=lambda report: False)
def x_value(group, report):
  """The config value of ``spec.x`` (CSV only: the table is ordered by it)."""
  return group.config.get(report.spec.x) if report.spec.x else None


@column("runs", "runs", csv="runs", order=10)
def run_count(group, report):
  return len(group.points)


@column("step", "step", csv="steps", order=20)
def steps(group, report):
  return runs_lib.step_range([s for s, _ in group.points])


def _stat(name: str, order: float, header: str):
  @column(name, header, csv=name, order=order, text=metric_digits)
  def stat(group, report):
    return group.stats[name]
  return stat


_stat("mean", 30, lambda report: f"{report.spec.metric} mean")
_stat("std", 40, "std")
_stat("min", 50, "min")
_stat("max", 60, "max")


def _per_seed(values: Sequence[float], report: Report) -> str:
  return ", ".join(f"{v:.{report.digits}f}" for v in values)


@column("per_seed", "per seed", order=70, text=_per_seed)
def per_seed(group, report):
  return group.values


def _minutes(group) -> Optional[float]:
  seconds = [r.train_seconds() for r in group.runs]
  return float(np.mean(seconds)) / 60 if all(t is not None for t in seconds) else None


@column("train_minutes", "train min per run", order=90, text=lambda v, report: f"{v:.1f}",
        shown=lambda report: all(_minutes(g) is not None for g in report.groups))
def train_minutes(group, report):
  """Mean training minutes per run, from the logged step rates (shown where every group has them)."""
  return _minutes(group)


@column("paper", lambda report: f"paper ({report.spec.paper}, BLEU)", csv="paper", order=100,
        text=lambda v, report: render.fmt(v, 1), shown=lambda report: bool(report.spec.paper), reads=("paper",),
        axis=lambda report: f"paper BLEU ({report.spec.paper}, red)")
def paper_bleu(group, report):
  """Shaw et al.'s BLEU for the cell the group's config is (``spec.paper``'s table)."""
  return paper.lookup(report.spec.paper, group.config) if report.spec.paper else None

