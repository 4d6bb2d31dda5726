"""The one report writer: tables of run records, each row against a reference row. ``python -m experiments tables``
writes the protocol's (experiments/results/protocol.md; declared in :mod:`experiments.protocol`).

Each row of a :class:`~experiments.protocol.Table` reads the finished runs under its folder (``<root>/<folder>/
seed<s>``): the metric at the run's last step (:func:`frame`). Statistics come from :mod:`experiments.stats`
(Student-t CI per cell; Welch's difference, Holm within the table and the minimum detectable effect per row;
sacrebleu's paired bootstrap on the test set, :func:`bootstrap`), the rendering from :mod:`experiments.render`.

Written: ``<out>/README.md`` (every table, Markdown) and ``<out>/<table>.csv`` and ``.png`` (one row per cell and
seed; the plot). The README's results open with the tables between ``<!-- tables -->`` and ``<!-- /tables -->``,
copied from :func:`readme_block`; a test checks the copy. :func:`write_one` writes one table alone (``run.py``'s
comparison).
"""

from __future__ import annotations

import collections
import glob
import gzip
import hashlib
import json
import math
import os
import pathlib
import re
from typing import Callable, Optional, Sequence

from experiments import protocol, render, runs as runs_lib, stats
from experiments.protocol import Table
from rpr import records as records_lib

RESULTS = "experiments/results"
OUT = "experiments/results/paper"
MARKERS = ("<!-- tables -->", "<!-- /tables -->")
BOOTSTRAP = "bootstrap.json"  # in OUT: each paired bootstrap's p under its two output files' SHA-256


def frame(table: Table, root: str = RESULTS) -> list[dict]:
  """One record per (cell, seed) of the finished runs: cell, seed, steps and the table's CSV metrics at the run's
  last step (a run that has not reached its last step is left out), and the run (its curves, for :func:`plot`)."""
  out = []
  for row in table.rows:
    for run in runs_lib.load_runs(table.runs_of(row, root)):
      end = run.end()
      last = {k: v for r in run.records if r["step"] == end for k, v in r.items()}
      if table.metric not in last:
        continue
      out.append({"cell": row.cell, "seed": run.seed, "steps": end,
                  **{m: last.get(m) for m in dict.fromkeys((table.metric, *table.csv_metrics))}, "run": run})
  return sorted(out, key=lambda r: ([x.cell for x in table.rows].index(r["cell"]), r["seed"]))


def markdown(table: Table, records: Sequence[dict], boot: Optional[dict] = None) -> str:
  """The table: row, paper, ours (mean ± CI half-width, n, steps), difference to the reference with its CI, Holm p
  and the verdict (with the minimum detectable effect beside "not separated"); baselines beneath. With ``boot``
  (:func:`bootstrap`), a last column: of the seeds paired with the reference's, how many differ on the test set
  (paired bootstrap p < 0.05). Where the runs scored the mean of their last checkpoints (``test_avg/``, as the
  paper reports), its mean ± CI sits beside the final state's, untested."""
  values, comparisons = _compared(table, records)
  steps = {r.cell: sorted({x["steps"] for x in records if x["cell"] == r.cell}) for r in table.rows}
  averaged = [m for m in [table.metric.replace("test/", "test_avg/")] if any(x.get(m) is not None for x in records)]
  digits = table.digits
  f = lambda v: render.fmt(v, digits)  # noqa: E731
  mean_ci = lambda c: f"{f(c.mean)} ± {f((c.high - c.low) / 2)}" if c.n > 1 else f(c.mean)  # noqa: E731
  rows = []
  for r in table.rows:
    v, head = values[r.cell], [r.paper_row or "-", f"`{r.cell}`", f(r.paper)]  # the row, and the paper's beside it
    if not v:
      rows.append([*head, "no finished run", "", *[""] * len(averaged), "", "", ""])
      continue
    c, cmp = stats.cell(v), comparisons.get(r.cell)
    avg = [[x[m] for x in records if x["cell"] == r.cell and x.get(m) is not None] for m in averaged]
    ours = [mean_ci(c), f"{c.n} ({'/'.join(f'{s:,}' for s in steps[r.cell])})",
            *(mean_ci(stats.cell(a)) if len(a) == c.n else "-" for a in avg)]  # "-": not every seed averaged
    if r.cell == table.reference:
      compared = ["reference", "", ""]
    elif cmp is None or math.isnan(cmp.p_holm):
      compared = [f"{cmp.diff:+.{digits}f}" if cmp else "", "", "not tested (< 2 seeds a side)"]
    else:
      compared = [_interval(cmp, digits), _p(cmp.p_holm), _said(table, cmp, f"not separated (MDE {f(cmp.mde)})")]
    rows.append([*head, *ours, *compared])
  rows += [[name, "baseline", "", f(value), "", *[""] * len(averaged), "", "", ""] for name, value in table.baselines]
  header = ["paper's row", "cell", "paper", "ours (mean ± 95% CI)", "n (steps)",
            *["last checkpoints averaged"] * len(averaged), f"vs `{table.reference}` [95% CI]", "Holm p", "verdict"]
  if boot:
    header.append("test set: seeds with p < 0.05")
    for row in rows:
      ps = boot.get(row[1].strip("`"), [])
      row.append(f"{sum(p < stats.ALPHA for p in ps)} of {len(ps)}" if ps else "")
  align = ["---", "---", *[render.RIGHT] * (5 + len(averaged)), "---", *([render.RIGHT] if boot else [])]
  if not any(r.paper_row or r.paper is not None for r in table.rows):  # nothing of the paper's (run.py's table)
    header, align = [header[1], *header[3:]], [align[1], *align[3:]]
    rows = [[row[0] if row[1] == "baseline" else row[1], *row[3:]] for row in rows]
  text = f"**{table.title}**\n\n" + render.markdown_table(header, rows, align)
  return text + (f"\n\n{table.note}" if table.note else "")


def _said(table: Table, cmp, apart: str) -> str:
  """A comparison's verdict as a reader takes it: ``apart`` where not separated; a separated one says whether the
  row is better or worse than the reference (lower is better for a perplexity or a loss)."""
  if cmp.verdict == "not separated":
    return apart
  lower_better = any(m in table.metric for m in ("perplexity", "loss"))
  return f"{cmp.verdict} ({'better' if (cmp.diff < 0) == lower_better else 'worse'})"


def _compared(table: Table, records: Sequence[dict]) -> tuple[dict, dict]:
  """Each row's values, and each row with values against the reference (:func:`stats.compare`)."""
  values = {r.cell: [x[table.metric] for x in records if x["cell"] == r.cell] for r in table.rows}
  reference = values[table.reference]
  tested = {c: v for c, v in values.items() if c != table.reference and v}
  return values, (stats.compare(reference, tested, table.reference) if reference else {})


def answers(shown: Sequence[tuple[Table, list]]) -> str:
  """One line per question: its table's verdict for each of its rows (rows with one verdict share a clause)."""
  by_name = {t.name.removeprefix("history_"): (t, records) for t, records in shown}
  lines = []
  for question, name, cells in protocol.QUESTIONS:
    if name not in by_name:
      continue
    table, records = by_name[name]
    _, comparisons = _compared(table, records)
    clauses: dict[str, list[str]] = {}
    for cell in cells:
      cmp = comparisons.get(cell)
      if cmp is not None and cmp.verdict not in ("not tested",):
        verdict = _said(table, cmp, f"not separated from `{table.reference}`")
        clauses.setdefault(verdict, []).append(f"`{cell}` ({_interval(cmp)}, p {_p(cmp.p_holm)})")
    if clauses:
      said = "; ".join(f"{', '.join(c)}: {v}" for v, c in clauses.items())
      lines.append(f"- **{question}** ({table.title.split(' (')[0]}): {said}.")
  return "\n".join(lines)


def decoded(table: Table, cell: str, root: str) -> dict[int, str]:
  """Seed -> its final-state test outputs (``<run>/decoded/<split>.txt.gz``), for the runs that kept them."""
  outputs = os.path.join("decoded", f"{table.metric.split('/')[0]}.txt.gz")
  runs = [run for pattern in table.runs_of(next(r for r in table.rows if r.cell == cell), root)
          for run in glob.glob(pattern)]
  return {int(os.path.basename(run).removeprefix("seed")): os.path.join(run, outputs) for run in runs
          if os.path.exists(os.path.join(run, outputs))}


def _lines(path: str) -> list[str]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return f.read().splitlines()


def _digest(*paths: str) -> str:
  return hashlib.sha256(b"".join(pathlib.Path(p).read_bytes() for p in paths)).hexdigest()[:16]


def bootstrap(table: Table, root: str, cache: dict, references: Callable[[str], list[str]]) -> dict[str, list[float]]:
  """Per cell, sacrebleu's paired bootstrap p of each seed's test outputs against the reference cell's same seed
  (BLEU tables whose runs kept their outputs). ``cache`` (``bootstrap.json``) holds each p under the pair's files'
  SHA-256, so a table is recomputed only where an output changed; ``references(run dir)`` gives the test split's
  references of a run (the data set is built only for a pair not in the cache)."""
  if not table.metric.endswith("/bleu"):
    return {}
  ours, out = decoded(table, table.reference, root), {}
  for row in table.rows:
    mine = decoded(table, row.cell, root) if row.cell != table.reference else {}
    for seed in sorted(set(mine) & set(ours)):
      key = f"{table.name}/{row.cell}/seed{seed}/{_digest(ours[seed], mine[seed])}"
      if key not in cache:
        a, b = _lines(ours[seed]), _lines(mine[seed])
        cache[key] = stats.paired_bootstrap(references(os.path.dirname(os.path.dirname(ours[seed])))[:len(a)], a, b)
      out.setdefault(row.cell, []).append(cache[key])
  return out


def test_references(run_dir: str) -> list[str]:
  """The raw references of the test split the run at ``run_dir`` was scored on (its data set, built if absent)."""
  from rpr import data, record

  return data.get_task(record.load(run_dir).data, run_dir).references("test")


def plot(table: Table, records: Sequence[dict], path: str) -> None:
  """The table's cells (:func:`render.table_plot`): final values per seed, and the validation curves."""
  curve = table.metric.replace("test/", "validation/")
  cells = []
  for row in table.rows:
    mine = [r for r in records if r["cell"] == row.cell]
    if mine:
      cells.append((row.cell, [r[table.metric] for r in mine], [runs_lib.series(r["run"], curve) for r in mine]))
  render.table_plot(path, table.title, table.metric, cells, table.baselines, curve)


def budget_section(root: str = RESULTS) -> str:
  """The budget rule (protocol.md) applied to the pilots' finished runs, as a table and its decision."""
  out = []
  for folder, metric, cells, budgets in protocol.PILOTS:
    finished = lambda c, b: [r.last(metric)[1] for r in runs_lib.load_runs([f"{root}/{folder}/{c},steps={b}/seed*"])
                             if r.end() is not None and (r.last(metric) or (None,))[0] == r.end()]  # noqa: E731
    values = {b: {c: finished(c, b) for c in cells} for b in budgets}
    steps, chosen = stats.budget_rule(values)
    rows = [[f"{s.budget:,} vs {s.larger:,}", *[f"{a:.2f} / {b:.2f}" for a, b in s.means.values()], f"{s.sd:.2f}",
             "holds" if s.within else "fails"] for s in steps]
    header = ["budgets", *[f"`{c}` mean ({metric})" for c in cells], "pooled SD at the larger", "rule"]
    judged = {(s.budget, s.larger) for s in steps}
    waiting = ", ".join(f"{a:,} vs {b:,}" for a, b in zip(budgets, budgets[1:]) if (a, b) not in judged)
    if chosen is None:
      decision = f"no budget chosen yet: {waiting} judged once each has 2 finished seeds of every cell"
    else:
      decision = f"the budget is {chosen:,} steps" + ("" if any(s.within for s in steps) else
                                                      ", the largest: every pair fails")
    out.append(f"**Budget rule, `{folder}`** ({decision})\n\n" + render.markdown_table(header, rows))
  return "\n\n".join(out)


def _interval(cmp, digits: int = 2) -> str:
  """A row's difference to the reference with its 95% CI: ``+1.20 [+0.30, +2.10]``."""
  return f"{cmp.diff:+.{digits}f} [{cmp.low:+.{digits}f}, {cmp.high:+.{digits}f}]"


def _p(p: float) -> str:
  return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _cache(out: str) -> dict:
  path = pathlib.Path(out, BOOTSTRAP)
  return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _not_cached(run_dir: str) -> list[str]:
  raise ValueError(f"{BOOTSTRAP} has no paired bootstrap of {run_dir}'s test outputs: run python -m experiments "
                   "tables")


def readme_block(tables: Sequence[Table], root: str = RESULTS, out: str = OUT) -> str:
  """The README's results (between :data:`MARKERS`): each five-seed table once a row is tested against its reference
  (2 seeds a side), else its history twin (``history_<name>``); the three questions' answers; then the pilots and
  their budget rule. The paired bootstraps come from ``<out>/bootstrap.json`` (:func:`write`)."""
  cache = _cache(out)
  by_name, shown = {t.name: t for t in tables}, []
  for t in tables:
    if t.headline:
      records, twin = frame(t, root), by_name.get(f"history_{t.name}")
      seeds = collections.Counter(r["cell"] for r in records)  # a test needs 2 seeds a side
      tested = seeds[t.reference] > 1 and any(n > 1 for cell, n in seeds.items() if cell != t.reference)
      if tested or twin is not None:  # a table with neither a test nor history waits for its runs
        shown.append((t, records) if tested else (twin, frame(twin, root)))
  said = answers(shown)  # right under the paper's tables; the pilots, then the budget their runs fixed, below
  said = [f"The three questions, as the tables answer them (difference [95% CI], Holm p):\n\n{said}"] if said else []
  text = {t.name: markdown(t, records, boot=bootstrap(t, root, cache, _not_cached)) for t, records in shown}
  pilots = [name for name in text if name.startswith("pilot_")]
  return "\n\n".join([*(v for k, v in text.items() if k not in pilots), *said, *(text[k] for k in pilots),
                       budget_section(root)])


def section(table: Table, root: str, out: str, cache: dict, references: Callable[[str], list[str]]) -> str:
  """The table in Markdown and, with finished runs, its CSV (a row per cell and seed) and plot in ``out``."""
  records = frame(table, root)
  text = markdown(table, records, boot=bootstrap(table, root, cache, references))
  if records:
    columns = list(dict.fromkeys(("cell", "seed", "steps", table.metric, *table.csv_metrics)))
    render.write_csv(os.path.join(out, f"{table.name}.csv"), columns, [[r[c] for c in columns] for r in records])
    plot(table, records, os.path.join(out, f"{table.name}.png"))
    text += f"\n\n![{table.title}]({table.name}.png)"
  return text


def write(root: str = RESULTS, out: str = OUT) -> str:
  """Writes ``<out>/README.md`` and a CSV per table with finished runs; returns the README block."""
  os.makedirs(out, exist_ok=True)
  tables, cache = protocol.protocol_tables(root), _cache(out)
  sections = [section(t, root, out, cache, test_references) for t in tables]
  header = ("# The paper's tables\n\nGenerated by `python -m experiments tables` from the run records under "
            f"`{root}/`, by the protocol (`{os.path.relpath(os.path.join(root, 'protocol.md'), out)}`): the mean "
            "over seeds ± the half-width of its 95% CI; each row against the reference row (Welch's difference, "
            "its 95% CI, Holm's p within the table, the minimum detectable effect at 80% power where not "
            "separated). The paper's numbers are WMT14 EN-DE BLEU: the shape, not the scale. A CSV per table.\n")
  records_lib.replace_lines(os.path.join(out, "README.md"), ["\n\n".join([header, budget_section(root), *sections])
                                                              + "\n"])
  if cache:
    records_lib.replace_lines(os.path.join(out, BOOTSTRAP), [json.dumps(cache, indent=1, sort_keys=True) + "\n"])
  return readme_block(tables, root, out)


def write_one(table: Table, root: str, out: str, command: str) -> str:
  """One table alone (``python run.py``'s comparison): ``<out>/table.md``, headed by ``command``, its CSV and
  plot; returns the Markdown."""
  os.makedirs(out, exist_ok=True)
  text = f"Generated by `{command}`.\n\n{section(table, root, out, {}, _not_cached)}\n"
  records_lib.replace_lines(os.path.join(out, "table.md"), [text])
  return text


def readme_copy(path: str = "README.md") -> str:
  """The README's copy of the tables (between :data:`MARKERS`)."""
  return _block(path)[1].group(1).strip("\n")


def _block(path: str) -> tuple[str, re.Match]:
  """The README at ``path`` and its tables' block (between :data:`MARKERS`; ValueError if it has none)."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  match = re.search(re.escape(MARKERS[0]) + r"\n(.*?)" + re.escape(MARKERS[1]), text, re.S)
  if match is None:
    raise ValueError(f"{path} has no {MARKERS[0]} ... {MARKERS[1]} block to hold the tables")
  return text, match


def define_flags() -> None:
  from absl import flags

  flags.DEFINE_string("root", RESULTS, "The results root the tables read.")
  flags.DEFINE_string("out", OUT, "Where the tables' README.md and CSVs go.")
  flags.DEFINE_string("readme", "README.md", "The README whose copy of the headline tables is replaced ('': none).")


def main(argv) -> None:
  from absl import app
  from absl import flags

  fv = flags.FLAGS
  if fv.readme:
    try:
      text, match = _block(fv.readme)  # before any work: a README without the block is one line
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  block = write(fv.root, fv.out)
  if fv.readme:
    records_lib.replace_lines(fv.readme, [text[:match.start(1)] + block + "\n" + text[match.end(1):]])
  print(block)
