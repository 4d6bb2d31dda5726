"""The report's sections on real text: learning curves, the same cells at a shorter budget, the baselines.

Each is a registered section (``experiments.columns``) that sets numbers side by side: means and ranges over
seeds, differences of means. None of them calls a difference real or not: that is a test over seeds
(scipy, sacrebleu), to be added where the report renders per-(cell, seed) records
(:func:`experiments.report.per_seed_table`). The noise floors measured in ``experiments/results/noise/`` are
diagnostics of how far a floating-point order moves a metric, not a rule here.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from experiments import baselines
from experiments import columns
from experiments import engine
from experiments import paper
from experiments import render
from experiments import runs as runs_lib

# The keys that say how long and how a cell was trained and evaluated, not what it trains: one cell at any budget.
BUDGET_KEYS = ("seed", "num_train_steps", "eval_every_steps", "eval_splits", "final_eval_splits", "decode_method",
               "final_decode_method", "checkpoint_every_steps", "keep_checkpoints", "log_every_steps", "tensorboard",
               *engine.PLATEAU_KEYS)


def cell(config: dict) -> str:
  """What a config trains, without its budget: equal for one cell at any budget."""
  return runs_lib.canonical({k: v for k, v in config.items() if k not in BUDGET_KEYS})


def _spread(values: Sequence[float], digits: int) -> str:
  s = runs_lib.spread(values)
  return (f"{s['mean']:.{digits}f}" if s["n"] == 1
          else f"{s['mean']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]")


def _bleu(report: columns.Report) -> bool:
  return report.spec.metric.endswith("/bleu")


def _capped(report: columns.Report) -> str:
  return (" A step marked (cap) has runs that reached the cap without meeting their plateau rule: their number is "
          "not a converged one." if any(g.capped for g in report.groups) else "")


def shorter_rows(report: columns.Report, shorter: Sequence[runs_lib.RunRecord]) -> list[list[str]]:
  """Per group: its runs, step and metric here, the same cell's at the shorter budget, the change of the means."""
  metric, digits, out = report.spec.metric, report.digits, []
  for g in report.groups:
    points = [p for r in shorter if cell(r.config) == cell(g.config) and (p := r.last(metric)) is not None]
    cells = [g.label, f"{len(g.values)}", runs_lib.step_range([s for s, _ in g.points]) + " (cap)" * bool(g.capped),
             _spread(g.values, digits)]
    if points:
      values = [v for _, v in points]
      change = runs_lib.spread(g.values)["mean"] - runs_lib.spread(values)["mean"]
      cells += [f"{len(points)}", runs_lib.step_range([s for s, _ in points]), _spread(values, digits),
                f"{change:+.{digits}f}"]
    else:
      cells += ["0", "-", "-", "-"]
    if _bleu(report):
      found = paper.cell(g.config)
      cells.append("-" if found is None else f"{found[1]:.1f} ({found[0].replace('table', 'T')})")
    out.append(cells)
  return out


@columns.section("budgets", order=4, shown=lambda report: bool(report.spec.shorter), reads=("shorter",))
def budgets_section(report: columns.Report) -> list[str]:
  """Each group beside its cell at the shorter budget (``ReportSpec.shorter``): mean [min, max] at both."""
  metric = report.spec.metric
  header = ["variant", "runs", "step", metric, "shorter: runs", "step", metric, "change of means",
            *(["paper (BLEU, table)"] if _bleu(report) else [])]
  paper_text = (" The paper's BLEU is that of the one table that varies what the cell varies: T1 newstest2014, "
                "T2 and T3 newstest2013." if _bleu(report) else "")
  return [f"At this budget and at the shorter one (the same cells in the runs of {', '.join(report.spec.shorter)}; "
          f"mean [min, max] over seeds).{paper_text}{_capped(report)}", "",
          render.markdown_table(header, shorter_rows(report, runs_lib.load_runs(report.spec.shorter)),
                                ["---"] + [render.RIGHT] * (len(header) - 1)), ""]


@columns.section("baselines", order=5, shown=lambda report: bool(baselines.of_metric(report.spec.metric)))
def baselines_section(report: columns.Report) -> list[str]:
  """Each committed baseline that has the report's metric, and each group's mean and range minus it."""
  metric, digits, lines = report.spec.metric, report.digits, []
  for name, value in baselines.of_metric(metric).items():
    diffs = [f"{g.label} {runs_lib.spread(g.values)['mean'] - value:+.{digits}f} "
             f"[{min(g.values) - value:+.{digits}f}, {max(g.values) - value:+.{digits}f}]" for g in report.groups]
    lines.append(f"- Baseline **{name}**: {metric} {value:.2f} (`experiments/results/baselines/`). Each group's "
                 f"mean [min, max] minus it: {'; '.join(diffs)}.")
  return [f"Baselines of {metric}.{_capped(report)}", "", *lines, ""]


def _plateau(run: runs_lib.RunRecord) -> str:
  reached = engine.plateau_step(run.records)
  if reached is not None:
    return f"stopped at {reached:,}"
  if not run.config.get("plateau_metric"):
    return "-"
  return f"no plateau by {run.config['num_train_steps']:,} (the cap)" if runs_lib.capped(run) else "training"


@columns.section("learning_curves", order=3, shown=lambda report: bool(report.spec.steps), reads=("steps",))
def learning_curves_section(report: columns.Report) -> list[str]:
  """Every run read, finished or not, drawn against the step (``learning_curves.png``), and where each group's
  runs stand: the step reached, the last value of each metric, the plateau rule's state."""
  grouped = runs_lib.group_runs(report.runs)
  groups = list(zip(runs_lib.labels([c for c, _ in grouped]), [rs for _, rs in grouped]))
  curves = [(label, [{m: runs_lib.series(r, m) for m in report.spec.steps} for r in rs]) for label, rs in groups]
  render.learning_curves_plot(os.path.join(report.out, "learning_curves.png"), curves, report.spec.steps,
                              {m: baselines.of_metric(m) for m in report.spec.steps})
  rows = []
  for label, runs in groups:
    steps = [max((int(r["step"]) for r in run.records), default=0) for run in runs]
    cells = [label, str(len(runs)), runs_lib.step_range(steps)]
    for metric in report.spec.steps:
      last = [v[-1] for v in (runs_lib.series(run, metric)[1] for run in runs) if v]
      s: Optional[dict] = runs_lib.spread(last) if last else None
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
          "over the wall time between two log lines, so the periodic evaluations are in it and the final one is "
          "not; a rate taken while other work shared the cores counts that wait too).", ""]
