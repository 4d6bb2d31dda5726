"""Failures that end in one line and lose nothing: saves, writes and records that fail or are damaged, clean-up
that never hides the first error (rpr.failures), the lock a clean exit leaves, divergence named and warned of."""

import contextlib
import errno
import json
import logging
import os
import re
import subprocess
import sys
import types
import warnings

import orbax.checkpoint as ocp
import pytest
from absl import flags

from rpr import checkpoint
from rpr import data
from rpr import failures
from rpr import record
from rpr import records
from rpr import train
from rpr import workdir
from rpr import writers
from rpr.records import read_jsonl
from tests.test_train import ROOT, _SigtermAt, _env, tiny_config
from tests.test_workdir import one_error_line
from tests.test_train import ConfigError, validate, train_run

FAST = dict(num_train_steps=8, eval_splits=(), log_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=2,
            tensorboard=False)


def warnings_of(caplog, text: str) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


# ----------------------------------------------------------------------------
# Clean-up: every step runs, the first error is the one raised.


def test_clean_up_runs_every_step_and_the_first_error_wins(caplog):
  ran = []

  def failing(name, error):
    def step():
      ran.append(name)
      raise error
    return step

  with caplog.at_level(logging.WARNING), pytest.raises(KeyError, match="first"):
    try:
      raise KeyError("first")
    finally:
      failures.clean_up(failing("a", ValueError("closing")), lambda: ran.append("b"),
                        failing("c", OSError(errno.ENOSPC, "No space left on device")))
  assert ran == ["a", "b", "c"]
  [warning] = warnings_of(caplog, "Cleaning up")
  assert "ValueError: closing" in warning and "No space left on device" in warning
  caplog.clear()
  with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="closing"):  # no error before: the first
    failures.clean_up(failing("d", ValueError("closing")), failing("e", OSError(errno.EIO, "I/O error")))
  assert ran[-2:] == ["d", "e"] and len(warnings_of(caplog, "I/O error")) == 1
  failures.clean_up(lambda: ran.append("f"))
  caplog.clear()
  with caplog.at_level(logging.WARNING):  # quiet: a repeat of a failure already reported
    failures.clean_up(failing("g", ValueError("again")), lambda: ran.append("h"), quiet=True)
  assert ran[-3:] == ["f", "g", "h"] and not caplog.records


# ----------------------------------------------------------------------------
# Saves that fail: at once, or in orbax's background; the next run resumes (never "finished").


def test_a_save_that_fails_at_once_stops_the_run_and_no_error_closing_replaces_it(tmp_path, monkeypatch, caplog):
  real_save, real_close = ocp.CheckpointManager.save, ocp.CheckpointManager.close

  def save(self, step, *args, **kwargs):
    if step == 4:
      raise OSError(errno.EFBIG, "File too large")
    return real_save(self, step, *args, **kwargs)

  def close(self):  # orbax raising again while closing after the failure
    real_close(self)
    raise ValueError("the save of step 4 failed")

  def writer_close(self):
    raise OSError(errno.EIO, "Input/output error")

  with monkeypatch.context() as m, caplog.at_level(logging.WARNING):
    m.setattr(ocp.CheckpointManager, "save", save)
    m.setattr(ocp.CheckpointManager, "close", close)
    m.setattr(writers.JsonlWriter, "close", writer_close)
    with pytest.raises(checkpoint.SaveError, match=r"could not save the checkpoint of step 4 in \S+: \[Errno 27\] File "
                       r"too large; the run stopped, its last saved checkpoint is step 2: free space .*resume"):
      train_run(tiny_config(**FAST), str(tmp_path))
  [warning] = warnings_of(caplog, "Cleaning up")  # the writer's; orbax's own repeat of the failure is no news
  assert "Input/output error" in warning and "step 4 failed" not in warning
  out = train_run(tiny_config(**FAST), str(tmp_path))  # resumes from step 2
  assert out["step"] == 8 and [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [2, 4, 6, 8]


@pytest.mark.parametrize("every, failed, stopped", [(2, 2, 4), (100, 8, 8)])
def test_a_save_that_fails_in_the_background_stops_the_run_at_the_next_save_and_the_next_run_starts_over(
    tmp_path, monkeypatch, caplog, every, failed, stopped):
  # Saves every 2 steps: that of step 2 fails, found at the next (4). Only the last one (8): found as the run ends.
  async def finalize(self):  # orbax's last step of an asynchronous save, in its own thread
    raise OSError(errno.EFBIG, "File too large")

  config = tiny_config(**dict(FAST, checkpoint_every_steps=every))
  with monkeypatch.context() as m, caplog.at_level(logging.WARNING):
    m.setattr(ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize", finalize)
    with pytest.raises(checkpoint.SaveError, match=rf"checkpoint of step {failed} .*: \[Errno 27\] File too large; "
                       r".*last saved checkpoint is none: .*start again"):
      train_run(config, str(tmp_path))
  assert workdir.checkpoint_steps(str(tmp_path)) == []
  # Not trained on past the step it was found at; its records kept aside, so the workdir does not read as finished.
  [aside] = tmp_path.glob("metrics.orphaned-*.jsonl")
  assert [r["step"] for r in read_jsonl(aside)] == list(range(2, stopped + 1, 2))
  assert not (tmp_path / "metrics.jsonl").exists()
  assert len(warnings_of(caplog, "No checkpoint of this run was saved")) == 1
  out = train_run(config, str(tmp_path))
  assert out["step"] == 8 and [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [2, 4, 6, 8]


def test_the_cause_of_a_failed_save_is_a_few_words():
  assert checkpoint._cause(OSError(errno.ENOSPC, "No space left on device")) == "[Errno 28] No space left on device"
  tensorstore = ValueError('OUT_OF_RANGE: Error writing "x" in OCDBT database: Failed to write 62215 bytes to file '
                           "6: File too large [os_error_code='27']\nmore")
  assert checkpoint._cause(tensorstore) == "[Errno 27] File too large"
  assert checkpoint._cause(RuntimeError("bad\nworse")) == "RuntimeError: bad"


def test_orbax_asyncio_and_tensorstore_reports_of_a_failed_save_are_left_to_its_one_line(monkeypatch):
  record = lambda name, path, level, msg: logging.LogRecord(name, level, path, 1, msg, None, None)
  orbax = "site-packages/orbax/checkpoint/_src/checkpoint_manager.py"
  keep = checkpoint._OrbaxLogFilter().filter
  assert not keep(record("absl", orbax, logging.ERROR, "Save Finalize thread (save_finalize) failed."))
  assert not keep(record("absl", orbax, logging.INFO, "Renaming a to b"))
  assert keep(record("absl", orbax, logging.WARNING, "a warning of orbax's"))
  assert not keep(record("asyncio", "asyncio/base_events.py", logging.ERROR, "Task exception was never retrieved\n"
                         "future: <Task finished coro=<f() done, defined at /site-packages/orbax/x.py:1>>"))
  assert keep(record("asyncio", "asyncio/base_events.py", logging.ERROR, "Task exception was never retrieved"))
  assert not keep(record("asyncio", "asyncio/base_events.py", logging.ERROR, "Future exception was never retrieved\n"
                         "ValueError: OUT_OF_RANGE: Error writing \"d/x\" in OCDBT database at "
                         "local file \"/w/checkpoints/2.orbax-checkpoint-tmp-7/_CHECKPOINT_METADATA\""))
  scope = {}
  exec(compile("def write():\n  raise ValueError('OUT_OF_RANGE')", "site-packages/orbax/serialization.py", "exec"),
       scope)
  try:
    scope["write"]()
  except ValueError:
    gathered = logging.LogRecord("asyncio", logging.ERROR, "asyncio/base_events.py", 1,
                                 "_GatheringFuture exception was never retrieved", None, sys.exc_info())
  assert not keep(gathered)
  assert keep(record("absl", "rpr/train.py", logging.ERROR, "ours"))
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  checkpoint.quiet_orbax_logs()
  checkpoint.quiet_orbax_logs()  # once
  for error in (RuntimeError("Event loop is closed"), RuntimeError("another")):
    sys.unraisablehook(types.SimpleNamespace(exc_type=type(error), exc_value=error, exc_traceback=None))
  assert [str(u.exc_value) for u in seen] == ["another"]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    checkpoint.quiet_orbax_logs()
    warnings.warn("coroutine 'async_serialize_from_host.<locals>.write_fragment' was never awaited", RuntimeWarning)
    warnings.warn("coroutine 'ours' was never awaited", RuntimeWarning)
  assert [str(w.message) for w in caught] == ["coroutine 'ours' was never awaited"]


# ----------------------------------------------------------------------------
# Writes that fail: one line naming the file, and what was written before stays readable.


class _FullDisk:
  """A file that takes the first 10 bytes of a write, then fails as a full disk does."""

  def __init__(self, f):
    self._f = f

  def fileno(self):
    return self._f.fileno()

  def write(self, data):
    self._f.write(data[:10])
    raise OSError(errno.ENOSPC, "No space left on device")

  def close(self):
    self._f.close()


def test_a_failed_append_to_metrics_jsonl_leaves_no_half_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  w = writers.JsonlWriter(str(path))
  w.write_scalars(2, {"train/loss": 1.5})
  w._file = _FullDisk(w._file)
  with pytest.raises(records.Unwritable, match=rf"could not write {re.escape(str(path))}: \[Errno 28\] No space left "
                     r"on device; .*intact"):
    w.write_scalars(4, {"train/loss": 1.25})
  w.close()
  assert read_jsonl(path) == [{"step": 2, "train/loss": 1.5}] and path.read_text().endswith("}\n")


def test_failed_writes_of_config_json_and_the_events_name_the_file(tmp_path, monkeypatch):
  record.write(str(tmp_path), {"config": {"a": 1}})
  with monkeypatch.context() as m:
    m.setattr(records.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system")))
    with pytest.raises(records.Unwritable, match=r"config.json: \[Errno 30\] Read-only file system"):
      record.write(str(tmp_path), {"config": {"a": 2}})
  assert json.loads((tmp_path / "config.json").read_text())["config"] == {"a": 1}
  assert sorted(os.listdir(tmp_path)) == ["config.json"]  # no .tmp left

  class OpError(Exception):  # TensorFlow's errors, without importing it
    pass

  class OutOfRangeError(OpError):
    pass

  class Events:
    def flush(self):
      raise OutOfRangeError("{{function_node __wrapped__FlushSummaryWriter}} run/events.out.tfevents.1; File too "
                            "large\n\tFailed to flush 6 events to run/events.out.tfevents.1\n\tCould not flush events "
                            "file.")

  events = writers._Events.__new__(writers._Events)
  events.workdir, events._writer = str(tmp_path), Events()
  with pytest.raises(records.Unwritable, match=r"TensorBoard events in .*: run/events.out.tfevents.1; File too large; "
                     r"the run stopped") as e:
    events.flush()
  assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------
# Damaged records: a last line cut short is skipped with a warning, any other damage is one line.

GOOD = b'{"step": 2, "x": 1}\n{"step": 4, "x": 2}\n'


@pytest.mark.parametrize("damage, error", [
    (b'{"step": 6, "x', None),  # cut short by a kill or a full disk: skipped
    (b'{"step": 6, "x": 3}\n\xff\xfe\n{"step": 8}\n', r"line 4: bytes that are not UTF-8"),
    (b'garbage\n{"step": 6}\n', r"line 3: not JSON"),
    (b'{"x": 3}\n', r"line 3: not a record with an integer step"),
    (b'{"step": 6, "x": 3', None),
    (b'[6]\n', r"line 3: not a record with an integer step"),
])
def test_damaged_records_are_skipped_if_cut_short_at_the_end_else_one_line(tmp_path, caplog, damage, error):
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(GOOD + damage)
  if error:
    with pytest.raises(records.Damaged, match=rf"{re.escape(str(path))}, {error}.*; allowed: .*fix or delete that "
                       r"line \(or move metrics.jsonl away"):
      records.rewind_jsonl(str(path), 10)
    return
  with caplog.at_level(logging.WARNING):
    assert records.last_step(str(path)) == (4, False)
    kept, dropped = records.rewind_jsonl(str(path), 10)
  assert [r["step"] for r in kept] == [2, 4] and dropped == 1 and path.read_bytes() == GOOD
  [warning] = warnings_of(caplog, "cut short")  # once, though read twice
  assert warning.startswith(f"{path}, line 3: cut short")


def test_a_run_resumes_after_a_cut_last_line_and_a_damaged_one_stops_it(tmp_path, monkeypatch):
  with monkeypatch.context() as m:  # stopped by SIGTERM after step 4: FAST throughout, its programs compiled once
    m.setitem(data.REGISTRY, "copy", data.Entry(lambda c: _SigtermAt(c, step=3)))
    assert train_run(tiny_config(**FAST), str(tmp_path))["step"] == 4
  with open(tmp_path / "metrics.jsonl", "ab") as f:
    f.write(b'{"step": 6, "train/lo')
  out = train_run(tiny_config(**FAST), str(tmp_path))
  assert out["step"] == 8 and [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [2, 4, 6, 8]
  lines = (tmp_path / "metrics.jsonl").read_bytes().splitlines(keepends=True)
  (tmp_path / "metrics.jsonl").write_bytes(b"".join(lines[:1] + [b"\x00\x00\n"] + lines[1:]))
  with pytest.raises(records.Damaged, match="line 2: not JSON"):
    train_run(tiny_config(**dict(FAST, num_train_steps=10)), str(tmp_path))


def test_a_config_json_without_a_config_is_one_line(tmp_path):
  (tmp_path / "config.json").write_text('{"config": null}')
  with pytest.raises(ConfigError) as e:
    validate(tiny_config(**FAST), num_devices=1, workdir=str(tmp_path), quiet=True)
  assert "\n" not in str(e.value) and "config.json does not read as a run record" in str(e.value)


# ----------------------------------------------------------------------------
# Divergence: the step named is the one whose update went non-finite; a loss that explodes is warned of.


def test_a_non_finite_update_is_named_by_the_step_it_reaches(tmp_path):
  # The first update (to step 1) makes the parameters about 1e30, finite; the second (to step 2) is not.
  with pytest.raises(train.NonFiniteError, match=r"non-finite training state at step 2: loss nan"):
    train_run(tiny_config(**dict(FAST, learning_rate=1e30)), str(tmp_path))


def test_a_loss_that_grows_by_orders_of_magnitude_is_warned_of_once(tmp_path, caplog):
  with caplog.at_level(logging.WARNING):
    out = train_run(tiny_config(**dict(FAST, learning_rate=1e3, log_every_steps=4,
                                                      num_train_steps=12)), str(tmp_path))
  losses = [r["train/loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
  assert out["step"] == 12 and min(losses) > 1e4, losses  # finite and diverged: no error ends it
  [warning] = warnings_of(caplog, "grew by orders of magnitude")
  assert re.search(r"at step 4, .*x the lowest before it, .* \(that of a uniform guess over \d+ tokens\)", warning)
  records_ = [{"step": 2, "train/loss": 2.0}, {"step": 4, "train/loss": 1.0}]
  assert not failures.warn_if_loss_grew(records_, 6, 50.0, vocab_size=16)  # a spike: worse than 1.0, not 100x
  assert failures.warn_if_loss_grew(records_, 6, 150.0, vocab_size=16)
  assert not failures.warn_if_loss_grew(records_ + [{"step": 6, "train/loss": 150.0}], 8, 1e4, vocab_size=16)


# ----------------------------------------------------------------------------
# The lock: a clean exit of run.py leaves it empty (a killed run's PID stays: tests/test_workdir.py).


@pytest.mark.parametrize("end", ["finished", "stopped by a signal", "user error"])
def test_every_clean_exit_of_run_py_leaves_the_lock_empty(tmp_path, monkeypatch, caplog, run_module, end):
  held = []

  def start(config, single):  # the run itself, after run.py took the lock
    held.append(json.loads((tmp_path / workdir.LOCK).read_text())["pid"])
    if end == "stopped by a signal":
      sys.exit(run_module.STOPPED)
    if end == "user error":
      raise records.Damaged("metrics.jsonl, line 2: not JSON")

  monkeypatch.setattr(run_module, "_start", start)
  flags.FLAGS(["run.py", f"--config={ROOT / 'configs' / 'tiny.py'}", f"--workdir={tmp_path}"])
  with pytest.raises((SystemExit, records.Damaged)) if end != "finished" else contextlib.nullcontext():
    run_module._run()
  assert held == [os.getpid()] and (tmp_path / workdir.LOCK).read_text() == ""
  assert records.Damaged in run_module._user_errors()  # one line, exit status 2
  with caplog.at_level(logging.WARNING), workdir.lock(str(tmp_path)):
    pass
  assert not warnings_of(caplog, "Took over the lock")


# ----------------------------------------------------------------------------
# run.py end to end: a file size limit from the start (ulimit -f) is one line, exit status 2, and a released
# lock; the same command with space again starts over (its records were set aside), without a stale-lock warning.

LIMITED = ["--config=configs/tiny.py", "--config.num_train_steps=8", "--config.checkpoint_every_steps=4",
           "--config.log_every_steps=2", "--config.eval_splits=()", "--config.tensorboard=False"]


def test_a_file_size_limit_from_the_start_is_one_line_and_the_next_run_starts_over(tmp_path, compilation_cache, caplog,
                                                                                   run_py_here):
  env = dict(_env(compilation_cache), JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=str(1 << 40))  # no cache writes
  cmd = [sys.executable, "run.py", *LIMITED, f"--workdir={tmp_path}"]
  limited = ["bash", "-c", 'ulimit -f 20 && exec "$@"', "bash", *cmd]  # 20 KiB, below any save: each fails
  proc = subprocess.run(limited, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
  line = one_error_line(proc)
  assert re.search(r"could not save the checkpoint of step 4 in \S+: \[Errno 27\] File too large; the run stopped, "
                   r"its last saved checkpoint is none: free space .*start again", line), line
  noise = [l for l in proc.stderr.splitlines() if re.match(r"E\d{4} |.*never (retrieved|awaited)", l)]  # orbax's
  assert not noise, noise
  assert (tmp_path / workdir.LOCK).read_text() == ""  # released: the next run has no stale lock to warn of
  assert not (tmp_path / "metrics.jsonl").exists() and list(tmp_path.glob("metrics.orphaned-*.jsonl"))
  # The same command again, with space: run.py in this process (conftest.py's run_py_here, its flag parser and main;
  # the limited run above is the one whose process matters), its warnings read from the log.
  with caplog.at_level(logging.WARNING):
    again = run_py_here([*LIMITED, f"--workdir={tmp_path}"])
  assert again.returncode == 0, again.stderr[-3000:]
  assert not warnings_of(caplog, "Took over the lock") and (tmp_path / workdir.LOCK).read_text() == ""
  assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [2, 4, 6, 8]
  assert workdir.checkpoint_steps(str(tmp_path)) == [8, 4]
