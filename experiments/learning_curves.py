"""Learning curves in a report: metrics against the training step, one line per run (``ReportSpec.steps``).

Every run the report reads is drawn, the unfinished ones included (a curve
in progress is the point of the plot), in its group's colour and line style, one line per
seed, with each committed baseline that has the metric as a dashed line
(``experiments.baselines``); a second row shows the second half of the
steps, fitted to the runs there, where the ends of the curves are told
apart. Under the plot, per group: its runs, the step each has reached, the
last value of each metric (mean and range over the runs), and, for runs
with a plateau rule (``config.plateau_metric``), the step where the rule
stopped them, "training", or that they reached ``num_train_steps`` (the cap)
without a plateau; then the runs' training hours. Written to
``learning_curves.png``.
"""

from __future__ import annotations

import os
from typing import Sequence

from experiments import baselines
from experiments import columns
from experiments import render
from experiments import runs as runs_lib
from rpr import records as records_lib


def series(run: runs_lib.RunRecord, metric: str) -> tuple[list[int], list[float]]:
  """(steps, values) of every record of ``run`` that holds ``metric``, in step order."""
  points = sorted((int(r["step"]), float(r[metric])) for r in run.records if isinstance(r.get(metric), (int, float)))
  return [s for s, _ in points], [v for _, v in points]


def plot(path: str, groups: Sequence[tuple[str, list[runs_lib.RunRecord]]], metrics: Sequence[str]) -> None:
  """One column per metric: every run over all its steps, and under it the second half of the longest run's steps,
  its y range fitted to the runs there, where the cells' differences at the end of training are small beside
  their rise at its start."""
  plt = render.pyplot()
  fig, axes = plt.subplots(2, len(metrics), figsize=(7.4 * len(metrics), 8.4), squeeze=False)
  last = max((s for _, runs in groups for run in runs for m in metrics for s in series(run, m)[0]), default=0)
  for column, metric in enumerate(metrics):
    whole, zoomed = axes[0][column], axes[1][column]
    tail = []  # the values of the second half, which the zoomed axis is fitted to
    for i, (label, runs) in enumerate(groups):
      for j, run in enumerate(runs):
        steps, values = series(run, metric)
        for ax in (whole, zoomed):
          ax.plot(steps, values, linewidth=1.2, alpha=0.85, label=label if j == 0 else None, **render.group_style(i))
        tail += [v for s, v in zip(steps, values) if s >= last / 2]
    for k, (name, value) in enumerate(baselines.of_metric(metric).items()):
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
  render.save(fig, path)


def _plateau(run: runs_lib.RunRecord) -> str:
  reached = records_lib.plateau_step(run.records)
  if reached is not None:
    return f"stopped at {reached:,}"
  if not run.config.get("plateau_metric"):
    return "-"
  return f"no plateau by {run.config['num_train_steps']:,} (the cap)" if runs_lib.capped(run) else "training"


@columns.section("learning_curves", order=3, shown=lambda report: bool(report.spec.steps), reads=("steps",))
def learning_curves_section(report: columns.Report) -> list[str]:
  """The plot of every run's curves, and per group where its runs stand."""
  grouped = runs_lib.group_runs(report.runs)
  groups = list(zip(runs_lib.labels([c for c, _ in grouped]), [rs for _, rs in grouped]))
  plot(os.path.join(report.out, "learning_curves.png"), groups, report.spec.steps)
  rows = []
  for label, runs in groups:
    steps = [max((int(r["step"]) for r in run.records), default=0) for run in runs]
    cells = [label, str(len(runs)), runs_lib.step_range(steps)]
    for metric in report.spec.steps:
      last = [v[-1] for v in (series(run, metric)[1] for run in runs) if v]
      s = runs_lib.spread(last) if last else None
      cells.append("-" if s is None else f"{s['mean']:.2f} [{s['min']:.2f}, {s['max']:.2f}]")
    cells.append(", ".join(sorted({_plateau(run) for run in runs})))
    rows.append(cells)
  header = ["variant", "runs", "step reached", *(f"{m}, last (mean [min, max])" for m in report.spec.steps),
            "plateau rule"]
  seconds = [t for t in (run.train_seconds() for run in report.runs) if t is not None]
  return ["![learning curves](learning_curves.png)", "",
          "Every run read, finished or not, at its latest evaluation:", "",
          render.markdown_table(header, rows), "",
          f"Training time of {'these ' * (len(seconds) != 1)}{render.count(len(seconds), 'run')}, summed from "
          f"their logged step rates: {sum(seconds) / 3600:.1f} hours of logged training intervals (a rate is steps "
          "over the wall "
          "time between two log lines, so the periodic evaluations are in it and the final one is not; a rate taken "
          "while other work shared the cores counts that wait too). `python -m experiments.compute` counts the "
          "wall-clock hours of the runs' processes, evaluations included, from the spans they committed "
          "(processes.jsonl).", ""]

