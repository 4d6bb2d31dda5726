"""The one report writer: tabulates and plots finished runs as a Markdown table, a CSV, a JSON of every run and PNGs.

  python -m experiments report "workdirs/sweeps/clipping/table2/*/*" --metric test/exact_match \\
      --x max_distance --paper table2 --out experiments/results/clipping/table2
  python -m experiments report "workdirs/sweeps/length/*/*" --by_length --out experiments/results/length

Runs are read from the workdirs the globs match (``experiments.runs``: each with ``config.json`` and
``metrics.jsonl``) and grouped by their config with the seed left out, so the seeds of one variant form a group,
named by the config keys that tell the groups apart (``k=4``). A run's value is the metric in the last record that
has it. What a report shows is a :class:`ReportSpec` (a sweep declares one; the ``report`` verb builds one from its
flags, one flag per field). A metric report has one table row per group, its columns the registered ones
(``experiments.columns``; the arithmetic ceiling in ``experiments.arithmetic``), then a table of the ``also``
metrics, then the registered sections (``experiments.arithmetic``, ``experiments.sections``). A by-length report
has the per-length exact match of every split, one row per group.

Outputs in ``out``: ``table.md`` (headed by the command that regenerates it), ``results.csv`` (one row per group;
per group and length for by-length), ``runs.json`` (every run's workdir, seed and values, and what the columns
record per group), ``plot.png``, and ``curve.png`` with ``spec.curve``. :func:`per_seed_records` is the
per-(cell, seed) frame that tests over seeds read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
from typing import Optional, Sequence

import numpy as np
from absl import app
from absl import flags

from experiments import arithmetic  # registers the ceiling column and the checks, bounds and attention sections
from experiments import columns
from experiments import paper
from experiments import render
from experiments import runs as runs_lib
from experiments import sections  # registers the learning-curves, shorter-budget and baselines sections

__all__ = ["ReportSpec", "write_report", "per_seed_records", "per_seed_table", "arithmetic", "sections"]


@dataclasses.dataclass(frozen=True)
class ReportSpec:
  """The report of a set of runs (:func:`write_report`).

  Attributes:
    metric: ``<split>/<metric>`` in metrics.jsonl, one value per run (its last); required unless ``by_length``.
    x: a numeric config key to order the groups by and to plot the metric against.
    also: more metrics of the same groups, a column each in a second table.
    curve: metrics drawn in order as one line per group (``curve.png``).
    steps: metrics drawn against the training step, one line per run, unfinished runs included
      (``learning_curves.png``, ``experiments.sections``).
    shorter: globs of runs of the same cells at a shorter budget, set beside each group (``experiments.sections``).
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
  paper: Optional[str] = None
  bound: tuple[str, ...] = ()
  target: Optional[float] = None
  attention: bool = False
  by_length: bool = False
  title: Optional[str] = None

  def __post_init__(self):
    for name in ("also", "curve", "steps", "shorter", "bound"):  # one string is one item; flags give lists
      value = getattr(self, name)
      object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value or ()))
    if not (self.metric or self.by_length):
      raise ValueError("--metric is required (or --by_length)")

  def args(self) -> tuple[str, ...]:
    """The flags of ``python -m experiments report`` that make this spec, in field order.

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


# The fields this module reads itself; any other set field needs a registered column or section that reads it.
ENGINE_FIELDS = ("metric", "x", "also", "curve", "by_length", "title")


def write_report(patterns: Sequence[str], out: str, spec: Optional[ReportSpec] = None,
                 command: Optional[str] = None, **fields) -> list:
  """Reads the runs ``patterns`` match and writes the report ``spec`` (or ``ReportSpec(**fields)``) to ``out``.

  Args:
    patterns: globs of run workdirs (each with config.json and metrics.jsonl; others are passed over).
    out: the output directory (made if missing).
    spec: what the report shows; or its fields as keywords instead.
    command: the command that makes this report, written as the first line of ``table.md`` (None: no line).

  Returns:
    The groups (``experiments.runs.Group``, cells filled), or the by-length rows.

  Raises:
    ValueError: if no run matches, no run holds the metric, a set field of the spec has no registered
      column or section to serve it (the module that registers it was not imported).
  """
  if spec is not None and fields:
    raise TypeError(f"write_report takes a spec or its fields, not both (got {sorted(fields)})")
  spec = spec or ReportSpec(**fields)
  unserved = [f for f in spec.set_fields() if f not in ENGINE_FIELDS and not columns.readers(f)]
  if unserved:
    raise ValueError(f"no registered report column or section reads {unserved}: import the module that "
                     "registers them (this module imports every one)")
  runs = runs_lib.load_runs(patterns)
  if not runs:
    raise ValueError(f"no workdir with config.json and metrics.jsonl matches {list(patterns)}")
  os.makedirs(out, exist_ok=True)
  if spec.by_length:
    rows, body, what = _length_report(runs, spec, out)
    records = [{"variant": r["variant"], "runs": r["runs"]} for r in rows]
  else:
    rows, body, what = _metric_report(runs, spec, out)
    records = [{"variant": g.label, "runs": g.run_values(), **g.record} for g in rows]
  with open(os.path.join(out, "runs.json"), "w", encoding="utf-8") as f:
    json.dump(records, f, indent=1, sort_keys=True)
  lines = [f"Generated by `{command}`.", ""] if command else []
  counted = sum(len(r["runs"]) for r in records)  # runs that hold the metric (an unfinished one does not)
  skipped = f" ({len(runs) - counted} more without it, unfinished)" if counted < len(runs) else ""
  lines += [f"{render.count(counted, 'run')}{skipped} in {render.count(len(rows), 'group')}; {what}.", ""] + body
  with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return rows


# ----------------------------------------------------------------------------
# One metric per group.


def _metric_report(runs: list[runs_lib.RunRecord], spec: ReportSpec, out: str):
  """Table, CSV, plots and sections of a metric report; ``(groups, Markdown lines, what the numbers are)``."""
  report = columns.Report(spec, runs, runs_lib.summarise(runs, spec.metric, spec.x), out)
  shown = columns.in_table(report)
  for group in report.groups:
    for c in {c.name: c for c in shown + columns.in_csv()}.values():
      group.cells[c.name] = c.value(group, report)
      if c.record and c in shown:
        group.record[c.record] = group.cells[c.name]
  table = render.markdown_table([c.header(report) for c in shown],
                                [[c.text(g.cells[c.name], report) for c in shown] for g in report.groups])
  if spec.also:
    table += "\n\n" + also_table(report.groups, [spec.metric, *spec.also])
  csv_columns = columns.in_csv()
  render.write_csv(os.path.join(out, "results.csv"), [c.csv for c in csv_columns],
                   [[g.cells[c.name] for c in csv_columns] for g in report.groups])
  lines = [line for c in shown if c.lines for line in c.lines(report)]
  axes = [c for c in shown if c.axis][:1]  # the plot has room for one second axis
  render.metric_plot(os.path.join(out, "plot.png"),
                     [render.Points(g.label, g.values, g.config.get(spec.x) if spec.x else None,
                                    g.cells[axes[0].name] if axes else None) for g in report.groups],
                     spec.metric, spec.title or spec.metric, xlabel=spec.x, lines=lines,
                     reference_label=axes[0].axis(report) if axes else None)
  if spec.curve:
    curves = {g.label: curve_values(g, spec.curve) for g in report.groups}
    render.curve_plot(os.path.join(out, "curve.png"), curves, spec.curve,
                      spec.title or f"{spec.curve[0]} ... {spec.curve[-1]}")
  notes = [line for s in columns.sections(report) for line in s.lines(report)]
  what = f"{spec.metric} at each run's last evaluation; std over runs with ddof 1"
  return report.groups, [table, ""] + notes, what


def curve_values(group: runs_lib.Group, metrics: Sequence[str]) -> np.ndarray:
  """``[runs, metrics]``: each run's last value of each metric, nan where it has none."""
  return np.array([[(r.last(m) or (None, math.nan))[1] for m in metrics] for r in group.runs], dtype=float)


def also_table(groups: Sequence[runs_lib.Group], metrics: Sequence[str]) -> str:
  """Per group, each metric's mean ± std [min, max] over the group's runs at their last value (the value alone
  for a group of one run; ``-`` where no run has it)."""
  body = []
  for g in groups:
    cells = [g.label]
    for metric in metrics:
      values = [v for v in (r.last(metric) for r in g.runs) if v is not None]
      s = runs_lib.spread([v for _, v in values]) if values else None
      cells.append("-" if s is None else f"{s['mean']:.4g}" if s["n"] == 1 else
                   f"{s['mean']:.4g} ± {render.fmt(s['std'], 2)} [{s['min']:.4g}, {s['max']:.4g}]")
    body.append(cells)
  return render.markdown_table(["variant", *metrics], body)


# ----------------------------------------------------------------------------
# Exact match against length.


def summarise_by_length(runs: Sequence[runs_lib.RunRecord]) -> list[dict]:
  """One row per group, sorted by name: its longest training length, and per length the spread over its runs.

  Raises:
    ValueError: if no run holds per-length values.
  """
  grouped = [(c, [(r, v) for r in rs if (v := r.by_length()) is not None]) for c, rs in runs_lib.group_runs(runs)]
  grouped = [(c, rs) for c, rs in grouped if rs]
  if not grouped:
    raise ValueError("no run holds per-length values (<split>/exact_match_by_length/<n>; set eval_by_length)")
  rows = []
  for (config, rs), name in zip(grouped, runs_lib.labels([c for c, _ in grouped])):
    lengths = sorted(set.intersection(*(set(v) for _, (_, v) in rs)))
    train_max = config.get("max_length")
    seen = [np.mean([v[n] for n in lengths if n <= train_max]) for _, (_, v) in rs] if train_max else []
    longer = [np.mean([v[n] for n in lengths if n > train_max]) for _, (_, v) in rs
              if train_max and any(n > train_max for n in lengths)]
    rows.append({"variant": name, "n": len(rs), "steps": runs_lib.step_range([s for _, (s, _) in rs]),
                 "train_max": train_max, "lengths": {n: runs_lib.spread([v[n] for _, (_, v) in rs]) for n in lengths},
                 "seen": runs_lib.spread(seen) if seen else None, "longer": runs_lib.spread(longer) if longer else None,
                 "runs": [{"workdir": r.workdir, "seed": r.seed, "step": s, "values": v} for r, (s, v) in rs]})
  rows.sort(key=lambda r: r["variant"])
  return rows


def length_table(rows: Sequence[dict]) -> str:
  """Per group: runs, steps, the mean [min, max] over trained and longer lengths, and the mean per length."""
  lengths = sorted({n for r in rows for n in r["lengths"]})
  header = ["variant", "runs", "step", "trained lengths", "longer lengths"] + [str(n) for n in lengths]

  def both(s):
    return "-" if s is None else f"{s['mean']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"

  body = [[r["variant"], str(r["n"]), r["steps"], both(r["seen"]), both(r["longer"])]
          + [render.fmt(r["lengths"][n]["mean"], 2) if n in r["lengths"] else "-" for n in lengths] for r in rows]
  return render.markdown_table(header, body)


def _length_report(runs: list[runs_lib.RunRecord], spec: ReportSpec, out: str):
  """Table, CSV and plot of a by-length report; ``(rows, Markdown lines, what the numbers are)``."""
  rows = summarise_by_length(runs)
  render.write_csv(os.path.join(out, "results.csv"), ["variant", "length", "runs", "mean", "std", "min", "max"],
                   [[r["variant"], n, s["n"], s["mean"], s["std"], s["min"], s["max"]]
                    for r in rows for n, s in r["lengths"].items()])
  render.length_plot(os.path.join(out, "plot.png"), {r["variant"]: r["lengths"] for r in rows},
                     {r["train_max"] for r in rows if r["train_max"]}, spec.title or "exact match against length")
  what = "exact match per input length (greedy decoding); trained/longer: mean [min, max] over runs"
  return rows, [length_table(rows), ""], what


# ----------------------------------------------------------------------------
# The command line.


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
  """The ``report`` verb's flags: one per ReportSpec field, and ``--out``."""
  flags.DEFINE_string("metric", None, "Metric name in metrics.jsonl, e.g. test/exact_match.", flag_values=fv)
  flags.DEFINE_string("x", None, "Numeric config key to order and plot the groups by, e.g. max_distance.",
                      flag_values=fv)
  flags.DEFINE_multi_string("also", [], "More metrics of the same runs: a column each (mean ± std [min, max]).",
                            flag_values=fv)
  flags.DEFINE_multi_string("curve", [], "Metrics to draw in curve.png, in order, as one line per group over them "
                            "(e.g. test/perplexity, then test_x2/perplexity, ...).", flag_values=fv)
  flags.DEFINE_multi_string("steps", [], "Metrics to draw against the training step in learning_curves.png, one "
                            "line per run (e.g. validation/bleu).", flag_values=fv)
  flags.DEFINE_multi_string("shorter", [], "Globs of runs of the same cells at a shorter budget, set beside each "
                            "group with the change of the means.", flag_values=fv)
  flags.DEFINE_enum("paper", None, list(paper.TABLES), "The paper's table to print beside the metric.",
                    flag_values=fv)
  flags.DEFINE_multi_enum("bound", [], list(arithmetic.VIEWS),
                          "Arithmetic runs: hold each group to the ceiling of what its scheme sees.", flag_values=fv)
  flags.DEFINE_float("target", None, "Check that every run of every unbounded group reaches this value.",
                     flag_values=fv)
  flags.DEFINE_bool("attention", False, "Arithmetic runs: encoder attention maps of the lowest-seed runs.",
                    flag_values=fv)
  flags.DEFINE_bool("by_length", False, "Exact match against input length (eval_by_length runs).", flag_values=fv)
  flags.DEFINE_string("title", None, "Plot title (default: the metric).", flag_values=fv)
  flags.DEFINE_string("out", None, "Output directory.", required=True, flag_values=fv)


def main(argv) -> None:
  if len(argv) < 2:
    raise app.UsageError("name one or more workdir globs, e.g. 'workdirs/sweeps/lm/clipping/*/*'")
  command = "python -m experiments " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  try:
    spec = spec_from_flags()
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  write_report(argv[1:], flags.FLAGS.out, spec, command=command)
  with open(os.path.join(flags.FLAGS.out, "table.md"), encoding="utf-8") as f:
    print(f.read())


def spec_from_flags(fv: flags.FlagValues = flags.FLAGS) -> ReportSpec:
  """The ReportSpec the parsed flags describe (each field from the flag of its name)."""
  return ReportSpec(**{f.name: fv[f.name].value for f in dataclasses.fields(ReportSpec)})


# ----------------------------------------------------------------------------
# Per (cell, seed): the frame that tests over seeds read.


def per_seed_records(groups: Sequence[runs_lib.Group], metrics: Sequence[str]) -> list[dict]:
  """One record per (cell, seed): the cell's label, the seed, the workdir, and each run's last value of every
  metric (None where it has none). What a table of tests over seeds (scipy.stats, sacrebleu) starts from."""
  return [{"cell": g.label, "seed": r.seed, "workdir": r.workdir,
           **{m: (r.last(m) or (None, None))[1] for m in metrics}} for g in groups for r in g.runs]


def per_seed_table(records: Sequence[dict], metric: str, digits: int = 2) -> str:
  """The per-(cell, seed) records as a Markdown table: a row per cell, the metric of each seed in seed order.

  The place for statistics over seeds: a later change adds their columns here, from the same records."""
  cells: dict[str, list[dict]] = {}
  for r in records:
    cells.setdefault(r["cell"], []).append(r)
  rows = [[cell, ", ".join(render.fmt(r[metric], digits) for r in sorted(rs, key=lambda r: str(r["seed"])))]
          for cell, rs in cells.items()]
  return render.markdown_table(["cell", f"{metric} per seed"], rows)
