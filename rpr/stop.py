"""SIGTERM and Ctrl-C as a request to stop: the training loop saves a checkpoint after its current step and returns.

``with handle_signals() as request:`` installs the handler (in the main
thread) and restores the previous one on exit. Nested uses share the
outermost request, so a signal that arrives while ``run.py`` still imports
JAX or compiles is seen by the loop that starts later.
"""

from __future__ import annotations

import contextlib
import signal
import threading

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
    logging.warning("Received signal %d: saving a checkpoint after this step, then stopping.", signum)
    self.requested = True


_current: list[Request] = []


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
