"""The noise floor: committed runs retrained with the same config and seed under another floating-point order.

A retrained run lives at ``<noise>/<cell>/<order>/<seed>`` (the orders:
``same`` flags on this machine, ``repeat`` of it, ``devices2``, ``cores1``;
see the folder's README). Each run is checked to be what its order says:
one device but for ``devices2``'s two (``config.json``), and for ``cores1``
a launch on one core (``<order>/launch.txt``); a run that is not raises.
Its committed twin is found, not named: the run under the results root
whose config, seed and budget included, equals its own (a key a record
lacks counts as its default: :func:`experiments.runs.with_engine_defaults`).
The spread of a cell is max - min over the twin and every finished
retraining. A data set's metric has two kinds of floor:

- the largest spread of its cells at any budget (``floor.json``), which a
  number is held to when its budget has no floor of its own;
- the floor at a budget (``floor_budgets.json``): the largest spread of the
  cells retrained at that budget (``num_train_steps``), once at least
  :data:`MIN_CELLS` cells have been. How far a change of order moves a
  metric depends on the budget (a run near its plateau is not one still
  falling fast), so the floor of the short sweeps says little about the
  end of a learning curve; it depends on the cell too (at 2,500 steps
  three translation cells spread 0.27-0.89 in BLEU), so one retrained cell
  is one draw, not enough to set a budget's floor alone.

Two numbers from different budgets are held to the larger of their
floors. Beside each spread is the cell's budget and its seed range (its
committed group), which a floor is read against.

Writes ``floor.md``, ``floor.json`` (``{dataset: {metric: floor}}``) and
``floor_budgets.json`` (``{dataset: {metric: {steps: {"floor": f, "cells":
[...]}}}}``), read by the reports' budget and baseline sections through
:func:`floor_of`, and held to by :func:`verdict`.

Command: ``python -m experiments.noise``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional, Sequence

from absl import app
from absl import flags

from experiments import render
from experiments import runs as runs_lib

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
NOISE = os.path.join(RESULTS, "noise")
FLOOR_FILE = os.path.join(NOISE, "floor.json")
BUDGETS_FILE = "floor_budgets.json"  # beside FLOOR_FILE
MIN_CELLS = 2  # retrained cells a budget needs for a floor of its own
ORDERS = ("same", "repeat", "devices2", "cores1")
DEVICES = {"devices2": 2}  # the device count of each order's runs (1 for the others)
LAUNCH = {"cores1": "taskset -c 0 "}  # what an order's launch line must hold
METRICS = {"bible_fr_en": ("test/bleu", "test/loss"),
           "sotu": ("test/perplexity", "test_x2/perplexity", "test_x4/perplexity", "test_x8/perplexity")}


def committed_runs(root: str = RESULTS) -> list[runs_lib.RunRecord]:
  """Every run under ``root`` (``<area>/<sweep>/<variant>/<seed>``) but the noise runs."""
  return [r for r in runs_lib.load_runs([os.path.join(root, "*", "*", "*", "*")])
          if "noise" not in os.path.relpath(r.workdir, root).split(os.sep)]


def twin(run: runs_lib.RunRecord, committed: Sequence[runs_lib.RunRecord]) -> runs_lib.RunRecord:
  """The committed run with ``run``'s config (seed included).

  Raises:
    ValueError: if none has it, or several do.
  """
  key = runs_lib.canonical(run.config)
  found = [r for r in committed if runs_lib.canonical(r.config) == key]
  if len(found) != 1:
    raise ValueError(f"{run.workdir}: {len(found)} committed runs have its config (seed included), "
                     f"{[r.workdir for r in found]}; allowed: exactly one")
  return found[0]


def check_order(run: runs_lib.RunRecord, order: str) -> None:
  """Raises ValueError if ``run`` was not trained as ``order`` says (its device count, its launch line)."""
  with open(os.path.join(run.workdir, "config.json"), encoding="utf-8") as f:
    devices = json.load(f).get("num_devices")
  if devices != DEVICES.get(order, 1):
    raise ValueError(f"{run.workdir}: trained on {devices} device(s); allowed for order {order!r}: "
                     f"{DEVICES.get(order, 1)}")
  if order in LAUNCH:
    path = os.path.join(os.path.dirname(run.workdir), "launch.txt")
    line = open(path, encoding="utf-8").read() if os.path.exists(path) else "no launch.txt"
    if LAUNCH[order] not in line:
      raise ValueError(f"{run.workdir}: launched as {line.strip()!r}; allowed for order {order!r}: a line with "
                       f"{LAUNCH[order].strip()!r}")


def cells(noise: str = NOISE, root: str = RESULTS) -> list[dict]:
  """Per retrained cell: its twin, its retrainings by order, its committed seeds, the data set's metrics."""
  committed = committed_runs(root)
  out = []
  for cell in sorted(os.listdir(noise)):
    reruns = {o: runs_lib.load_runs([os.path.join(noise, cell, o, "*")]) for o in ORDERS}
    for order, rs in reruns.items():
      for r in rs:
        check_order(r, order)
    found = [r for rs in reruns.values() for r in rs]
    if not found:
      continue
    ref = twin(found[0], committed)
    for r in found[1:]:
      if twin(r, committed).workdir != ref.workdir:
        raise ValueError(f"{r.workdir} retrains {twin(r, committed).workdir}, not {ref.workdir} as its cell does")
    seeds = [r for r in committed if runs_lib.shared_config(r) == runs_lib.shared_config(ref)]
    out.append({"cell": cell, "twin": ref, "reruns": {o: rs for o, rs in reruns.items() if rs},
                "seeds": seeds, "metrics": METRICS.get(ref.config.get("dataset"), ())})
  return out


def _final(run: runs_lib.RunRecord, metric: str) -> Optional[float]:
  """The metric at the run's last training step (``num_train_steps``, or the step where its plateau rule stopped
  it), or None if the run has not got there."""
  last = run.last(metric)
  return last[1] if last and last[0] == run.end() else None


def measure(found: Sequence[dict]) -> tuple[list[dict], dict, dict]:
  """Rows (cell, metric, values, spread, seed range), the floor per data set and metric (the largest spread at any
  budget), and per data set, metric and budget the largest spread there and the cells measured
  (:func:`budget_floors` keeps those with :data:`MIN_CELLS`)."""
  rows, at = [], {}
  for c in found:
    dataset = c["twin"].config.get("dataset")
    for metric in c["metrics"]:
      values = {"committed": _final(c["twin"], metric)}
      for order, rs in c["reruns"].items():
        values[order] = _final(rs[0], metric)
      done = [v for v in values.values() if v is not None]
      spread = max(done) - min(done) if len(done) > 1 else None
      seeds = [v for v in (_final(r, metric) for r in c["seeds"]) if v is not None]
      rows.append({"cell": c["cell"], "steps": c["twin"].config.get("num_train_steps"), "metric": metric,
                   "values": values, "spread": spread,
                   "seeds": (min(seeds), max(seeds)) if seeds else None, "n_seeds": len(seeds)})
      if spread is not None:
        here = at.setdefault(dataset, {}).setdefault(metric, {}).setdefault(
            str(rows[-1]["steps"]), {"floor": 0.0, "cells": []})
        here["floor"] = max(here["floor"], spread)
        here["cells"].append(c["cell"])
  floor = {d: {m: max(v["floor"] for v in by.values()) for m, by in ms.items()} for d, ms in at.items()}
  return rows, floor, at


def budget_floors(at: dict) -> dict:
  """The budgets of :func:`measure`'s third value with at least :data:`MIN_CELLS` cells retrained there."""
  return {d: {m: {steps: v for steps, v in by.items() if len(v["cells"]) >= MIN_CELLS} for m, by in ms.items()}
          for d, ms in at.items()}


def digits(metric: str) -> int:
  """Decimals to print ``metric`` and its floor with: 3 for a loss (floors of a few hundredths), else 2."""
  return 3 if metric.endswith("/loss") else 2


def table(rows: Sequence[dict]) -> str:
  header = ["cell", "steps", "metric", "committed (seed 0)", *ORDERS, "spread", "seed range (width)"]
  body = []
  for r in rows:
    v, d = r["values"], digits(r["metric"])
    cells = [render.fmt(v.get(o), d) for o in ORDERS]
    lo_hi = r["seeds"]
    if lo_hi is None:
      seeds = "-"
    elif r["n_seeds"] == 1:
      seeds = f"{lo_hi[0]:.{d}f} (1 seed: no range yet)"
    else:
      seeds = f"{lo_hi[0]:.{d}f}-{lo_hi[1]:.{d}f} ({lo_hi[1] - lo_hi[0]:.{d}f}, {r['n_seeds']} seeds)"
    body.append([r["cell"], f"{r['steps']:,}", r["metric"], render.fmt(v["committed"], d), *cells,
                 "-" if r["spread"] is None else f"**{r['spread']:.{d}f}**", seeds])
  return render.markdown_table(header, body, ["---", render.RIGHT, "---"] + [render.RIGHT] * (len(header) - 3))


def write(out: str, noise: str = NOISE, root: str = RESULTS, command: str = "python -m experiments.noise") -> dict:
  """Writes ``floor.md``, ``floor.json`` and :data:`BUDGETS_FILE` to ``out``; returns the largest floors."""
  rows, floor, at = measure(cells(noise, root))
  kept = budget_floors(at)
  by_budget = []
  for d, ms in sorted(at.items()):
    for m, by in ms.items():
      for steps, v in sorted(by.items(), key=lambda kv: int(kv[0])):
        use = ("its own floor" if steps in kept[d][m] else
               f"held to the largest ({floor[d][m]:.{digits(m)}f}): fewer than {MIN_CELLS} cells")
        by_budget.append(f"- {d}, {m} at {int(steps):,} steps: {v['floor']:.{digits(m)}f} over "
                         f"{len(v['cells'])} cell{'s' * (len(v['cells']) != 1)} ({', '.join(v['cells'])}); {use}.")
  lines = [f"Generated by `{command}`.", "",
           "Each cell's committed run (seed 0) and its retrainings with the same config, seed and budget (steps) "
           "under other floating-point orders (- where it has not finished); the spread is max - min over the "
           "finished ones. The floor of a data set's metric is its largest spread, at any budget; a budget where "
           f"at least {MIN_CELLS} cells were retrained has a floor of its own, their largest spread, which the "
           "numbers of that budget are held to (two numbers of different budgets: the larger of their floors).", "",
           table(rows), "",
           "Floors, at any budget: " + "; ".join(f"{d}: " + ", ".join(f"{m} {v:.{digits(m)}f}" for m, v in ms.items())
                                                 for d, ms in sorted(floor.items())) + ".", "",
           "At each budget:", "", *by_budget, ""]
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "floor.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  with open(os.path.join(out, "floor.json"), "w", encoding="utf-8") as f:
    json.dump(floor, f, indent=1, sort_keys=True)
  with open(os.path.join(out, BUDGETS_FILE), "w", encoding="utf-8") as f:
    json.dump(kept, f, indent=1, sort_keys=True)
  return floor


def read_floor(path: Optional[str] = None) -> dict:
  """``{dataset: {metric: floor}}`` as :func:`write` left it (default :data:`FLOOR_FILE`); empty if there is none."""
  path = path or FLOOR_FILE
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def read_budget_floors() -> dict:
  """``{dataset: {metric: {steps: {"floor", "cells"}}}}``, :data:`BUDGETS_FILE` beside :data:`FLOOR_FILE`; empty
  if there is none."""
  return read_floor(os.path.join(os.path.dirname(FLOOR_FILE), BUDGETS_FILE))


def floor_of(dataset: Optional[str], metric: str,
             *budgets: Optional[int]) -> Optional[tuple[float, str, Optional[int]]]:
  """(floor, the metric it was measured on, the budget whose own floor it is) for numbers of ``metric`` on
  ``dataset`` trained with each of ``budgets`` (``num_train_steps``; none given: any budget). The floor is the
  metric's own, else that of the same score on the test split (``test/bleu`` for ``test_long/bleu``); None when
  neither is measured. Per budget it is that budget's own floor where it has one, else the largest at any budget;
  over several budgets, the largest of theirs, and the budget is None when that is the largest at any budget."""
  floors, own = read_floor().get(dataset, {}), read_budget_floors().get(dataset, {})
  for measured in (metric, f"test/{metric.rsplit('/', 1)[-1]}"):
    if measured in floors:
      at = own.get(measured, {})
      found = [(at[str(b)]["floor"], b) if str(b) in at else (floors[measured], None) for b in budgets or (None,)]
      value, budget = max(found, key=lambda vb: (vb[0], vb[1] is not None))  # a tie names the budget
      return value, measured, budget
  return None


def floors_text(datasets: Sequence[Optional[str]], metric: str, budgets: Sequence[int] = ()) -> str:
  """The floor of ``metric`` on each of ``datasets`` (:func:`floor_of`), for numbers of each of ``budgets`` (steps)
  when given: the metric it was measured on, and whether it is the budget's own or the largest at any budget."""
  parts = []
  for dataset in sorted({str(d) for d in datasets}):
    for budget in sorted(set(budgets)) or [None]:
      found = floor_of(dataset, metric, budget)
      if found is None:
        parts.append(f"none measured ({dataset})")
        break
      notes = [dataset, *([f"that of {found[1]}"] if found[1] != metric else [])]
      if budget is not None:
        notes.append("measured there" if found[2] == budget else "the largest at any budget")
      at = "" if budget is None else f" at {budget:,} steps"
      parts.append(f"{found[0]:.{digits(found[1])}f}{at} ({', '.join(notes)})")
  return ", ".join(parts) + " (`experiments/results/noise/`)"


def verdict(a: Sequence[float], b: Sequence[float], floor: Optional[float], lower_is_better: bool) -> str:
  """Whether the values ``a`` are apart from ``b`` by more than ``floor``: "better by g", "worse by g" (g the gap
  between the two ranges), or "not separated" (also when there is no floor to hold them to)."""
  gap_up, gap_down = min(a) - max(b), min(b) - max(a)  # a's range above b's, or below it
  gap = max(gap_up, gap_down)
  if floor is None or gap <= floor:
    return "not separated"
  better = (gap_up > 0) != lower_is_better
  digits = 2  # more where two decimals would print the gap as the floor it clears
  while digits < 6 and f"{gap:.{digits}f}" == f"{floor:.{digits}f}":
    digits += 1
  return f"{'better' if better else 'worse'} by {gap:.{digits}f}"


def define_flags() -> None:
  flags.DEFINE_string("noise", NOISE, "The retrained runs: <noise>/<cell>/<order>/<seed>.")
  flags.DEFINE_string("root", RESULTS, "The committed results, where each retrained run's twin is found.")
  flags.DEFINE_string("out", NOISE, "Output directory (floor.md, floor.json).")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  FLAGS = flags.FLAGS
  command = " ".join(["python -m experiments.noise", *sys.argv[1:]])
  write(FLAGS.out, FLAGS.noise, FLAGS.root, command)
  with open(os.path.join(FLAGS.out, "floor.md"), encoding="utf-8") as f:
    print(f.read())


if __name__ == "__main__":
  define_flags()
  app.run(main)
