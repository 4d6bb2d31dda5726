"""A dead peer named: with several processes (``run.py --multihost``), one that dies ends every other in one line.

When a process of a multi-process job dies, the others block in their next collective (gloo on CPU hosts waits
without end for a peer that is gone). JAX's coordination service notices the dead process by its missing
heartbeats and then aborts every other process from a C++ thread (``client.h``: "Terminating process because
the JAX distributed service detected fatal errors"): SIGABRT, a C++ stack trace and Python's thread dump, after
``heartbeat_timeout_seconds`` (100 s by default) when any process but the coordinator died, at once when the
coordinator did. jaxlib's hook for that moment (``missed_heartbeat_callback``) cannot be a Python function
(jaxlib 0.10.2 ends the process with ``std::bad_cast`` when it calls one), so nothing inside the process can
turn the abort into a line. Hence two parts:

- :func:`initialize` starts JAX's runtime with a heartbeat timeout (:data:`HEARTBEAT_SECONDS` unless
  ``run.py --heartbeat_seconds`` says otherwise), which bounds how long a survivor waits;
- :func:`supervise` runs the process's work as a child (the same command) and relays its stderr. When the child
  is aborted by the coordination service, the parent drops the abort's report and says instead, in one line and
  with exit status 2, which process stopped responding (process 0, "the coordinator", when the service itself
  is gone) and at which step (the child's last logged one), and that the same command resumes from the last
  checkpoint.

A survivor that meets the dead peer as an error first (a failed collective, or a save whose barrier failed)
waits for the verdict before it reports that error (:func:`settle`), so that it does not blame a save for a dead
peer. An error of the process's own ends it without JAX's shutdown barrier (:func:`exit_now`), so the others
learn of it from the heartbeats instead of waiting for the barrier's 5 minutes.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from typing import IO, Optional

HEARTBEAT_SECONDS = 10  # a process silent this long is dead: every survivor ends within about this plus a few s
SUPERVISED = "RPR_SUPERVISED"  # set in the child's environment: the process that does the work
_ABORT = re.compile(r"^F\d{4} .*(JAX distributed service detected fatal errors|coordination)")
_COORDINATION = re.compile(r"^[EW]\d{4} \S+ +\d+ (coordination_service|coordination_service_agent|"
                           r"preemption_sync_manager|client)\.")
_LOG_LINE = re.compile(r"^[IWEF]\d{4} ")
_STEP = re.compile(r"\] step (\d+)/\d+: |Resumed from the checkpoint of step (\d+)|Stopped by signal after step (\d+)")
_PROCESS = re.compile(r"\] JAX process (\d+) of (\d+), ")  # run.py's line once the runtime is up


def initialize(coordinator_address: Optional[str], num_processes: Optional[int], process_id: Optional[int],
               heartbeat_seconds: int = HEARTBEAT_SECONDS) -> None:
  """``jax.distributed.initialize`` with a heartbeat timeout of ``heartbeat_seconds``; CPU hosts (and the
  tests, several processes on one machine) exchange arrays through gloo (accelerators use their own
  collectives and ignore this setting)."""
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address, num_processes, process_id,
                             heartbeat_timeout_seconds=heartbeat_seconds)


def running() -> bool:
  """Whether JAX's multi-process runtime is up in this process."""
  jax = sys.modules.get("jax")
  return jax is not None and jax.distributed.is_initialized()


def settle(heartbeat_seconds: int = HEARTBEAT_SECONDS) -> None:
  """Called with an error on its way out of a multi-process run started with ``heartbeat_seconds``: waits long
  enough for the coordination service to abort this process if a peer died (the error was then only its echo);
  returns if none did."""
  if running():
    time.sleep(heartbeat_seconds + 5)


def exit_now(status: int) -> None:
  """Ends a multi-process run's process with ``status`` at once, its output flushed, without JAX's shutdown
  barrier (where it would wait for peers that may be blocked, or gone)."""
  from absl import logging

  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def supervise(argv: list[str], process_id: Optional[int], num_processes: Optional[int]) -> int:
  """Runs ``argv`` (this command) as a child with :data:`SUPERVISED` set, relays its stderr and signals, and
  returns its exit status, or 2 with one line naming the dead peer if the coordination service aborted it."""
  child = subprocess.Popen(argv, env={**os.environ, SUPERVISED: "1"}, stderr=subprocess.PIPE,
                           preexec_fn=_die_with_parent)
  for s in (signal.SIGTERM, signal.SIGINT):  # a preemption notice or Ctrl-C is the child's to act on
    signal.signal(s, lambda signum, frame: child.send_signal(signum))
  relay = Relay(sys.stderr)
  for line in iter(child.stderr.readline, b""):
    relay.line(line.decode("utf-8", "replace"))
  status = child.wait()
  message = relay.end(status, process_id, num_processes)
  if message:
    print(f"run.py: error: {message}", file=sys.stderr, flush=True)
    return 2
  return status if status >= 0 else 128 - status


def _die_with_parent() -> None:
  """In the child before it starts: SIGKILL when the parent dies (Linux), so a killed process leaves no orphan."""
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Relay:
  """The child's stderr, passed on line by line but for the coordination service's reports, held until the
  child ends: dropped if it was aborted (a dead peer, said in one line instead), passed on otherwise."""

  def __init__(self, out: IO[str]):
    self.out = out
    self.held: list[str] = []  # coordination lines and their continuation lines, not passed on yet
    self.report: list[str] = []  # the abort's report, from its first line on
    self.step: Optional[int] = None  # the child's last logged step
    self.process: Optional[tuple[int, int]] = None  # (index, count) the child logged: they may be detected

  def line(self, text: str) -> None:
    found = _STEP.search(text)
    if found:
      self.step = int(next(g for g in found.groups() if g is not None))
    found = _PROCESS.search(text)
    if found:
      self.process = int(found.group(1)), int(found.group(2))
    if self.report or _ABORT.match(text):
      self.report.append(text)
    elif _COORDINATION.match(text) or (self.held and not _LOG_LINE.match(text) and not text.startswith("run.py:")):
      self.held.append(text)
    else:
      self._flush()
      self.out.write(text)
      self.out.flush()

  def _flush(self) -> None:
    self.out.writelines(self.held)
    self.held = []

  def end(self, status: int, process_id: Optional[int], num_processes: Optional[int]) -> Optional[str]:
    """The line naming the dead peer if the child was aborted for one (its held lines dropped), else None."""
    if not self.report or status != -signal.SIGABRT:
      self._flush()
      self.out.writelines(self.report)
      self.out.flush()
      return None
    if self.process is not None:  # --process_id and --num_processes may be left to JAX to detect
      process_id = self.process[0] if process_id is None else process_id
      num_processes = num_processes or self.process[1]
    said = "".join(self.held + self.report)
    named = re.search(r"unhealthy \(stopped sending heartbeats\):\s*((?:\d+[\s,]*)+)", said)
    dead = [int(n) for n in re.findall(r"\d+", named.group(1))] if named else []
    if not dead and process_id not in (None, 0):
      # The service names the tasks whose heartbeats stopped; it names none when it is itself gone. It runs in
      # process 0 (jax.distributed's coordinator), and a process that loses it is aborted at once ("Failed to
      # send RPC to coordination service ... the leader task was preempted/died/restarted unexpectedly or this
      # task is experiencing network issues"): process 0 stopped responding, to this process at least.
      dead = [0]
    total = f" of {num_processes}" if num_processes else ""
    if len(dead) == 1:
      who = f"process {dead[0]}{total}" + (" (the coordinator)" if dead[0] == 0 else "")
    else:
      who = f"processes {', '.join(map(str, dead))}{total}" if dead else "another process"
    at = f"at step {self.step}" if self.step is not None else "before its first step"
    return (f"{who} stopped responding {at}, so this one stopped too; "
            "resume with the same command (it goes on from the last checkpoint)")
