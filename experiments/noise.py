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
retraining; the floor of a data set's metric is the largest
spread of its cells, at whatever budget (a learning-curve cell trains 4x
longer or more, where a change of order has longer to grow). Beside each
spread is the cell's budget and its seed range (its committed group),
which a floor is read against.

Writes ``floor.md`` and ``floor.json`` (``{dataset: {metric: floor}}``, read
by the reports' budget and baseline sections, through :func:`floor_of`, and
held to by :func:`verdict`).

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


def measure(found: Sequence[dict]) -> tuple[list[dict], dict]:
  """Rows (cell, metric, values, spread, seed range) and the floor per data set and metric."""
  rows, floor = [], {}
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
        floor.setdefault(dataset, {})[metric] = max(spread, floor.get(dataset, {}).get(metric, 0.0))
  return rows, floor


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
  """Writes ``floor.md`` and ``floor.json`` to ``out``; returns the floor."""
  rows, floor = measure(cells(noise, root))
  lines = [f"Generated by `{command}`.", "",
           "Each cell's committed run (seed 0) and its retrainings with the same config, seed and budget (steps) "
           "under other floating-point orders (- where it has not finished); the spread is max - min over the "
           "finished ones. The floor of a data set's metric is its largest spread, at any budget.", "",
           table(rows), "",
           "Floors: " + "; ".join(f"{d}: " + ", ".join(f"{m} {v:.{digits(m)}f}" for m, v in ms.items())
                                  for d, ms in sorted(floor.items())) + ".", ""]
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "floor.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  with open(os.path.join(out, "floor.json"), "w", encoding="utf-8") as f:
    json.dump(floor, f, indent=1, sort_keys=True)
  return floor


def read_floor(path: Optional[str] = None) -> dict:
  """``{dataset: {metric: floor}}`` as :func:`write` left it (default :data:`FLOOR_FILE`); empty if there is none."""
  path = path or FLOOR_FILE
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def floor_of(dataset: Optional[str], metric: str) -> Optional[tuple[float, str]]:
  """(floor, the metric it was measured on) for ``metric`` on ``dataset``: the metric's own floor, else that of the
  same score on the test split (``test/bleu`` for ``test_long/bleu``); None when neither is measured."""
  floors = read_floor().get(dataset, {})
  for measured in (metric, f"test/{metric.rsplit('/', 1)[-1]}"):
    if measured in floors:
      return floors[measured], measured
  return None


def floors_text(datasets: Sequence[Optional[str]], metric: str) -> str:
  """The floor of ``metric`` on each of ``datasets``, and the metric it was measured on (:func:`floor_of`)."""
  parts = []
  for dataset in sorted({str(d) for d in datasets}):
    found = floor_of(dataset, metric)
    parts.append(f"none measured ({dataset})" if found is None else
                 f"{found[0]:.{digits(found[1])}f} ({dataset}{'' if found[1] == metric else ', that of ' + found[1]})")
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
