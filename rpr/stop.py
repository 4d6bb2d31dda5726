"""SIGTERM and Ctrl-C as a request to stop: the training loop saves a checkpoint after its current step and returns.

``with handle_signals() as request:`` installs the handler (in the main
thread) and restores the previous one on exit. Nested uses share the
outermost request, so a signal that arrives while ``run.py`` still imports
JAX or compiles is seen by the loop that starts later.

Before the first training step there is nothing new to save, and the main
thread may be blocked for minutes inside XLA (initialising or compiling a
large model), where no Python handler runs. :func:`end_at_once` (``run.py``)
makes a signal end the process at once in that phase, from a thread that
the signal wakes (``signal.set_wakeup_fd``): one warning, the workdir's lock
released, exit status :data:`STOPPED`; the loop calls :func:`stepping` once
its first step is launched, and from then on a signal stops it after a step,
with a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)  # kill and Ctrl-C
# Exit status of a run or sweep a signal stopped: a checkpoint is saved and the same command resumes it. The one
# definition: run.py and experiments/ import it from here.
STOPPED = 3


class Request:
  """Set by a signal; read by the loop between steps."""

  def __init__(self):
    self.requested = False

  def __call__(self, signum, frame):
    self.requested = True
    if not _at_once:  # before the first step the watcher thread ends the process, in its own one warning
      logging.warning("Received signal %d: saving a checkpoint after this step, then stopping.", signum)


_current: list[Request] = []
_at_once: list[Callable[[], None]] = []  # the clean-up of a process a signal ends at once, until stepping()


@contextlib.contextmanager
def handle_signals():
  if _current:
    yield _current[-1]
    return
  request = Request()
  if threading.current_thread() is not threading.main_thread():  # signals go to the main thread only
    yield request
    return
  previous = {s: signal.signal(s, request) for s in SIGNALS}
  _current.append(request)
  try:
    yield request
  finally:
    _current.pop()
    for s, handler in previous.items():
      signal.signal(s, handler)


def requested() -> bool:
  """Whether a signal asked the process to stop (False outside :func:`handle_signals`)."""
  return bool(_current) and _current[-1].requested


def end_at_once(request: Request, clean_up: Callable[[], None]) -> None:
  """Until :func:`stepping`, a signal (or one ``request`` already holds) ends the process at once: one warning,
  ``clean_up()``, exit status :data:`STOPPED`. From the main thread, inside :func:`handle_signals`."""
  read, write = os.pipe()
  os.set_blocking(write, False)
  signal.set_wakeup_fd(write, warn_on_full_buffer=False)  # the C handler writes each signal's number there
  _at_once[:] = [clean_up]
  if request.requested:
    _end(None)
  threading.Thread(target=_watch, args=(read,), daemon=True, name="rpr_stop_at_once").start()


def stepping() -> None:
  """The training loop launched its first step: from now on a signal stops it after a step, with a checkpoint."""
  _at_once.clear()


def _watch(fd: int) -> None:
  while True:
    signum = os.read(fd, 1)[0]
    if _at_once:
      _end(signum)


def _end(signum) -> None:
  clean_up = _at_once[0]
  logging.warning("Received %s before the first training step (starting up, initialising or compiling): stopped "
                  "at once with nothing new to save; the same command resumes the workdir from its last "
                  "checkpoint.", f"signal {signum}" if signum else "a signal")
  try:
    clean_up()
  finally:
    logging.flush()
    sys.stderr.flush()
    os._exit(STOPPED)  # pylint: disable=protected-access  (the main thread may be inside XLA)
