"""What a run owns in its workdir: the lock that keeps a second run out, and the span of each process.

One run per workdir: :func:`lock` takes an exclusive ``flock`` on
``<workdir>/.lock`` and writes the holder's PID, host and start time into
it. A second process that meets the lock is refused with :class:`Busy`,
naming the holder. The kernel releases the lock when its process ends, however it
ends; a lock file whose holder is gone is stale, and the next run takes it
over with a warning. A process may take the lock of one workdir more than
once (``run.py``, then ``train_and_evaluate``); it is released at the last release.

``config.json`` is :mod:`rpr.record`'s; ``metrics.jsonl`` is :mod:`rpr.records`'.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import time
from typing import Optional

from absl import logging

from rpr import records

LOCK = ".lock"
PROCESSES = "processes.jsonl"  # one line per process that trained the run (record_process)
_held: dict[str, list] = {}  # realpath -> [open file, count]
_warned: set = set()  # (path, line) of the damaged lines of processes.jsonl warned of


class Busy(RuntimeError):
  """Another process holds the workdir."""


class Unusable(RuntimeError):
  """The workdir cannot be created or written, or holds what a run must not go on from."""


def record_process(workdir: str, start: float, steps: tuple[int, int], running: bool = False,
                   environment: Optional[dict] = None) -> None:
  """Writes this process's span to ``<workdir>/processes.jsonl``: host, PID, start and end (seconds since the
  epoch), the steps it trained from and to, and what ``config.json`` records of the machine and the code
  (``environment``, default :func:`rpr.provenance.environment` now; training passes what it was at the process's
  start, since the checkout may change under a running process), which ``config.json`` holds for the latest
  process only.

  Training (its :class:`Span`) calls it after each checkpoint save with ``running=True`` (the line says
  ``"running": true``: the process was alive then, at ``to_step``) and once more at its end; each call replaces
  the process's previous line, and the file is replaced whole (write, then rename), so a kill leaves the old file
  or the new one. A process killed with SIGKILL thus leaves its span up to its last save, where its TensorBoard
  events may say more. Committed beside the records, it outlives those events (not committed, lost with the
  machine).
  """
  from rpr import provenance

  record = {"host": socket.gethostname(), "pid": os.getpid(), "start": start, "end": time.time(),
            "from_step": steps[0], "to_step": steps[1],
            **(provenance.environment() if environment is None else environment)}
  if running:
    record["running"] = True
  this = (record["host"], record["pid"], start)
  path = os.path.join(workdir, PROCESSES)
  kept = []
  if os.path.exists(path):
    with open(path, "rb") as f:
      for n, line in enumerate(f, 1):
        if line.strip() and _span(path, n, line) != this:
          kept.append(line.decode("utf-8", "surrogateescape").rstrip("\n") + "\n")
  records.replace_lines(path, kept + [json.dumps(record, sort_keys=True) + "\n"])  # one writer: the lock's holder


class Span:
  """This process's span in ``processes.jsonl`` as it trains, from the step it started at: :func:`record_process`
  after each save (:meth:`saved`, ``running``) and at its end (:meth:`ended`), up to the newest step it saved or
  recorded (a stop by signal saves a step that may have no record). Only a span that ``writes`` (process 0's)
  writes the file."""

  def __init__(self, workdir: str, start: float, first: int, environment: dict, writes: bool = True):
    self.workdir, self.start, self.environment, self.writes = workdir, start, environment, writes
    self.steps = [first]  # the first step, then each saved

  def saved(self, step: int) -> None:
    self.steps.append(step)
    self._record(step, running=True)

  def ended(self, recorded: list[dict]) -> None:
    """The last line, up to the newest step saved or among ``recorded`` (the run's metrics records)."""
    self._record(max(self.steps + [r["step"] for r in recorded]), running=False)

  def _record(self, last: int, running: bool) -> None:
    if self.writes:
      record_process(self.workdir, self.start, (self.steps[0], last), running, self.environment)


def _span(path: str, n: int, line: bytes) -> Optional[tuple]:
  """The (host, PID, start) of line ``n`` of ``processes.jsonl``; None for a damaged line, which is kept as it is
  (the other spans can be trusted), with one warning per process."""
  try:
    span = json.loads(line.decode("utf-8"))
    return span.get("host"), span.get("pid"), span.get("start")
  except (ValueError, AttributeError) as e:
    if (path, n) not in _warned:
      _warned.add((path, n))
      logging.warning("%s, line %d is not a process's span (%s): kept as it is and passed over; delete that line "
                      "if it is of no use.", path, n, (str(e).splitlines() or [type(e).__name__])[0][:100])
    return None


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps ``<workdir>/checkpoints`` holds a folder for, newest first (not yet verified: see rpr.checkpoint)."""
  path = os.path.join(workdir, "checkpoints")
  return sorted((int(n) for n in os.listdir(path) if n.isdigit()), reverse=True) if os.path.isdir(path) else []


def set_aside_unresumable(workdir: str) -> None:
  """At the end of a process: if ``checkpoints/`` holds no step (every save failed, or none was due before an
  error), ``metrics.jsonl`` is set aside (:func:`rpr.records.set_aside`) as the next run would set it aside, so
  that records up to the last step never read as a finished run that lost its checkpoints."""
  aside = None if checkpoint_steps(workdir) else records.set_aside(os.path.join(workdir, "metrics.jsonl"))
  if aside:
    logging.warning("No checkpoint of this run was saved, so there is nothing to resume: its records are kept in "
                    "%s, and the next run in %s starts at step 0.", aside, workdir)


def _usable(workdir: str) -> str:
  """``workdir`` created if missing; :class:`Unusable` naming why not."""
  if os.path.isfile(workdir):
    raise Unusable(f"--workdir {workdir!r} is a file; allowed: a directory (created if missing)")
  try:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK)
    return path
  except OSError as e:
    raise Unusable(f"--workdir {workdir!r} cannot be used: {e.strerror or e}; allowed: a directory this user can "
                   "create and write") from None


def acquire(workdir: str) -> None:
  """Takes the workdir's lock (again, if this process holds it); :class:`Busy` if another process does."""
  key = os.path.realpath(workdir)
  if key in _held:
    _held[key][1] += 1
    return
  path = _usable(workdir)
  try:
    f = open(path, "a+", encoding="utf-8")
  except OSError as e:
    raise Unusable(f"--workdir {workdir!r} cannot be used: {e.strerror or e} ({path}); allowed: a directory this "
                   "user can write") from None
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
      f.close()
      raise
    holder = _holder(f)
    f.close()
    raise Busy(f"--workdir {workdir!r} is in use by {holder}: one run per workdir; wait for it to end, stop it "
               "(SIGTERM saves a checkpoint), or use another --workdir") from None
  previous = _read(f)
  if previous:
    logging.warning("Took over the lock of %s left by %s, which no longer holds it (it was killed).", workdir,
                    _describe(previous))
  f.seek(0)
  f.truncate()
  f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                      "since": datetime.datetime.now().isoformat(timespec="seconds")}) + "\n")
  f.flush()
  _held[key] = [f, 1]


def release(workdir: str) -> None:
  """Gives back one :func:`acquire`; the last one empties the lock file (a clean exit leaves nothing stale)."""
  key = os.path.realpath(workdir)
  if key not in _held:
    return
  _held[key][1] -= 1
  if _held[key][1] == 0:
    f, _ = _held.pop(key)
    try:
      f.seek(0)
      f.truncate()
      f.flush()
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
      f.close()


def release_all() -> None:
  """Gives back every lock this process holds (a process ending at once: rpr.stop.end_at_once)."""
  for key in list(_held):
    _held[key][1] = 1
    release(key)


@contextlib.contextmanager
def lock(workdir: str):
  acquire(workdir)
  try:
    yield
  finally:
    release(workdir)


def _read(f) -> dict:
  f.seek(0)
  try:
    return json.loads(f.read() or "{}")
  except ValueError:
    return {"pid": "?", "host": "?", "since": "?"}


def _describe(record: dict) -> str:
  return f"PID {record.get('pid', '?')} on host {record.get('host', '?')} (since {record.get('since', '?')})"


def _holder(f) -> str:
  record = _read(f)
  return _describe(record) if record else "another process (it has not written its PID yet)"
