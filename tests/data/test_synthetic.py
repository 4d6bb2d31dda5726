"""rpr.data registry and the synthetic copy/reverse tasks follow the Task protocol."""

import jax
import ml_collections
import numpy as np
import pytest

from rpr import data
from rpr.data.task import BOS, EOS, PAD, CharVocab
from tests.conftest import assert_rows_are_slices


def _config(dataset="reverse"):
  return ml_collections.ConfigDict(dict(dataset=dataset, batch_size=8, eval_batch_size=5, min_length=2,
                                        max_length=5, long_max_length=7, num_eval_examples=12, seed=3))


def test_registry_names_and_unknown_name():
  assert {"copy", "reverse"} <= set(data.names())
  with pytest.raises(ValueError, match=r"config.dataset.*allowed.*copy"):
    data.get_task(_config("nope"))


@pytest.mark.parametrize("kind", ["copy", "reverse"])
def test_batches_are_pure_in_step_and_solve_the_task(kind):
  task = data.get_task(_config(kind))
  a, b, c = task.train_batch(7), task.train_batch(7), task.train_batch(8)
  for k in ("inputs", "targets"):
    np.testing.assert_array_equal(a[k], b[k])
    assert a[k].dtype == np.int32
  assert not np.array_equal(a["inputs"], c["inputs"])
  assert a["inputs"].shape == (8, 5) and a["targets"].shape == (8, 6)
  assert_rows_are_slices(task, (0, 7))
  for x, y in zip(a["inputs"], a["targets"]):
    s = task.vocab.decode(x)
    assert 2 <= len(s) <= 5
    assert task.vocab.decode(y) == (s if kind == "copy" else s[::-1])
    assert y[len(s)] == EOS and np.all(y[len(s) + 1:] == PAD)


def test_eval_batches_cover_the_split_once_with_padded_last_batch():
  task = data.get_task(_config())
  batches = list(task.eval_batches("long"))
  assert [len(b["inputs"]) for b in batches] == [5, 5, 5]
  rows = np.concatenate([b["targets"] for b in batches])
  assert np.all(rows[12:] == PAD) and np.all(rows[:12, 0] != PAD)
  lengths = [len(task.vocab.decode(x)) for b in batches for x in b["inputs"]][:12]
  assert min(lengths) >= 6 and max(lengths) <= 7
  again = list(task.eval_batches("long"))
  np.testing.assert_array_equal(batches[0]["inputs"], again[0]["inputs"])
  with pytest.raises(ValueError, match="unknown split"):
    next(task.eval_batches("test"))


def test_decode_stops_at_eos_and_skips_pad_and_bos():
  vocab = CharVocab("ab")  # a = 3, b = 4
  assert vocab.decode([BOS, 3, PAD, 4, EOS, 3, 4]) == "ab"
  assert vocab.decode(np.array([4, 3, 3], np.int32)) == "baa"  # no EOS: everything


@pytest.mark.parametrize("process,zero_builds", [(0, True), (0, False), (1, True), (1, False)])
def test_process_0_builds_the_task_before_the_others_and_its_failure_stops_them_at_once(monkeypatch, process,
                                                                                      zero_builds):
  # Two processes, simulated: this one is ``process``; the broadcast carries whether process 0 built the task.
  from jax.experimental import multihost_utils

  events = []

  def get_task(config, workdir, num_devices):
    events.append("build")
    if process == 0 and not zero_builds:
      raise data.DataError("corpus missing")
    return "task"

  def broadcast(flag):
    events.append(f"told {int(flag)}")
    return np.int32(flag) if process == 0 else np.int32(zero_builds)

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: process)
  monkeypatch.setattr(data, "get_task", get_task)
  monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", broadcast)
  config = _config("copy")
  if zero_builds:
    assert data.get_task_once(config, "w", 4) == "task"
    assert events == (["build", "told 1"] if process == 0 else ["told 1", "build"])  # process 0 first
  elif process == 0:
    with pytest.raises(data.DataError, match="corpus missing"):
      data.get_task_once(config, "w", 4)
    assert events == ["build", "told 0"]  # the others are told before this one raises
  else:
    with pytest.raises(data.DataError, match="process 0 could not build data set 'copy'.*process 1 stops too"):
      data.get_task_once(config, "w", 4)
    assert events == ["told 1"]  # its own flag: it had nothing to build yet; it builds nothing
