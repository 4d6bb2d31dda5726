"""Progress of a long phase in the log: counts, rate and ETA every ``EVERY_SECONDS``, then the phase's total time.

Training logs ``step 100/4000: ..., ETA 0:28:47``; the other phases that can
take minutes (building a data set, training a vocabulary, tokenising, the
evaluation's decoding) log the same way through one :class:`Progress`::

  progress = Progress("evaluation", total=48, unit="batches")
  for batch in batches:
    ...
    progress.update()  # a line only when EVERY_SECONDS have passed since the last
  progress.finish()  # "evaluation: 48 batches done in 0:05:47"

A phase spent inside a library call that reports nothing (SentencePiece's
trainer, TFDS generating a data set) runs under :meth:`Progress.ticking`, a
thread that logs the elapsed time and whatever count the phase has reached.
"""

from __future__ import annotations

import contextlib
import threading
import time

from absl import logging

# Lines at most this often: a phase of minutes gets a line per ~15 s, never a flood.
EVERY_SECONDS = 15.0


def clock(seconds: float) -> str:
  """``H:MM:SS``, the form of training's ETA."""
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
  """Counts of one phase; ``total`` (None: unknown) gives the ETA, ``total_cost`` weights it (see ``update``)."""

  def __init__(self, phase: str, total: int | None = None, unit: str = "items", *,
               total_cost: float | None = None, hint: str = "", hint_after: float = 0.0):
    """``hint`` is added to the first line whose ETA exceeds ``hint_after`` seconds (how to make it shorter)."""
    self.phase, self.total, self.unit = phase, total, unit
    self.total_cost, self.hint, self.hint_after = total_cost, hint, hint_after
    self.done, self.cost, self.note = 0, 0.0, ""
    self.start = self._last = self._counted = time.monotonic()
    self._first: tuple[float, int, float] | None = None  # (time, done, cost) at the first update
    self._lock = threading.Lock()  # update() and the ticking thread both log

  def update(self, n: int = 1, cost: float = 0.0, note: str = "") -> None:
    """``n`` more items done, costing ``cost`` of ``total_cost`` (items of unequal cost: e.g. longer batches);
    ``note`` says where the phase is (shown in the next line)."""
    self.done += n
    self.cost += cost
    self._counted = time.monotonic()  # rates end here: a library may work on after the last item is counted
    # Rates start after the first update: the first item pays for compiling (a jitted search), the rest do not.
    self._first = self._first or (self._counted, self.done, self.cost)
    self.note = note or self.note
    self.log(due_only=True)

  def _baseline(self) -> tuple[float, int, float]:
    """(time, done, cost) that rates are measured from: the first update once there is a second."""
    return (self.start, 0, 0.0) if self._first is None or self.done == self._first[1] else self._first

  def eta(self) -> float | None:
    """Seconds left, from the rate so far; None before the first item or without a total."""
    if self._first is None:
      return None
    t, done, cost = self._baseline()
    elapsed, since = self._counted - t, time.monotonic() - self._counted
    if self.total_cost and self.cost > cost:
      return max(0.0, elapsed * (self.total_cost - self.cost) / (self.cost - cost) - since)
    if self.total and self.done > done:
      return max(0.0, elapsed * (self.total - self.done) / (self.done - done) - since)
    return None

  def log(self, due_only: bool = False) -> None:
    """One line (``due_only``: if ``EVERY_SECONDS`` have passed since the last): ``phase: 12/48 batches, note,
    0.14 batches/s, ETA 0:04:40``."""
    with self._lock:
      now = time.monotonic()
      if due_only and now - self._last < EVERY_SECONDS:
        return
      self._last, elapsed = now, now - self.start
      parts = []
      if self.done or self.total is not None:  # a phase that counts nothing shows its time alone
        parts.append(f"{self.done:,}" + (f"/{self.total:,}" if self.total is not None else "") + f" {self.unit}")
      if self.note:
        parts.append(self.note)
      if self.done and self.total is not None:  # a rate means little without a total to reach
        t, done, _ = self._baseline()
        rate = (self.done - done) / max(self._counted - t, 1e-9)
        parts.append(f"{rate:,.0f} {self.unit}/s" if rate >= 100 else f"{rate:.2f} {self.unit}/s")
      eta = self.eta()
      parts.append(f"ETA {clock(eta)}" if eta is not None else f"{clock(elapsed)} elapsed")
      # Not on the first item's rate alone: compiling inflates it, and the hint would cry wolf.
      warm = self._first is not None and self.done > self._first[1]
      if self.hint and warm and eta is not None and eta > self.hint_after:
        parts.append(self.hint)
        self.hint = ""  # said once
      logging.info("%s: %s", self.phase, ", ".join(parts))

  def finish(self) -> float:
    """Logs ``phase: N units done in H:MM:SS``; returns the seconds the phase took."""
    elapsed = time.monotonic() - self.start
    logging.info("%s: %sdone in %s", self.phase, f"{self.done:,} {self.unit} " if self.done else "", clock(elapsed))
    return elapsed

  @contextlib.contextmanager
  def ticking(self):
    """Logs a line every ``EVERY_SECONDS`` from a thread while the block runs (a library call that reports
    nothing; SentencePiece and TFDS release the GIL), then the total time unless the block raised."""
    stop = threading.Event()

    def tick():  # wakes often, logs when due: update() may log from the phase's own thread too
      while not stop.wait(EVERY_SECONDS / 4):
        self.log(due_only=True)

    thread = threading.Thread(target=tick, name=f"progress {self.phase}", daemon=True)
    thread.start()
    try:
      yield self
    finally:
      stop.set()
      thread.join()
    self.finish()
