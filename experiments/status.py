"""What each run of a sweep is doing (:func:`status`, printed by :func:`format_status`; experiments/launch.py's
docstring shows the call): done (from its workdir), else what its job says.

A run is done when its workdir holds its last step with every final evaluation (:func:`finished`); else its
state comes from ``folder/jobs.json`` (the launcher's record of each workdir's job), the job's result pickle,
SLURM's ``sacct`` or the local job's process.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import pickle
from typing import TYPE_CHECKING, Optional, Sequence

import submitit

from experiments import engine
from experiments import runs as runs_lib
from rpr import progress

if TYPE_CHECKING:
  from experiments.launch import Job

MANIFEST = "jobs.json"


def finished(workdir: str, config) -> bool:
  """Whether ``workdir`` holds the run's last step (``num_train_steps``, or where the plateau rule stopped it) with
  the evaluation of every split the config evaluates there (none: the last step's log is enough)."""
  records = runs_lib.records(workdir)
  end = engine.end_step(records, config.num_train_steps)
  last = {k: v for r in records if r["step"] >= end for k, v in r.items()}
  return bool(last) and all(f"{s}/loss" in last for s in engine.evaluated_splits(config))


def manifest(folder: str) -> dict:
  """``folder/jobs.json``: each workdir's job (its executor, id and log), as the launcher recorded it."""
  path = pathlib.Path(folder) / MANIFEST
  return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


@dataclasses.dataclass(frozen=True)
class Row:
  """One run in :func:`status`: its state, last logged step of its total, ETA in seconds (running runs) and log."""
  name: str
  workdir: str
  state: str  # done, running, queued, stopped, failed or not submitted
  step: Optional[int]
  steps: int
  eta_s: Optional[float]
  log: str


def status(jobs: Sequence[Job], folder: str) -> list[Row]:
  """Every run of ``jobs``: done (from its workdir), else what its job says (``folder/jobs.json``, then the job's
  result pickle, SLURM's ``sacct`` or the local job's process), with its last step from ``metrics.jsonl``."""
  jobs_of, rows = manifest(folder), []
  slurm = {e["job_id"]: submitit.SlurmJob(folder, e["job_id"]) for e in jobs_of.values()
           if e.get("executor") == "slurm"}  # registered together: one sacct call asks for them all
  for job in jobs:
    records = runs_lib.records(job.workdir)
    step = max((int(r["step"]) for r in records), default=None)
    entry = jobs_of.get(job.workdir, {})
    state = "done" if finished(job.workdir, job.config) else _job_state(entry, folder, bool(records), slurm)
    rates = [r["train/steps_per_sec"] for r in records if r.get("train/steps_per_sec")]
    eta = (job.config.num_train_steps - step) / rates[-1] if state == "running" and rates and step else None
    rows.append(Row(job.name, job.workdir, state, step, job.config.num_train_steps, eta, entry.get("log", "-")))
  return rows


def _job_state(entry: dict, folder: str, started: bool, slurm: dict) -> str:
  if not entry:
    return "stopped" if started else "not submitted"
  if entry.get("job_id") is None:  # waiting for a local slot
    return "queued" if _alive(entry.get("launcher")) else ("stopped" if started else "not submitted")
  result = pathlib.Path(folder) / f"{entry['job_id']}_0_result.pkl"
  if result.exists():
    with open(result, "rb") as f:
      kind, value = pickle.load(f)
    return value["state"] if kind == "success" and value["state"] != "done" else "failed"
  if entry["executor"] == "local":
    return "running" if _alive(int(entry["job_id"])) else "failed"
  state = slurm[entry["job_id"]].state.split()[0]  # sacct's, e.g. "CANCELLED by 123"
  if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING", "SUSPENDED", "UNKNOWN"):
    return "queued"
  if state in ("RUNNING", "COMPLETING"):
    return "running"
  return "stopped" if state == "PREEMPTED" else "failed"


def _alive(pid) -> bool:
  try:
    return bool(pid) and os.kill(int(pid), 0) is None
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's
    return True


def format_status(rows: Sequence[Row]) -> str:
  """One line per run: name, state, step of steps, ETA, log; then the count of each state."""
  lines = []
  for r in rows:
    step, eta = "-" if r.step is None else f"{r.step:,}", "-" if r.eta_s is None else progress.clock(r.eta_s)
    lines.append(f"{r.name:24s} {r.state:13s} step {step:>9s} of {r.steps:,}  ETA {eta:>9s}  log {r.log}")
  lines.append(", ".join(f"{n} {s}" for s, n in sorted(collections.Counter(r.state for r in rows).items())))
  return "\n".join(lines)
