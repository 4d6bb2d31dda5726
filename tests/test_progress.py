"""rpr.progress: the lines a long phase logs (counts, rate, ETA, the hint once, the total time), also from a thread."""

import logging
import threading
import types

import pytest

from rpr import progress


@pytest.fixture
def lines(caplog, monkeypatch):
  """The messages rpr.progress logs, every line due at once (EVERY_SECONDS = 0)."""
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)
  caplog.set_level(logging.INFO, logger="absl")
  return lambda: [r.getMessage() for r in caplog.records if r.module == "progress"]


def test_counts_rate_eta_and_a_final_line_with_the_total_time(lines):
  p = progress.Progress("decoding", total=4, unit="batches", hint="cap it", hint_after=-1.0)
  p.update(note="in test")
  p.update(2)
  p.update()
  p.finish()
  first, second, third, last = lines()
  assert first.startswith("decoding: 1/4 batches, in test, ") and " batches/s, ETA 0:" in first
  assert "cap it" not in first  # the first item's rate alone (it compiles) gives no hint
  assert second.startswith("decoding: 3/4 batches, in test, ") and second.endswith(", cap it")
  assert "cap it" not in third  # said once
  assert last == "decoding: 4 batches done in 0:00:00"


def test_the_eta_follows_the_cost_left_and_leaves_out_the_first_items_compiling(monkeypatch):
  now = [0.0]
  monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
  p = progress.Progress("x", total=3, total_cost=12.0)
  now[0] = 30.0  # the first item (cost 1) compiles: 30 s
  p.update(cost=1.0)
  assert p.eta() == pytest.approx(30.0 * 11)  # nothing better known yet
  now[0] = 32.0  # the second (cost 1) takes 2 s: the last costs 10, so 20 s are left
  p.update(cost=1.0)
  assert p.eta() == pytest.approx(20.0)
  now[0] = 37.0
  assert p.eta() == pytest.approx(15.0)  # the time since the last item counts down


def test_a_silent_call_is_timed_by_a_thread_while_it_runs(lines, monkeypatch):
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0.01)
  ran = threading.Event()
  p = progress.Progress("vocabulary", unit="sentences")
  p.update(5)
  with p.ticking():
    ran.wait(0.2)  # the phase blocks; the thread logs meanwhile
  *during, last = lines()
  assert during and all(line.startswith("vocabulary: 5 sentences, 0:00:00 elapsed") for line in during)
  assert last == "vocabulary: 5 sentences done in 0:00:00"
