"""What a sweep's runs cost, from the spans of the processes that trained them.

Each process that trains a run writes its span to the run's
``processes.jsonl`` after each checkpoint save (marked running) and when it
ends (:func:`rpr.workdir.record_process`: from before its restore to after
its last evaluation or save), and writes one TensorBoard events file into
the workdir. The first is committed with the run's records; the events are
not (``.gitignore``) and are gone with the machine that trained the run. A
process's span is read from ``processes.jsonl``; an events file counts for a
process that file does not list (one killed with SIGKILL before its first
save, or one that ran before the file existed), from its first event to its
last, and extends the span of one it lists as running (killed after a
save). Per run: its processes and hours (the sum of their spans; steps
redone after a restart count, as they were spent). Per sweep: run-hours,
the sum over its runs, and wall hours, the union of every span:
the time during which at least one of its runs was training or evaluating.

    python -m experiments.compute 'experiments/results/lm/curves/*/*' --out experiments/results/lm/curves

writes ``compute.md`` there, and says how many spans came from events.
With ``--record_events`` it first appends those spans to each finished run's
``processes.jsonl`` (marked ``"source": "events"``; a process's own final
line, written later, takes their place), so that they outlive the events:
run it where the runs were trained, before the machine goes.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
import shlex
import sys
from typing import Sequence

from absl import app
from absl import flags

from experiments import render
from experiments import runs as runs_lib
from rpr import workdir as workdir_lib

FLAGS = flags.FLAGS


PROCESSES = workdir_lib.PROCESSES
_EVENTS = re.compile(r"events\.out\.tfevents\.\d+\.(?P<host>.+)\.(?P<pid>\d+)\.\d+\.v2$")


def _same(p: dict, q: dict) -> bool:
  """Whether two spans are one process: one host and PID, at overlapping times (a PID recurs on other days)."""
  return p["host"] == q["host"] and p["pid"] == q["pid"] and p["start"] <= q["end"] and q["start"] <= p["end"]


def _extended(own: dict, events: Sequence[dict]) -> dict:
  """A process's own span; one it wrote while running (``"running": true``, at a save: it was killed after) ends
  at the last event of that process, where its events say it ran longer."""
  if not own.get("running"):
    return own
  return {**own, "end": max([own["end"]] + [q["end"] for q in events if _same(own, q)])}


def _listed(workdir: str) -> list[dict]:
  """``processes.jsonl``'s spans; one recorded from events (:func:`record_events`) gives way to the process's own,
  and extends it if that one was written while running."""
  path = os.path.join(workdir, PROCESSES)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    spans_ = [json.loads(line) for line in f if line.strip()]
  own = [p for p in spans_ if p.get("source") != "events"]
  events = [p for p in spans_ if p.get("source") == "events"]
  return [_extended(p, events) for p in own] + [p for p in events if not any(_same(p, q) for q in own)]


def _event_spans(workdir: str) -> list[dict]:
  """A span per events file: host, PID, first and last event."""
  from tensorboard.backend.event_processing import event_file_loader

  out = []
  for events in sorted(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))):
    name = _EVENTS.search(os.path.basename(events))
    times = [e.wall_time for e in event_file_loader.EventFileLoader(events).Load()]
    if times:
      out.append({"host": name["host"] if name else None, "pid": int(name["pid"]) if name else None,
                  "start": min(times), "end": max(times), "source": "events"})
  return out


def _from_events(listed: Sequence[dict], events: Sequence[dict]) -> list[dict]:
  """The events spans ``listed`` does not hold: a process it does not list, or one it lists as running (killed
  after that line) whose events end later."""
  return [q for q in events
          if not any(_same(q, p) for p in listed) or any(_same(q, p) and q["end"] > p["end"] for p in listed)]


def spans(workdir: str) -> tuple[list[tuple[float, float]], int]:
  """(start, end) of each process that trained ``workdir``, in seconds since the epoch, oldest first, and how
  many of them were read from events files only (the others from ``processes.jsonl``, extended by their events
  where a line was written while the process ran)."""
  listed, events = _listed(workdir), _event_spans(workdir)
  listed = [_extended(p, events) for p in listed]
  extra = [q for q in events if not any(_same(q, p) for p in listed)]
  return sorted((p["start"], p["end"]) for p in listed + extra), len(extra)


def record_events(workdir: str) -> int:
  """Appends to ``processes.jsonl`` the span of each process only events files hold, or that they hold further
  than a line it wrote while running (marked ``"source": "events"``), so that it outlives them; returns how
  many."""
  extra = _from_events(_listed(workdir), _event_spans(workdir))
  if extra:
    with open(os.path.join(workdir, PROCESSES), "a", encoding="utf-8") as f:
      f.writelines(json.dumps(p, sort_keys=True) + "\n" for p in extra)
  return len(extra)


def record_finished(patterns: Sequence[str]) -> list[tuple[str, int]]:
  """:func:`record_events` for each finished run matched by ``patterns`` (a running process's events are not
  whole yet); ``(workdir, spans appended)`` where any were."""
  import ml_collections

  from experiments import sweep

  out = []
  for run in runs_lib.load_runs(patterns):
    if sweep.finished(run.workdir, ml_collections.ConfigDict(run.raw_config)):
      n = record_events(run.workdir)
      if n:
        out.append((run.workdir, n))
  return out


def union_seconds(intervals: Sequence[tuple[float, float]]) -> float:
  """The length of the union of ``intervals``: overlapping time counted once."""
  total, end = 0.0, float("-inf")
  for a, b in sorted(intervals):
    if b > end:
      total += b - max(a, end)
      end = b
  return total


def _utc(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def report(patterns: Sequence[str], command: str) -> str:
  """``compute.md``'s text for the runs matched by ``patterns`` that have process spans.

  Raises:
    ValueError: if no run matched by ``patterns`` has a ``processes.jsonl`` or an events file.
  """
  rows, every, from_events, lost = [], [], 0, []
  for run in runs_lib.load_runs(patterns):
    found, n_events = spans(run.workdir)
    if not found:
      lost.append(run)
      continue
    every += found
    from_events += n_events
    step = max((int(r["step"]) for r in run.records), default=0)
    rows.append([os.path.relpath(run.workdir), str(len(found)), f"{sum(b - a for a, b in found) / 3600:.2f}",
                 f"{step:,}", _utc(found[0][0]), _utc(found[-1][1])])
  if not rows:
    raise ValueError(f"no run matched by {list(patterns)} has processes.jsonl or TensorBoard events "
                     "(events.out.tfevents.*)")
  run_hours = sum(b - a for a, b in every) / 3600
  counted = render.count(len(rows), "run") + (f" of {len(rows) + len(lost)}" if lost else "")
  return "\n".join([
      f"Generated by `{command}`.", "",
      f"{counted}, {run_hours:.1f} run-hours (each process from its start to its end, summed), "
      f"{union_seconds(every) / 3600:.1f} wall hours (the time at least one of them was running), between "
      f"{_utc(min(a for a, _ in every))} and {_utc(max(b for _, b in every))} UTC. "
      f"{render.count(len(every), 'process span')}, {from_events} of them from TensorBoard events (the rest from "
      "processes.jsonl); a run whose processes "
      "left neither is not counted.", "",
      render.markdown_table(["run", "processes", "hours", "step reached", "first start (UTC)", "last end (UTC)"],
                            rows, ["---", render.RIGHT, render.RIGHT, render.RIGHT, "---", "---"]), "",
      *_lost_section(lost)])


def _lost_section(lost: Sequence[runs_lib.RunRecord]) -> list[str]:
  """The runs not counted above: no span of theirs survives. Their logged step rates still give the time of
  their training intervals, a lower bound on their processes' hours (:meth:`RunRecord.train_seconds`)."""
  if not lost:
    return []
  rows, total = [], 0.0
  for run in lost:
    seconds = run.train_seconds()
    total += seconds or 0.0
    step = max((int(r["step"]) for r in run.records), default=0)
    rows.append([os.path.relpath(run.workdir), f"{step:,}", "-" if seconds is None else f"{seconds / 3600:.2f}"])
  return [f"Not counted above: {len(lost)} run{'s' * (len(lost) != 1)} whose processes left no span (no "
          "processes.jsonl line, and no events file on this machine: the events stay on the machine that trained a "
          "run). Their logged training intervals "
          f"took {total / 3600:.1f} hours, a lower bound on their hours (the "
          "periodic evaluations are in it; setup, the final evaluation and steps trained twice are not):", "",
          render.markdown_table(["run", "step reached", "hours of logged training"], rows,
                                ["---", render.RIGHT, render.RIGHT]), ""]


def define_flags() -> None:
  flags.DEFINE_string("out", None, "Directory to write compute.md into.", required=True)
  flags.DEFINE_bool("record_events", False, "First append to each run's processes.jsonl the spans that only its "
                    "TensorBoard events hold (marked source: events), so that they outlive the events.")


def main(argv) -> None:
  patterns = argv[1:]
  if not patterns:
    raise app.UsageError("give the runs' workdirs as globs, e.g. 'experiments/results/lm/curves/*/*'")
  command = " ".join(["python -m experiments.compute", shlex.join(sys.argv[1:])])
  if FLAGS.record_events:
    for workdir, n in record_finished(patterns):
      print(f"{workdir}: {n} span(s) from events appended to {PROCESSES}")
  text = report(patterns, command)
  os.makedirs(FLAGS.out, exist_ok=True)
  with open(os.path.join(FLAGS.out, "compute.md"), "w", encoding="utf-8") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  define_flags()
  app.run(main)
