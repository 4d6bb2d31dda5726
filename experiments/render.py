"""The one table renderer and the tables' plot: Markdown and CSV tables, and PNGs.

Every table here (the protocol's, the baselines', the benchmarks') is a header and rows of cells
(:func:`markdown_table`, :func:`write_csv`); the plot of a table is :func:`table_plot`; a measurement's
``results.json`` and its README are :func:`write_report`. Every PNG is saved
without the matplotlib version in its metadata (:func:`save`), so the same values give the same bytes.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any, Optional, Sequence

import numpy as np

from rpr import records as records_lib

RIGHT = "---:"  # a right-aligned column in :func:`markdown_table`'s ``align``


def fmt(value: Optional[float], digits: int) -> str:
  """``value`` with ``digits`` decimals; ``"-"`` for None or nan."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "-"
  return f"{value:.{digits}f}"


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


def write_report(out: str, data: dict, readme: str, record: str = "results.json") -> None:
  """A measurement's folder: ``out/<record>`` (``data``, JSON) and ``out/README.md`` (``readme``, rendered from
  ``data`` alone), each replaced atomically, so an interrupted run leaves the previous pair readable."""
  os.makedirs(out, exist_ok=True)
  records_lib.replace_lines(os.path.join(out, record), [json.dumps(data, indent=1)])
  records_lib.replace_lines(os.path.join(out, "README.md"), [readme])


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


# One colour per cell in every plot: the protocol's cells in order, each a tab20 colour (dark tones first). A run
# name with settings after the cell ("shaw,steps=8000") takes its cell's colour; a cell not listed takes the
# first colour its panel leaves free.
CELLS = ("sinusoidal", "shaw", "shaw+sinusoidal", "rope", "t5", "alibi_directional", "k=0", "k=1", "k=2", "k=4",
         "k=8", "k=64", "k=256", "ak", "av")
_TONES = tuple(range(0, 20, 2)) + tuple(range(1, 20, 2))


def colours(names: Sequence[str]) -> list:
  """The colour of each of ``names`` (distinct within the list): the cell's own (:data:`CELLS`), else a free one."""
  import matplotlib

  tab20 = matplotlib.colormaps["tab20"].colors
  own = [_TONES[CELLS.index(n.split(",")[0])] if n.split(",")[0] in CELLS else None for n in names]
  if len({o for o in own if o is not None}) < sum(o is not None for o in own):  # two settings of one cell
    own = [None] * len(names)
  free = iter(t for t in _TONES if t not in own)
  return [tab20[o if o is not None else next(free)] for o in own]


def table_plot(path: str, title: str, ylabel: str, cells: Sequence[tuple[str, Sequence[float], Sequence[tuple]]],
               baselines: Sequence[tuple[str, float]] = (), curve_label: str = "", per_panel: int = 8) -> None:
  """A table's cells, one colour each (at most ``per_panel`` a panel, the panels of equal size and scale): left,
  each seed's final value (small dots, just left of the bar) and the mean with its 95% CI (bold); right, each
  seed's learning curve (thin) and the mean over seeds (bold), the last step of each seed marked x. Each cell
  keeps its colour across plots (:func:`colours`). Baselines (of the table's metric, on the test split) are grey
  lines on the left panel only: the curves are validation scores.

  Args:
    cells: (name, final values, curves: one (steps, values) per seed).
  """
  from experiments import stats

  plt = pyplot()
  size = -(-len(cells) // -(-len(cells) // per_panel)) if cells else 1  # balanced: 9 cells are 5 + 4, not 8 + 1
  panels = [cells[i:i + size] for i in range(0, len(cells), size)] or [[]]
  with_curves = any(curves for _, _, curves in cells)  # else the final values alone, one column
  # One scale per column, so that a cell reads against the cells of the other panels.
  fig, axes = plt.subplots(len(panels), 1 + with_curves, figsize=(12.0 if with_curves else 6.5, 4.2 * len(panels)),
                           squeeze=False, sharey="col")
  for (left, *right), panel in zip(axes, panels):
    for i, ((name, finals, curves), colour) in enumerate(zip(panel, colours([c[0] for c in panel]))):
      v = np.asarray(finals, np.float64)
      left.plot([i - 0.15] * len(v), v, "o", color=colour, markersize=4, alpha=0.7)  # beside the CI bar, not under it
      if len(v):
        c = stats.cell(v)  # the tables' own CI
        left.errorbar([i], [c.mean], yerr=[0.0 if c.n < 2 else (c.high - c.low) / 2], fmt="o", color=colour,
                      linewidth=2.5, capsize=5)
      for steps, values in curves:
        right[0].plot(steps, values, color=colour, linewidth=0.8, alpha=0.5)
        right[0].plot(steps[-1:], values[-1:], "x", color=colour)
      common = sorted(set.intersection(*(set(s) for s, _ in curves))) if curves else []
      if common:
        mean = [np.mean([dict(zip(s, y))[step] for s, y in curves]) for step in common]
        right[0].plot(common, mean, color=colour, linewidth=2.5, label=name)
    left.set_xticks(range(len(panel)), [name for name, _, _ in panel], rotation=20, ha="right")
    for k, (name, value) in enumerate(baselines):
      left.axhline(value, color="tab:gray", linestyle=("--", ":")[k % 2], linewidth=1.0, label=f"{name} ({value:.2f})")
    left.set_ylabel(ylabel)
    for ax in right:
      ax.set_xlabel("training step")
      ax.set_ylabel(curve_label)
    for ax in (left, *right):
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
      ax.grid(alpha=0.3)
  axes[0][0].set_title("final: a dot per seed; mean and 95% CI", fontsize=9)
  if with_curves:
    axes[0][1].set_title("learning curves: thin per seed, bold mean; x = last step", fontsize=9)
  fig.suptitle(title)
  save(fig, path)
