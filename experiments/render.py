"""Writes what the reports show: Markdown and CSV tables, and PNG plots.

Tables are built from a header and rows of cells (:func:`markdown_table`,
:func:`write_csv`); plots from plain values (:class:`Points` per group for
:func:`metric_plot`, arrays for :func:`curve_plot` and :func:`length_plot`).
Every PNG is saved without the matplotlib version in its metadata
(:func:`save`), so the same values give the same bytes.
"""

from __future__ import annotations

import csv
import math
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np

RIGHT = "---:"  # a right-aligned column in :func:`markdown_table`'s ``align``


def fmt(value: Optional[float], digits: int) -> str:
  """``value`` with ``digits`` decimals; ``"-"`` for None or nan."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "-"
  return f"{value:.{digits}f}"


def count(n: int, noun: str) -> str:
  """``n`` and ``noun``, plural unless ``n`` is 1: "1 run", "2 runs" (nouns whose plural adds an s)."""
  return f"{n:,} {noun}{'s' * (n != 1)}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: Optional[Sequence[str]] = None) -> str:
  """A Markdown table without a trailing newline.

  Args:
    header: the column titles.
    rows: one sequence of cells per row (``str()`` of each), as long as ``header``.
    align: per column ``"---"`` (default) or :data:`RIGHT`.
  """
  align = align or ["---"] * len(header)
  lines = [_row(header), _row(align)]
  return "\n".join(lines + [_row(r) for r in rows])


def _row(cells: Sequence[Any]) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def write_csv(path: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  """A CSV file with ``header``; None and nan cells are written empty."""
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row]
                     for row in rows)


def write_text(text: str, path: Optional[str], echo: bool = True) -> None:
  """Writes ``text`` to ``path`` (unless None) and prints it (if ``echo``)."""
  if path:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  if echo:
    print(text)


def pyplot():
  """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save(fig, path: str, dpi: int = 120) -> None:
  """Lays out, saves (PNG, no software stamp) and closes ``fig``."""
  fig.tight_layout()
  fig.savefig(path, dpi=dpi, metadata={"Software": None})
  pyplot().close(fig)


LINE_STYLES = ("-", "--", ":", "-.")


def group_style(i: int) -> dict[str, str]:
  """The colour and line style of the ``i``-th group of a plot, distinct for the first 40: matplotlib's 10 colours,
  then the same colours dashed, dotted, dash-dotted (its default cycle would give group 11 group 1's look)."""
  return {"color": f"C{i % 10}", "linestyle": LINE_STYLES[i // 10 % len(LINE_STYLES)]}


class Points(NamedTuple):
  """One group of :func:`metric_plot`: its name, its runs' values, its x (None: bars side by side), a reference."""
  label: str
  values: Sequence[float]
  x: Optional[float] = None
  reference: Optional[float] = None


def metric_plot(path: str, groups: Sequence[Points], ylabel: str, title: str, xlabel: Optional[str] = None,
                lines: Sequence[tuple[str, float]] = (), reference_label: Optional[str] = None) -> None:
  """Each group's mean with min-max whiskers and a dot per run: over ``xlabel`` if given, else as bars.

  ``lines`` (at most two) are horizontal reference lines (label, value); the groups' ``reference`` values
  are drawn on a second axis named ``reference_label`` (if any group has one).
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  pos = [g.x for g in groups] if xlabel else list(range(len(groups)))
  values = [np.asarray(g.values, np.float64) for g in groups]
  mean = np.array([float(v.mean()) for v in values])
  err = np.array([[m - float(v.min()) for m, v in zip(mean, values)],
                  [float(v.max()) - m for m, v in zip(mean, values)]])
  if xlabel:
    ax.errorbar(pos, mean, yerr=err, marker="o", capsize=3, label="measured (mean, min-max over runs)")
    if max(pos) > 8 * max(min(p for p in pos if p > 0) if any(p > 0 for p in pos) else 1, 1):
      ax.set_xscale("symlog", base=2, linthresh=1)  # k = 0 ... 256: powers of two apart
    ax.set_xlabel(xlabel)
  else:
    ax.bar(pos, mean, yerr=err, capsize=3, alpha=0.7, label="measured (mean, min-max over runs)")
    ax.set_xticks(pos, [g.label for g in groups], rotation=20, ha="right")
  for p, g in zip(pos, groups):
    ax.plot([p] * len(g.values), list(g.values), ".", color="k", alpha=0.5)
  ax.set_ylabel(ylabel)
  for (label, value), style in zip(lines, (":", "--")):
    ax.axhline(value, color="tab:gray", linestyle=style, label=label)
  if reference_label and any(g.reference is not None for g in groups):
    twin = ax.twinx()
    twin.plot([p for p, g in zip(pos, groups) if g.reference is not None],
              [g.reference for g in groups if g.reference is not None], "s--" if xlabel else "s", color="tab:red",
              alpha=0.8)
    twin.set_ylabel(reference_label, color="tab:red")
  ax.legend(loc="best", fontsize=8)
  ax.set_title(title)
  save(fig, path)


def curve_plot(path: str, curves: Mapping[str, np.ndarray], metrics: Sequence[str], title: str) -> dict[str, list]:
  """One line per group over ``metrics`` in order: the mean over its runs, and a min-max band.

  Args:
    curves: per group, its runs' values ``[runs, len(metrics)]`` (nan where a run lacks a metric).

  Returns:
    Per group, the means that were drawn.
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7.4, 4.2))
  means = {}
  for i, (label, values) in enumerate(curves.items()):
    means[label] = np.nanmean(values, axis=0).tolist()
    line, = ax.plot(range(len(metrics)), means[label], marker="o", label=label, **group_style(i))
    if len(values) > 1:
      ax.fill_between(range(len(metrics)), np.nanmin(values, axis=0), np.nanmax(values, axis=0),
                      color=line.get_color(), alpha=0.15, linewidth=0)
  ax.set_xticks(range(len(metrics)), metrics, rotation=15, ha="right", fontsize=8)
  ax.set_ylabel("mean over runs (band: min-max)")
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  ax.set_title(title)
  save(fig, path)
  return means


def length_plot(path: str, curves: Mapping[str, Mapping[int, Mapping[str, float]]], train_max: Sequence[int],
                title: str) -> None:
  """Exact match against input length, one line per group with a min-max band; each training limit marked.

  Args:
    curves: per group, per length, the ``mean``, ``min`` and ``max`` over its runs.
    train_max: the longest training lengths, each drawn as a dashed line just after it.
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(8.4, 4.4))
  for j, (label, lengths) in enumerate(curves.items()):
    n = sorted(lengths)
    line, = ax.plot(n, [lengths[i]["mean"] for i in n], marker=".", label=label, **group_style(j))
    ax.fill_between(n, [lengths[i]["min"] for i in n], [lengths[i]["max"] for i in n], color=line.get_color(),
                    alpha=0.15, linewidth=0)
  for t in train_max:
    ax.axvline(t + 0.5, color="k", linestyle="--", linewidth=1)
    ax.text(t + 0.6, 1.02, "longer than training", fontsize=8, va="bottom")
  ax.set_xlabel("input length (digits)")
  ax.set_ylabel("exact match (mean; band: min-max over runs)")
  ax.set_ylim(-0.02, 1.08)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  ax.set_title(title)
  save(fig, path)


def learning_curves_plot(path: str, groups: Sequence[tuple[str, Sequence[Mapping[str, tuple[list, list]]]]],
                         metrics: Sequence[str], references: Mapping[str, Mapping[str, float]]) -> None:
  """One column per metric, one line per run in its group's style; under it the second half of the longest run's
  steps, its y range fitted to the runs there, where the cells' differences at the end of training show.

  Args:
    groups: (label, per run {metric: (steps, values)}).
    references: per metric, {name: value} drawn as dashed lines (the baselines).
  """
  plt = pyplot()
  fig, axes = plt.subplots(2, len(metrics), figsize=(7.4 * len(metrics), 8.4), squeeze=False)
  last = max((s for _, runs in groups for run in runs for m in metrics for s in run[m][0]), default=0)
  for column, metric in enumerate(metrics):
    whole, zoomed = axes[0][column], axes[1][column]
    tail = []  # the values of the second half, which the zoomed axis is fitted to
    for i, (label, runs) in enumerate(groups):
      for j, run in enumerate(runs):
        steps, values = run[metric]
        for ax in (whole, zoomed):
          ax.plot(steps, values, linewidth=1.2, alpha=0.85, label=label if j == 0 else None, **group_style(i))
        tail += [v for s, v in zip(steps, values) if s >= last / 2]
    for k, (name, value) in enumerate(references.get(metric, {}).items()):
      whole.axhline(value, color="k", linestyle=("--", ":")[k % 2], linewidth=1.0, label=f"{name} ({value:.2f})")
    if tail:
      pad = 0.05 * (max(tail) - min(tail)) or 0.05 * abs(max(tail)) or 1.0
      zoomed.set_xlim(last / 2, last * 1.01)
      zoomed.set_ylim(min(tail) - pad, max(tail) + pad)
    zoomed.set_title(f"{metric}, steps {last // 2:,}-{last:,}", fontsize=9)
    for ax in (whole, zoomed):
      ax.set_xlabel("training step")
      ax.set_ylabel(metric)
      if metric.endswith("perplexity"):
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # 40, 60, not 4x10^1
          axis(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
      ax.grid(alpha=0.3)
  legend = {}  # the groups once, and every axis's baselines
  for ax in axes[0]:
    legend.update((label, handle) for handle, label in zip(*ax.get_legend_handles_labels()))
  axes[0][-1].legend(legend.values(), legend.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  fig.suptitle("learning curves: one line per run (below: the second half of the steps)")
  save(fig, path)


def table_plot(path: str, title: str, ylabel: str, cells: Sequence[tuple[str, Sequence[float], Sequence[tuple]]],
               baselines: Sequence[tuple[str, float]] = (), curve_label: str = "", per_panel: int = 8) -> None:
  """A table's cells, one colour each (at most ``per_panel`` a panel): left, each seed's final value (thin dots)
  and the mean with its 95% CI (bold); right, each seed's learning curve (thin) and the mean over seeds (bold),
  the last step of each seed marked x. Baselines are grey lines on both.

  Args:
    cells: (name, final values, curves: one (steps, values) per seed).
  """
  from experiments import stats

  plt = pyplot()
  panels = [cells[i:i + per_panel] for i in range(0, len(cells), per_panel)] or [[]]
  fig, axes = plt.subplots(len(panels), 2, figsize=(12.0, 4.2 * len(panels)), squeeze=False)
  for (left, right), panel in zip(axes, panels):
    for i, (name, finals, curves) in enumerate(panel):
      colour, v = f"C{i}", np.asarray(finals, np.float64)
      left.plot([i] * len(v), v, ".", color=colour, alpha=0.6)
      if len(v):
        c = stats.cell(v)  # the tables' own CI
        left.errorbar([i], [c.mean], yerr=[0.0 if c.n < 2 else (c.high - c.low) / 2], fmt="o", color=colour,
                      linewidth=2.5, capsize=5)
      for steps, values in curves:
        right.plot(steps, values, color=colour, linewidth=0.8, alpha=0.5)
        right.plot(steps[-1:], values[-1:], "x", color=colour)
      common = sorted(set.intersection(*(set(s) for s, _ in curves))) if curves else []
      if common:
        mean = [np.mean([dict(zip(s, y))[step] for s, y in curves]) for step in common]
        right.plot(common, mean, color=colour, linewidth=2.5, label=name)
    left.set_xticks(range(len(panel)), [name for name, _, _ in panel], rotation=20, ha="right")
    for k, (name, value) in enumerate(baselines):
      for ax in (left, right):
        ax.axhline(value, color="tab:gray", linestyle=("--", ":")[k % 2], linewidth=1.0,
                   label=f"{name} ({value:.2f})" if ax is right else None)
    left.set_ylabel(ylabel)
    right.set_xlabel("training step")
    right.set_ylabel(curve_label)
    right.legend(fontsize=8, loc="best")
    for ax in (left, right):
      ax.grid(alpha=0.3)
  axes[0][0].set_title("final: a dot per seed; mean and 95% CI", fontsize=9)
  axes[0][1].set_title("learning curves: thin per seed, bold mean; x = last step", fontsize=9)
  fig.suptitle(title)
  save(fig, path)
