"""A report's groups beside the same configs trained for a shorter budget (``ReportSpec.shorter``).

A run of the shorter budget is the same cell when its config equals the
group's but for :data:`BUDGET_KEYS` (how long it trained, how often and how
it was evaluated, checkpointing) and the seed. Per group the section shows
the report's metric at both budgets (mean [min, max] over the seeds), the
change of the means, and whether the two seed ranges are apart by more than
the noise floor of the data set's metric (``experiments.noise``: the floor
of each budget, the larger of the two across budgets): a change
is "not separated" otherwise, and "not judged" when a side has one seed (its
seed range is unmeasured). The paper's number for the cell is set beside
it where Shaw et al. have one (:func:`experiments.paper.cell`). Then every
pair of cells is judged at both budgets, and the verdicts that changed with
training are listed before those that held. Last, each run is set beside
its seed's shorter run at that run's last training record: the same
learning rate there says the schedule does not depend on the budget up to
it, and the difference of the training losses shows how far the longer run
retraces the shorter one. Runs that reached their cap without meeting
their plateau rule (:func:`experiments.runs.capped`) are marked
where their step is given and in each verdict they enter: their number is
not a converged one.
"""

from __future__ import annotations

from typing import Optional, Sequence

from experiments import baselines
from experiments import columns
from experiments import noise
from experiments import paper
from experiments import render
from experiments import runs as runs_lib
from rpr import config as config_lib

BUDGET_KEYS = ("seed", "num_train_steps", "eval_every_steps", "eval_splits", "final_eval_splits", "decode_method",
               "final_decode_method", "checkpoint_every_steps", "keep_checkpoints", "log_every_steps", "tensorboard",
               *config_lib.PLATEAU_KEYS)


NOT_JUDGED = "not judged (one seed)"


def cell(config: dict) -> str:
  """What a config trains, without its budget: equal for one cell at any budget."""
  return runs_lib.canonical({k: v for k, v in config.items() if k not in BUDGET_KEYS})


def separation(a: Sequence[float], b: Sequence[float], floor: Optional[float], lower_is_better: bool) -> str:
  """:func:`experiments.noise.verdict` of two cells' seeds, or "not judged (one seed)" when a cell has a single
  seed: its range between seeds is not measured."""
  if min(len(a), len(b)) < 2:
    return NOT_JUDGED
  return noise.verdict(a, b, floor, lower_is_better)


def _spread(values: Sequence[float], digits: int) -> str:
  s = runs_lib.spread(values)
  return f"{s['mean']:.{digits}f}" if s["n"] == 1 else f"{s['mean']:.{digits}f} [{s['min']:.{digits}f}, " \
                                                       f"{s['max']:.{digits}f}]"


def shorter_values(report: columns.Report, shorter: Sequence[runs_lib.RunRecord],
                   metric: Optional[str] = None) -> list[list[tuple[int, float]]]:
  """Per group, (step, value) of ``metric`` (default the report's) in each of the ``shorter`` runs of its cell."""
  metric = metric or report.spec.metric
  return [[p for r in shorter if cell(r.config) == cell(g.config) and (p := r.last(metric)) is not None]
          for g in report.groups]


def _at(run: runs_lib.RunRecord, step: int, metric: str) -> Optional[float]:
  return next((float(r[metric]) for r in run.records if r["step"] == step and isinstance(r.get(metric), (int, float))),
              None)


def retrace_rows(report: columns.Report, shorter: Sequence[runs_lib.RunRecord]) -> list[list[str]]:
  """Per group, each run beside its seed's shorter run at that run's last training record (step S): whether the
  learning rate at S is the same in both, and the training loss at S, this budget minus the shorter."""
  keys = ("train/learning_rate", "train/loss")
  out = []
  for g in report.groups:
    found = []  # (seed, S, this run's values at S, the shorter run's)
    for run in g.runs:
      twin = next((r for r in shorter if cell(r.config) == cell(g.config) and r.seed == run.seed), None)
      last = twin.last("train/loss") if twin else None
      if last is not None:
        mine, theirs = [_at(run, last[0], k) for k in keys], [_at(twin, last[0], k) for k in keys]
        if None not in mine + theirs:
          found.append((run.seed, last[0], mine, theirs))
    if found:
      same = all(abs(m[0] - t[0]) <= 1e-6 * abs(t[0]) for _, _, m, t in found)
      out.append([g.label, ", ".join(str(seed) for seed, *_ in found), runs_lib.step_range([s for _, s, _, _ in found]),
                  "same" if same else "differs", ", ".join(f"{m[1] - t[1]:+.4f}" for _, _, m, t in found)])
  return out


def _floor(group: runs_lib.Group, metric: str, *budgets: Optional[int]) -> Optional[float]:
  """The floor of ``metric`` on the group's data set for numbers of each of ``budgets`` (:func:`noise.floor_of`)."""
  found = noise.floor_of(group.config.get("dataset"), metric, *budgets)
  return None if found is None else found[0]


def shorter_budgets(report: columns.Report, shorter: Sequence[runs_lib.RunRecord]) -> list[Optional[int]]:
  """Per group, the budget (``num_train_steps``) of the shorter runs of its cell: the largest if they differ."""
  return [max((r.config["num_train_steps"] for r in shorter if cell(r.config) == cell(g.config)
               and r.config.get("num_train_steps") is not None), default=None) for g in report.groups]


def rows(report: columns.Report, short: Sequence[Sequence[tuple[int, float]]],
         short_budgets: Sequence[Optional[int]]) -> list[list[str]]:
  metric, digits = report.spec.metric, report.digits
  out = []
  for g, points, budget in zip(report.groups, short, short_budgets):
    step = runs_lib.step_range([s for s, _ in g.points]) + (" (cap)" if g.capped else "")
    cells = [g.label, f"{len(g.values)}", step, _spread(g.values, digits)]
    if points:
      values = [v for _, v in points]
      cells += [f"{len(points)}", runs_lib.step_range([s for s, _ in points]), _spread(values, digits),
                f"{runs_lib.spread(g.values)['mean'] - runs_lib.spread(values)['mean']:+.{digits}f}",
                separation(g.values, values, _floor(g, metric, g.config.get("num_train_steps"), budget),
                           baselines.lower_is_better(metric))]
    else:
      cells += ["0", "-", "-", "-", "-"]
    if _bleu(report):
      found = paper.cell(g.config)
      cells.append("-" if found is None else f"{found[1]:.1f} ({found[0].replace('table', 'T')})")
    out.append(cells)
  return out


def _values(report: columns.Report, group: runs_lib.Group, metric: str) -> list[float]:
  """The group's values of ``metric``: its points for the report's metric, else each run's last value of it."""
  if metric == report.spec.metric:
    return group.values
  return [p[1] for r in group.runs if (p := r.last(metric)) is not None]


def pairs(report: columns.Report, short: Sequence[Sequence[tuple[int, float]]],
          short_budgets: Sequence[Optional[int]], metric: Optional[str] = None) -> list[str]:
  """Every pair of groups that both have shorter runs, judged on ``metric`` (default the report's) at both
  budgets: which verdicts held, which changed (:func:`separation` of the first against the second, with the data
  set's floor of ``metric`` at each budget). A pair with one seed in a cell at either budget is counted, not
  judged."""
  metric = metric or report.spec.metric
  lower = baselines.lower_is_better(metric)
  judged = [(g, _values(report, g, metric), [v for _, v in p], budget)
            for g, p, budget in zip(report.groups, short, short_budgets) if p]
  held, changed, unjudged = [], [], 0
  for i, (a, a_now, a_short, a_budget) in enumerate(judged):
    for b, b_now, b_short, b_budget in judged[i + 1:]:
      now = _floor(a, metric, a.config.get("num_train_steps"), b.config.get("num_train_steps"))
      before = separation(a_short, b_short, _floor(a, metric, a_budget, b_budget), lower)
      after = separation(a_now, b_now, now, lower)
      if NOT_JUDGED in (before, after):
        unjudged += 1
        continue
      (held if before.split(" by ")[0] == after.split(" by ")[0] else changed).append(
          f"{a.label} against {b.label}: {before} at the shorter budget, {after} at this one "
          f"({len(a_now)} and {len(b_now)} runs{_capped_note(a, b)})")
  if not held and not changed and not unjudged:
    return []
  skipped = (f" {unjudged} pair{'s are' if unjudged != 1 else ' is'} not judged: one of their cells has a single "
             "seed at a budget, whose range between seeds is not measured." if unjudged else "")
  verdicts = f"{len(held)} verdict{'s' * (len(held) != 1)} held, {len(changed)} changed"
  return [f"Each pair of cells at both budgets ({verdicts}).{skipped}", "",
          *(f"- changed: {line}" for line in changed), *(f"- held: {line}" for line in held), ""]


def _judged(report: columns.Report, shorter: Sequence[runs_lib.RunRecord]) -> list[str]:
  """The pairs once more on each of the report's ``judge`` metrics, each held to its own floor."""
  out = []
  for metric in report.spec.judge:
    floor_text = noise.floors_text([g.config.get("dataset") for g in report.groups], metric, _budgets(report, shorter))
    found = pairs(report, shorter_values(report, shorter, metric), shorter_budgets(report, shorter), metric)
    out += [f"On {metric} (each run's last value), held to its own noise floor: {floor_text}.", "",
            *(found or ["No pair of cells has runs with it at both budgets.", ""])]
  return out


def _capped_note(*groups: runs_lib.Group) -> str:
  found = [f"{g.capped} of {g.label} at the cap" for g in groups if g.capped]
  return f"; {', '.join(found)}" if found else ""


def _bleu(report: columns.Report) -> bool:
  return report.spec.metric.endswith("/bleu")


@columns.section("budgets", order=4, shown=lambda report: bool(report.spec.shorter), reads=("shorter", "judge"))
def budgets_section(report: columns.Report) -> list[str]:
  """Each group beside its cell at the shorter budget, and whether the change is above the noise floor."""
  metric, shorter = report.spec.metric, runs_lib.load_runs(report.spec.shorter)
  short, short_budgets = shorter_values(report, shorter), shorter_budgets(report, shorter)
  floor_text = noise.floors_text([g.config.get("dataset") for g in report.groups], metric, _budgets(report, shorter))
  header = ["variant", "runs", "step", f"{metric}", "shorter: runs", "step", f"{metric}", "change of means",
            "this budget against the shorter", *(["paper (BLEU, table)"] if _bleu(report) else [])]
  paper_text = (" The paper's BLEU is that of the one table that varies what the cell varies: T1 newstest2014, "
                "T2 and T3 newstest2013." if _bleu(report) else "")
  if any(g.capped for g in report.groups):
    paper_text += (" A step marked (cap) has runs that reached the cap without meeting their plateau rule: their "
                   "number is not a converged one, and a verdict in which such a cell is the worse may change with "
                   "more training.")
  return [f"At this budget and at the shorter one (the same cells in the runs of {', '.join(report.spec.shorter)}; "
          f"mean [min, max] over seeds). A change counts only when the two ranges are apart by more than the "
          f"noise floor of {metric}: {floor_text}.{paper_text}", "",
          render.markdown_table(header, rows(report, short, short_budgets),
                                ["---"] + [render.RIGHT] * (len(header) - 1)), "",
          *pairs(report, short, short_budgets), *_judged(report, shorter), *_retrace(report, shorter)]


def _budgets(report: columns.Report, shorter: Sequence[runs_lib.RunRecord]) -> list[int]:
  """The budgets (``num_train_steps``) of the report's groups and of their shorter runs."""
  found = [g.config.get("num_train_steps") for g in report.groups] + shorter_budgets(report, shorter)
  return sorted({b for b in found if b is not None})


def _retrace(report: columns.Report, shorter: Sequence[runs_lib.RunRecord]) -> list[str]:
  found = retrace_rows(report, shorter)
  if not found:
    return []
  return ["Each run beside its seed's run at the shorter budget, at that run's last training record (step S): "
          "whether the learning rate at S is the same in both, that is whether the schedule does not depend on the "
          "budget up to S, and the training loss at S (mean of the steps since the record before), this budget "
          "minus the shorter, per seed:", "",
          render.markdown_table(["variant", "seeds", "S", "learning rate at S", "train/loss at S, this - shorter"],
                                found, ["---", "---", render.RIGHT, "---", render.RIGHT]), ""]
