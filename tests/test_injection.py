"""Failure injection (issue 71), in the style of the kill-anywhere property test (tests/test_workdir.py): a failure
of a drawn kind at a drawn step ends the run with one line, a user error that run.py reports with exit status
2; once its cause is gone (and the line's remedy applied), the same run resumes and ends on the straight run's
state bit for bit, with each record once.

Every kind is an explicit example (each case covered on every run of the suite); hypothesis draws one more
combination. The cases run through processes elsewhere, each in its own test: a file size limit through
run.py (tests/test_failures.py), a dead peer (tests/test_peers.py), SIGTERM at any phase (tests/test_stop.py,
tests/test_workdir.py), damaged generated data (tests/test_damaged.py), huge values (tests/test_config.py,
tests/test_memory.py).
"""

import contextlib
import errno

import hypothesis
import numpy as np
import orbax.checkpoint as ocp
import pytest
from hypothesis import strategies as st

from rpr import checkpoint
from rpr import config as config_lib
from rpr import data
from rpr import records
from rpr import train
from rpr import workdir
from rpr import writers
from rpr.records import read_jsonl
from tests.test_failures import FAST, _FullDisk
from tests.test_train import load_state, tiny_config, timeless_records, train_run

USER_ERRORS = (config_lib.ConfigError, checkpoint.CheckpointError, workdir.Busy, workdir.Unusable, data.DataError,
               records.Damaged, records.Unwritable, train.NonFiniteError)  # run.py's _user_errors()
ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def _count(at):
  """A predicate true at its ``at // 2``-th call: the call of step ``at`` for what happens every 2 steps."""
  calls = []
  return lambda: (calls.append(1), len(calls) == at // 2)[1]


@contextlib.contextmanager
def save_fails(m, path, at):  # orbax's save raises at once
  real = ocp.CheckpointManager.save
  m.setattr(ocp.CheckpointManager, "save", lambda self, step, *a, **k: (_ for _ in ()).throw(ENOSPC) if step == at
            else real(self, step, *a, **k))
  yield "could not save the checkpoint of step"


@contextlib.contextmanager
def save_fails_in_the_background(m, path, at):  # orbax's last step of an asynchronous save, in its thread
  real, due = ocp.path.atomicity.AtomicRenameTemporaryPath.finalize, _count(at)

  async def finalize(self, *a, **k):
    if due():
      raise OSError(errno.EFBIG, "File too large")
    return await real(self, *a, **k)

  m.setattr(ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize", finalize)
  yield "could not save the checkpoint of step"


@contextlib.contextmanager
def metrics_write_fails(m, path, at):  # the disk fills while a record is appended
  real = writers.JsonlWriter.write_scalars

  def write_scalars(self, step, scalars):
    if step == at:
      self._file = _FullDisk(self._file)  # pylint: disable=protected-access
    return real(self, step, scalars)

  m.setattr(writers.JsonlWriter, "write_scalars", write_scalars)
  yield "metrics.jsonl: [Errno 28]"


@contextlib.contextmanager
def record_write_fails(m, path, at, name):  # the rename of config.json or processes.jsonl's new copy
  real, due = records.os.replace, _count(at if name == workdir.PROCESSES else 2)
  m.setattr(records.os, "replace", lambda src, dst: (_ for _ in ()).throw(ENOSPC)
            if str(dst).endswith(name) and due() else real(src, dst))
  yield f"{name}: [Errno 28]"


@contextlib.contextmanager
def damaged_record(m, path, at):  # a run to step ``at``, then a line of garbage before its last record
  train_run(tiny_config(**dict(FAST, num_train_steps=at)), str(path))
  lines = (path / "metrics.jsonl").read_bytes().splitlines(keepends=True)
  (path / "metrics.jsonl").write_bytes(b"".join(lines[:-1] + [b"\xffgarbage\n"] + lines[-1:]))
  yield f"line {len(lines)}: bytes that are not UTF-8"
  lines = (path / "metrics.jsonl").read_bytes().splitlines(keepends=True)  # the remedy: delete that line
  (path / "metrics.jsonl").write_bytes(b"".join(lines[:-2] + lines[-1:]))


@contextlib.contextmanager
def diverged(m, path, at):  # a learning rate far too high: non-finite at step 2, before the first save
  CONFIGS["lr"] = 1e30
  try:
    yield "non-finite training state at step 2"
  finally:
    CONFIGS.pop("lr")  # the remedy: a lower learning rate (allowed to differ from the failed run's config.json)


CONFIGS = {}
CASES = {"save": save_fails, "save_background": save_fails_in_the_background, "metrics": metrics_write_fails,
         "config_json": lambda m, p, at: record_write_fails(m, p, at, "config.json"),
         "processes_jsonl": lambda m, p, at: record_write_fails(m, p, at, workdir.PROCESSES),
         "damaged_record": damaged_record, "diverged": diverged}
STEPS = (2, 4, 6)


def _config():
  return tiny_config(**dict(FAST, **({"learning_rate": CONFIGS["lr"]} if "lr" in CONFIGS else {})))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  path = tmp_path_factory.mktemp("straight")
  train_run(tiny_config(**FAST), str(path))
  return path


EXAMPLES = {"save": 4, "save_background": 2, "metrics": 6, "config_json": 2, "processes_jsonl": 4,
            "damaged_record": 4, "diverged": 2}
assert set(EXAMPLES) == set(CASES)  # every case, on every run of the suite


def _examples(f):
  for case, at in EXAMPLES.items():
    f = hypothesis.example(case=case, at=at)(f)
  return f


@pytest.mark.slow
@hypothesis.settings(max_examples=1, deadline=None, derandomize=False, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@_examples
@hypothesis.given(case=st.sampled_from(sorted(CASES)), at=st.sampled_from(STEPS))
def test_a_failure_at_any_step_is_one_line_and_the_run_resumes(straight, tmp_path_factory, monkeypatch, case, at):
  path = tmp_path_factory.mktemp(f"{case}_{at}")
  with monkeypatch.context() as m:
    with CASES[case](m, path, at) as expected:
      with pytest.raises(USER_ERRORS) as e:
        train_run(_config(), str(path))
      message = str(e.value)
      assert "\n" not in message and expected in message, (case, at, message)
  out = train_run(tiny_config(**FAST), str(path), allow_config_change=("learning_rate",))
  assert out["step"] == 8
  a, b = load_state(straight, 8), load_state(path, 8)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=f"{case} at {at}: {k}")
  assert timeless_records(path / "metrics.jsonl") == timeless_records(straight / "metrics.jsonl")
  assert [r["step"] for r in read_jsonl(path / "metrics.jsonl")] == [2, 4, 6, 8]
