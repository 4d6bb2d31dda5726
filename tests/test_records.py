"""rpr.records: reading metrics.jsonl, a restart's rewind, and reading a file with restarts in it."""

import json
import os

import pytest

from rpr import records


def test_rewind_drops_the_records_past_the_restored_step_and_a_torn_last_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (2, 4, 6)) + '{"step": 8, "x"')
  kept, dropped = records.rewind_jsonl(str(path), 4)
  assert [r["step"] for r in kept] == [2, 4] and dropped == 2
  assert records.read_jsonl(path) == kept
  assert records.rewind_jsonl(str(tmp_path / "none.jsonl"), 4) == ([], 0)
  path.write_text('{"step": 2}\nnot json\n{"step": 4}\n')
  with pytest.raises(ValueError, match="line 2"):
    records.rewind_jsonl(str(path), 4)


def test_last_step_and_set_aside_keep_every_earlier_file(tmp_path, monkeypatch):
  path = tmp_path / "metrics.jsonl"
  assert records.last_step(str(path)) == (0, False) and records.set_aside(str(path)) is None
  path.write_text('{"step": 0}\n')
  assert records.set_aside(str(path)) is None and path.exists()  # nothing trained: nothing to keep
  epoch = records.time.gmtime(0)
  monkeypatch.setattr(records.time, "gmtime", lambda *_: epoch)  # one second for every call
  names = []
  for n in range(3):
    path.write_text(f'{{"step": 4, "x": {n}}}\n{{"step": 6, "plateau/reached": 1.0}}\n{{"step": 8, "x"')
    assert records.last_step(str(path)) == (6, True)
    names.append(records.set_aside(str(path)))
    assert not path.exists()
  assert [os.path.basename(n) for n in names] == [
      "metrics.orphaned-19700101T000000Z.jsonl", "metrics.orphaned-19700101T000000Z-1.jsonl",
      "metrics.orphaned-19700101T000000Z-2.jsonl"]
  assert [json.loads(open(n).readline())["x"] for n in names] == [0, 1, 2]


def test_a_run_ends_where_its_plateau_rule_stopped_it_else_at_num_train_steps():
  # The one definition the sweeps (is a workdir finished?), the noise floor and the reports share.
  capped = [{"step": 10, "x": 1.0}, {"step": 20, "x": 2.0}]
  stopped = [*capped, {"step": 20, "plateau/reached": 1.0}]
  assert records.plateau_step(capped) is None and records.end_step(capped, 30) == 30
  assert records.plateau_step(stopped) == 20 and records.end_step(stopped, 30) == 20
  assert records.end_step(stopped, 15) == 15  # the cap lowered since: the cap


def test_dedupe_keeps_the_later_run_of_a_restart():
  first = [{"step": 2, "loss": 3.0}, {"step": 4, "loss": 2.5}, {"step": 4, "valid/loss": 2.6},
           {"step": 6, "loss": 2.0}]
  resumed = [{"step": 6, "loss": 2.1}, {"step": 8, "loss": 1.9}]  # restored at 4: step 6 again
  assert records.dedupe(first + resumed) == first[:3] + resumed
  restored_at_2 = [{"step": 4, "loss": 2.4}]  # a step below the last one seen: a restart
  assert records.dedupe(first + restored_at_2) == first[:1] + restored_at_2
  assert records.dedupe(first) == first  # train and eval records of one step are not a restart

