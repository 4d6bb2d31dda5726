"""Tabulates and plots finished runs: a Markdown table, a CSV, a JSON of every run and a PNG.

  python -m experiments.report "workdirs/sweeps/table2_cpu/*/*" --metric test/exact_match \\
      --x max_distance --paper table2 --out experiments/results/table2_cpu
  python -m experiments.report "workdirs/sweeps/length/*/*" --by_length --out experiments/results/length

Runs are read from the workdirs the globs match (each with ``config.json``
and ``metrics.jsonl``) and grouped by their config with the seed left out, so
the seeds of one variant form a group; a group is named by the config keys
that tell the groups apart (``max_distance=4``). A run's value is the metric
in the last record of ``metrics.jsonl`` that has it. Each group gets the mean,
the sample standard deviation (ddof 1; "-" for a single run) and the min and
max over its runs, and, with ``--paper tableN``, Shaw et al.'s number for the
cell its config describes (experiments/paper.py).

``--bound bag`` / ``--bound reversal`` (arithmetic runs) hold each group to
the ceiling its scheme allows (:mod:`experiments.arithmetic`: ``bag`` for no
position information, ``reversal`` for symmetric ALiBi): a column of the
table, lines on the plot, checks that every run stays under it, and the
bounds' three forms (whole set, fitted on train, test-split oracle), cached in
``--out`` as ``bounds.json``. ``--target T`` checks that every run of every
other group reaches T. ``--attention`` draws the encoder attention maps of
"21+211" and "12+1" from the lowest-seed run of each group (its checkpoint).

``--curve M1 --curve M2 ...`` also draws ``curve.png``: per group, the mean
(and min-max band) of the metrics M1, M2, ... in order, as one line over
them: perplexity at 1x, 2x, 4x, 8x the context, or BLEU per source-length
bucket.

``--x KEY`` orders the groups by a numeric config key and plots the metric
against it (min-max whiskers, one dot per run). ``--by_length`` reads the
per-length exact match (``<split>/exact_match_by_length/<n>``, written with
``config.eval_by_length``) of every split and plots it against the length,
with the longest training length marked.

Outputs in ``--out``: ``table.md`` (headed by the command that regenerates
it), ``results.csv`` (one row per group, per length with ``--by_length``),
``runs.json`` (every run's workdir, seed and values) and ``plot.png``
(and ``curve.png`` with ``--curve``).
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import glob
import json
import math
import os
import re
import shlex
import sys
from typing import Any, Optional, Sequence

import numpy as np
from absl import app
from absl import flags

from experiments import paper
from rpr import run_config
from rpr import writers

_METRIC = flags.DEFINE_string("metric", None, "Metric name in metrics.jsonl, e.g. test/exact_match.")
_X = flags.DEFINE_string("x", None, "Numeric config key to order and plot the groups by, e.g. max_distance.")
_PAPER = flags.DEFINE_enum("paper", None, list(paper.TABLES), "The paper's table to print beside the metric.")
_BY_LENGTH = flags.DEFINE_bool("by_length", False, "Exact match against input length (eval_by_length runs).")
_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_TITLE = flags.DEFINE_string("title", None, "Plot title (default: the metric).")
_BOUND = flags.DEFINE_multi_enum("bound", [], ["bag", "reversal"],
                                 "Arithmetic runs: hold each group to the ceiling of what its scheme sees.")
_TARGET = flags.DEFINE_float("target", None, "Check that every run of every unbounded group reaches this value.")
_ALSO = flags.DEFINE_multi_string("also", [], "More metrics of the same runs: a column each (mean ± std [min, max]).")
_ATTENTION = flags.DEFINE_bool("attention", False, "Arithmetic runs: encoder attention maps of the lowest-seed runs.")
_CURVE = flags.DEFINE_multi_string("curve", [], "Metrics to draw in curve.png, in order, as one line per group over "
                                   "them (e.g. test/perplexity, then test_x2/perplexity, ...).")

IGNORED_KEYS = ("seed",)  # keys that differ between the runs of one group
SHORT_NAMES = {"position": "pe", "max_distance": "k", "use_keys": "aK", "use_values": "aV",
               "alibi_directional": "directional", "preset": "model"}
_BY_LENGTH_KEY = re.compile(r"^(?P<split>[^/]+)/exact_match_by_length/(?P<n>\d+)$")


@dataclasses.dataclass
class RunRecord:
  workdir: str
  config: dict  # flat by leaf name (flatten)
  records: list[dict]
  raw_config: dict = dataclasses.field(default_factory=dict)  # as in config.json

  @property
  def seed(self) -> Any:
    return self.config.get("seed")

  def last(self, metric: str) -> Optional[tuple[int, float]]:
    """(step, value) of the last record holding ``metric``; None if none does."""
    for r in reversed(self.records):
      if metric in r and isinstance(r[metric], (int, float)):
        return int(r["step"]), float(r[metric])
    return None

  def train_seconds(self) -> Optional[float]:
    """Training time from the logged step rates (no compilation, no evaluation); None without them."""
    seconds, previous = 0.0, 0
    for r in self.records:
      if r.get("train/steps_per_sec"):
        seconds += (r["step"] - previous) / r["train/steps_per_sec"]
        previous = r["step"]
    return seconds if previous else None

  def by_length(self) -> Optional[tuple[int, dict[int, float]]]:
    """(step, {length: exact match}) of the last record with per-length values, merged over splits."""
    for r in reversed(self.records):
      values = {int(m["n"]): float(v) for k, v in r.items() if (m := _BY_LENGTH_KEY.match(k))}
      if values:
        return int(r["step"]), dict(sorted(values.items()))
    return None


def load_runs(patterns: Sequence[str]) -> list[RunRecord]:
  """Every workdir matched by ``patterns`` that holds ``config.json`` and ``metrics.jsonl``, sorted by path."""
  runs = []
  for workdir in sorted({p for pattern in patterns for p in glob.glob(pattern)}):
    config_path, metrics_path = os.path.join(workdir, "config.json"), os.path.join(workdir, "metrics.jsonl")
    if not (os.path.isfile(config_path) and os.path.isfile(metrics_path)):
      continue
    with open(config_path, encoding="utf-8") as f:
      raw = json.load(f)["config"]
    with open(metrics_path, encoding="utf-8") as f:
      records = writers.dedupe([json.loads(line) for line in f if line.strip()])
    runs.append(RunRecord(workdir, flatten(with_engine_defaults(raw)), records, run_config.migrate(raw)))
  return runs


def with_engine_defaults(config: dict) -> dict:
  """``config`` with each engine key and position option it lacks set to its default (configs/base.py).

  A record written before a key existed ran as that key's default does, so it
  groups with the runs that record the default (``final_eval_splits = ()``).
  """
  from configs import base
  from rpr import run_config

  defaults = base.get_config().to_dict()
  config = run_config.migrate(config)
  return {**{k: defaults[k] for k in run_config.ENGINE_KEYS if k in defaults and k not in config}, **config}


def flatten(config: dict) -> dict:
  """A run config flat by leaf name: ``model.d_model`` -> ``d_model``, ``model.shaw.max_distance``
  -> ``max_distance``; a model key whose name the top level also has keeps its prefix (``model.max_length``)."""
  out = {k: v for k, v in config.items() if not isinstance(v, dict)}
  for key, value in config.items():
    if isinstance(value, dict):
      for leaf, v in flatten(value).items():
        out[leaf if leaf not in out else f"{key}.{leaf}"] = v
  return out


def _canonical(value: Any) -> str:
  return json.dumps(value, sort_keys=True)


def group_runs(runs: Sequence[RunRecord]) -> list[tuple[dict, list[RunRecord]]]:
  """Runs grouped by config without ``IGNORED_KEYS``: ``[(shared config, runs)]`` in first-seen order."""
  groups: dict[str, tuple[dict, list[RunRecord]]] = {}
  for run in runs:
    config = {k: v for k, v in run.config.items() if k not in IGNORED_KEYS}
    groups.setdefault(_canonical(config), (config, []))[1].append(run)
  return list(groups.values())


def labels(configs: Sequence[dict]) -> list[str]:
  """Short unique names from the keys whose values differ between ``configs``.

  A group shows the key with the most distinct values (first), every key without a
  single most common value, and any other key where it differs from the most
  common value (``pe=alibi, directional=True`` beside ``pe=alibi``). If that
  does not tell two groups apart, every differing key is shown.
  """
  if len(configs) < 2:
    return ["all runs"] * len(configs)
  keys = sorted({k for c in configs for k in c})
  values = {k: [_canonical(c.get(k)) for c in configs] for k in keys}
  differing = [k for k in keys if len(set(values[k])) > 1]
  primary = max(differing, key=lambda k: len(set(values[k])))
  differing.sort(key=lambda k: k != primary)  # the primary key first
  modes = {}
  for k in differing:
    (top, n), *rest = collections.Counter(values[k]).most_common(2) + [(None, 0)]
    modes[k] = top if n > rest[0][1] else None

  def name(c, shown):
    return ", ".join(f"{SHORT_NAMES.get(k, k)}={c.get(k)}" for k in shown)

  out = [name(c, [k for k in differing if k == primary or modes[k] is None or _canonical(c.get(k)) != modes[k]])
         for c in configs]
  if len(set(out)) < len(out):
    out = [name(c, differing) for c in configs]
  return out


def spread(values: Sequence[float]) -> dict[str, float]:
  """n, mean, sample std (nan for one value), min and max."""
  v = np.asarray(values, np.float64)
  return {"n": len(v), "mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else math.nan,
          "min": float(v.min()), "max": float(v.max())}


def _fmt(value: Optional[float], digits: int) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "-"
  return f"{value:.{digits}f}"


def _steps(steps: Sequence[int]) -> str:
  lo, hi = min(steps), max(steps)
  return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _numeric(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


# ----------------------------------------------------------------------------
# One metric per group (tables 1-3).


def summarise(runs: Sequence[RunRecord], metric: str, x: Optional[str] = None,
              paper_table: Optional[str] = None) -> list[dict]:
  """One row per group: label, x, spread of ``metric`` over its runs, steps, the paper's number."""
  grouped = [(c, [(r, r.last(metric)) for r in rs]) for c, rs in group_runs(runs)]
  grouped = [(c, [(r, v) for r, v in rs if v is not None]) for c, rs in grouped]
  grouped = [(c, rs) for c, rs in grouped if rs]
  if not grouped:
    raise ValueError(f"no run holds the metric {metric!r}")
  names = labels([c for c, _ in grouped])
  rows = []
  for (config, rs), name in zip(grouped, names):
    rs = sorted(rs, key=lambda rv: _canonical(rv[0].seed))
    seconds = [r.train_seconds() for r, _ in rs]
    rows.append({"variant": name, "x": config.get(x) if x else None, **spread([v for _, (_, v) in rs]),
                 "steps": _steps([s for _, (s, _) in rs]),
                 "paper": paper.lookup(paper_table, config) if paper_table else None,
                 "train_minutes": (float(np.mean(seconds)) / 60 if all(t is not None for t in seconds) else None),
                 "config": config,
                 "runs": [{"workdir": r.workdir, "seed": r.seed, "step": s, "value": v} for r, (s, v) in rs]})
  if x:
    if not all(_numeric(r["x"]) for r in rows):
      raise ValueError(f"--x {x}: every group needs a numeric config.{x}, got {[r['x'] for r in rows]}")
    rows.sort(key=lambda r: r["x"])
  return rows


def metric_table(rows: Sequence[dict], metric: str, paper_table: Optional[str],
                 bound: Optional[dict[str, float]] = None) -> str:
  """One row per group; with ``bound``, each group's ceiling (whole set / test-split oracle)."""
  digits = 4 if all(abs(r["max"]) <= 1 for r in rows) else 2
  header = ["variant", "runs", "step", f"{metric} mean", "std", "min", "max", "per seed"]
  header += ["ceiling (whole set / test oracle)"] if bound is not None else []
  header += ["train min per run"] if all(r["train_minutes"] is not None for r in rows) else []
  header += [f"paper ({paper_table}, BLEU)"] if paper_table else []
  body = []
  for r in rows:
    cells = [r["variant"], str(r["n"]), r["steps"]] + [_fmt(r[k], digits) for k in ("mean", "std", "min", "max")]
    cells.append(", ".join(f"{run['value']:.{digits}f}" for run in r["runs"]))
    if bound is not None:
      view = r.get("view")
      cells.append(f"{view}: {bound[view + '_all']:.4f} / {bound[view + '_test']:.4f}" if view else "sees the order")
    if "train min per run" in header:
      cells.append(f"{r['train_minutes']:.1f}")
    if paper_table:
      cells.append(_fmt(r["paper"], 1))
    body.append(cells)
  return _markdown(header, body)


def also_table(runs: Sequence[RunRecord], rows: Sequence[dict], metrics: Sequence[str]) -> str:
  """Per group (as in ``rows``), each metric's mean ± std [min, max] over the group's runs at their last value
  (the value alone for a group of one run)."""
  by_workdir = {r.workdir: r for r in runs}
  body = []
  for r in rows:
    cells = [r["variant"]]
    for metric in metrics:
      values = [v for v in (by_workdir[run["workdir"]].last(metric) for run in r["runs"]) if v is not None]
      s = spread([v for _, v in values]) if values else None
      cells.append("-" if s is None else f"{s['mean']:.4g}" if s["n"] == 1 else
                   f"{s['mean']:.4g} ± {_fmt(s['std'], 2)} [{s['min']:.4g}, {s['max']:.4g}]")
    body.append(cells)
  return _markdown(["variant", *metrics], body)


def metric_plot(rows: Sequence[dict], metric: str, x: Optional[str], paper_table: Optional[str], path: str,
                title: Optional[str] = None, lines: Sequence[tuple[str, float]] = ()) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  pos = [r["x"] for r in rows] if x else list(range(len(rows)))
  mean = np.array([r["mean"] for r in rows])
  err = np.array([[r["mean"] - r["min"] for r in rows], [r["max"] - r["mean"] for r in rows]])
  if x:
    ax.errorbar(pos, mean, yerr=err, marker="o", capsize=3, label=f"measured (mean, min-max over runs)")
    if max(pos) > 8 * max(min(p for p in pos if p > 0) if any(p > 0 for p in pos) else 1, 1):
      ax.set_xscale("symlog", base=2, linthresh=1)
    ax.set_xlabel(x)
  else:
    ax.bar(pos, mean, yerr=err, capsize=3, alpha=0.7, label="measured (mean, min-max over runs)")
    ax.set_xticks(pos, [r["variant"] for r in rows], rotation=20, ha="right")
  for p, r in zip(pos, rows):
    ax.plot([p] * len(r["runs"]), [run["value"] for run in r["runs"]], ".", color="k", alpha=0.5)
  ax.set_ylabel(metric)
  for (label, value), style in zip(lines, (":", "--")):
    ax.axhline(value, color="tab:gray", linestyle=style, label=label)
  if paper_table and any(r["paper"] is not None for r in rows):
    twin = ax.twinx()
    twin.plot([p for p, r in zip(pos, rows) if r["paper"] is not None],
              [r["paper"] for r in rows if r["paper"] is not None], "s--" if x else "s", color="tab:red", alpha=0.8)
    twin.set_ylabel(f"paper BLEU ({paper_table}, red)", color="tab:red")
  ax.legend(loc="best", fontsize=8)
  ax.set_title(title or metric)
  fig.tight_layout()
  fig.savefig(path, dpi=120, metadata={"Software": None})
  plt.close(fig)


def curve_plot(runs: Sequence[RunRecord], rows: Sequence[dict], metrics: Sequence[str], path: str,
               title: Optional[str] = None) -> dict[str, list[float]]:
  """One line per group over ``metrics`` (in order): the mean over its runs, a min-max band; returns the means."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  by_workdir = {r.workdir: r for r in runs}
  fig, ax = plt.subplots(figsize=(7.4, 4.2))
  means = {}
  for r in rows:
    values = [[(by_workdir[run["workdir"]].last(m) or (None, math.nan))[1] for m in metrics] for run in r["runs"]]
    values = np.array(values, dtype=float)
    means[r["variant"]] = np.nanmean(values, axis=0).tolist()
    line, = ax.plot(range(len(metrics)), means[r["variant"]], marker="o", label=r["variant"])
    if len(values) > 1:
      ax.fill_between(range(len(metrics)), np.nanmin(values, axis=0), np.nanmax(values, axis=0),
                      color=line.get_color(), alpha=0.15, linewidth=0)
  ax.set_xticks(range(len(metrics)), metrics, rotation=15, ha="right", fontsize=8)
  ax.set_ylabel("mean over runs (band: min-max)")
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  ax.set_title(title or f"{metrics[0]} ... {metrics[-1]}")
  fig.tight_layout()
  fig.savefig(path, dpi=120, metadata={"Software": None})
  plt.close(fig)
  return means


# ----------------------------------------------------------------------------
# Exact match against length.


def summarise_by_length(runs: Sequence[RunRecord]) -> list[dict]:
  """One row per group: label, longest training length, and per length the spread over its runs."""
  grouped = [(c, [(r, r.by_length()) for r in rs]) for c, rs in group_runs(runs)]
  grouped = [(c, [(r, v) for r, v in rs if v is not None]) for c, rs in grouped]
  grouped = [(c, rs) for c, rs in grouped if rs]
  if not grouped:
    raise ValueError("no run holds per-length values (<split>/exact_match_by_length/<n>; set eval_by_length)")
  names = labels([c for c, _ in grouped])
  rows = []
  for (config, rs), name in zip(grouped, names):
    lengths = sorted(set.intersection(*(set(v) for _, (_, v) in rs)))
    per_length = {n: spread([v[n] for _, (_, v) in rs]) for n in lengths}
    train_max = config.get("max_length")
    seen = [np.mean([v[n] for n in lengths if n <= train_max]) for _, (_, v) in rs] if train_max else []
    longer = [np.mean([v[n] for n in lengths if n > train_max]) for _, (_, v) in rs
              if train_max and any(n > train_max for n in lengths)]
    rows.append({"variant": name, "n": len(rs), "steps": _steps([s for _, (s, _) in rs]), "train_max": train_max,
                 "lengths": per_length, "seen": spread(seen) if seen else None,
                 "longer": spread(longer) if longer else None,
                 "runs": [{"workdir": r.workdir, "seed": r.seed, "step": s, "values": v} for r, (s, v) in rs]})
  rows.sort(key=lambda r: r["variant"])
  return rows


def length_table(rows: Sequence[dict]) -> str:
  lengths = sorted({n for r in rows for n in r["lengths"]})
  header = ["variant", "runs", "step", "trained lengths", "longer lengths"] + [str(n) for n in lengths]

  def both(s):
    return "-" if s is None else f"{s['mean']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"

  body = [[r["variant"], str(r["n"]), r["steps"], both(r["seen"]), both(r["longer"])]
          + [_fmt(r["lengths"][n]["mean"], 2) if n in r["lengths"] else "-" for n in lengths] for r in rows]
  return _markdown(header, body)


def length_plot(rows: Sequence[dict], path: str, title: Optional[str] = None) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(8.4, 4.4))
  for r in rows:
    n = sorted(r["lengths"])
    mean = [r["lengths"][i]["mean"] for i in n]
    line, = ax.plot(n, mean, marker=".", label=r["variant"])
    ax.fill_between(n, [r["lengths"][i]["min"] for i in n], [r["lengths"][i]["max"] for i in n],
                    color=line.get_color(), alpha=0.15, linewidth=0)
  train_max = {r["train_max"] for r in rows if r["train_max"]}
  for t in train_max:
    ax.axvline(t + 0.5, color="k", linestyle="--", linewidth=1)
    ax.text(t + 0.6, 1.02, "longer than training", fontsize=8, va="bottom")
  ax.set_xlabel("input length (digits)")
  ax.set_ylabel("exact match (mean; band: min-max over runs)")
  ax.set_ylim(-0.02, 1.08)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  ax.set_title(title or "exact match against length")
  fig.tight_layout()
  fig.savefig(path, dpi=120, metadata={"Software": None})
  plt.close(fig)


# ----------------------------------------------------------------------------
# Writing.


def _write_csv(path: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row]
                     for row in rows)


def data_set_of(runs: Sequence[RunRecord]) -> str:
  """The one arithmetic data set (config name) all ``runs`` share."""
  names = {(r.config.get("dataset"), r.config.get("arithmetic_config")) for r in runs}
  if len(names) != 1 or next(iter(names))[0] != "arithmetic":
    raise ValueError(f"--bound needs runs of one arithmetic data set, got (dataset, config) {sorted(names)}")
  return next(iter(names))[1]


def write_report(patterns: Sequence[str], out: str, metric: Optional[str] = None, x: Optional[str] = None,
                 paper_table: Optional[str] = None, by_length: bool = False, title: Optional[str] = None,
                 command: Optional[str] = None, bound: Sequence[str] = (), target: Optional[float] = None,
                 attention: bool = False, also: Sequence[str] = (), curve: Sequence[str] = ()) -> list[dict]:
  """Reads the runs, writes table.md, results.csv, runs.json and plot.png to ``out``; returns the rows."""
  from experiments import arithmetic

  bound = (bound,) if isinstance(bound, str) else tuple(bound or ())
  curve = (curve,) if isinstance(curve, str) else tuple(curve or ())
  if set(bound) - set(arithmetic.VIEWS):
    raise ValueError(f"bound={list(bound)!r}; allowed: {list(arithmetic.VIEWS)}")
  runs = load_runs(patterns)
  if not runs:
    raise ValueError(f"no workdir with config.json and metrics.jsonl matches {list(patterns)}")
  os.makedirs(out, exist_ok=True)
  note, lines, ceilings = [], [], None
  if bound:
    name = data_set_of(runs)
    ceilings = arithmetic.bounds(name, os.path.join(out, "bounds.json"), bound)
    note = [arithmetic.bounds_text(name, ceilings), ""]
    lines = [(f"{v} bound, whole set ({ceilings[v + '_all']:.4f})", ceilings[v + "_all"]) for v in bound]
  if by_length:
    rows = summarise_by_length(runs)
    table = length_table(rows)
    _write_csv(os.path.join(out, "results.csv"), ["variant", "length", "runs", "mean", "std", "min", "max"],
               [[r["variant"], n, s["n"], s["mean"], s["std"], s["min"], s["max"]]
                for r in rows for n, s in r["lengths"].items()])
    length_plot(rows, os.path.join(out, "plot.png"), title)
    what = "exact match per input length (greedy decoding); trained/longer: mean [min, max] over runs"
  else:
    if not metric:
      raise ValueError("--metric is required (or --by_length)")
    rows = summarise(runs, metric, x, paper_table)
    for r in rows:
      r["view"] = arithmetic.blind_view(r["config"]) if bound else None
      r["view"] = r["view"] if r["view"] in bound else None
    table = metric_table(rows, metric, paper_table, ceilings)
    if also:
      table += "\n\n" + also_table(runs, rows, [metric, *also])
    _write_csv(os.path.join(out, "results.csv"),
               ["variant", "x", "runs", "steps", "mean", "std", "min", "max", "paper"],
               [[r["variant"], r["x"], r["n"], r["steps"], r["mean"], r["std"], r["min"], r["max"], r["paper"]]
                for r in rows])
    metric_plot(rows, metric, x, paper_table, os.path.join(out, "plot.png"), title, lines)
    if curve:
      curve_plot(runs, rows, curve, os.path.join(out, "curve.png"), title)
    what = f"{metric} at each run's last evaluation; std over runs with ddof 1"
    found = arithmetic.checks(rows, ceilings or {}, target)
    if found:
      note = ["Checks:", ""] + [f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in found] + [""] + note
    if attention:
      note += arithmetic.attention_section(rows, {r.workdir: r.raw_config for r in runs}, out)
  with open(os.path.join(out, "runs.json"), "w", encoding="utf-8") as f:
    json.dump([{k: r[k] for k in ("variant", "runs", "view", "row_difference_12+1") if k in r} for r in rows], f,
              indent=1, sort_keys=True)
  lines = []
  if command:
    lines += [f"Generated by `{command}`.", ""]
  counted = sum(r["n"] for r in rows)  # runs that hold the metric (an unfinished run's workdir does not)
  skipped = f" ({len(runs) - counted} more without it, unfinished)" if counted < len(runs) else ""
  lines += [f"{counted} runs{skipped} in {len(rows)} groups; {what}.", "", table, ""] + note
  with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return rows


def main(argv):
  if len(argv) < 2:
    raise app.UsageError("name one or more workdir globs, e.g. 'workdirs/sweeps/table2_cpu/*/*'")
  command = "python -m experiments.report " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  write_report(argv[1:], _OUT.value, _METRIC.value, _X.value, _PAPER.value, _BY_LENGTH.value, _TITLE.value,
               command=command, bound=_BOUND.value, target=_TARGET.value, attention=_ATTENTION.value,
               also=_ALSO.value, curve=_CURVE.value)
  print(open(os.path.join(_OUT.value, "table.md"), encoding="utf-8").read())


if __name__ == "__main__":
  app.run(main)
