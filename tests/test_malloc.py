"""rpr.malloc: run.py and the sweep start with glibc's allocator setting unless the user set GLIBC_TUNABLES."""

import json
import subprocess
import sys

import pytest

from rpr import malloc
from tests.test_train import ROOT, _env


@pytest.mark.parametrize("given, glibc, restarts", [(None, True, True), ("", True, False),
                                                    ("glibc.malloc.arena_max=2", True, False), (None, False, False)],
                         ids=["unset", "opted-out", "the-user's", "not-glibc"])
def test_apply_restarts_the_same_command_with_the_setting_only_where_it_is_unset_and_glibc_reads_it(
    monkeypatch, given, glibc, restarts):
  if given is None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  else:
    monkeypatch.setenv("GLIBC_TUNABLES", given)
  monkeypatch.setattr(malloc, "applies", lambda: glibc)
  calls = []
  monkeypatch.setattr(malloc.os, "execve", lambda *args: calls.append(args))
  malloc.apply()
  if restarts:
    ((path, argv, env),) = calls
    assert path == sys.executable and argv == sys.orig_argv and env["GLIBC_TUNABLES"] == malloc.TUNABLES
  else:
    assert not calls


@pytest.mark.skipif(not malloc.applies(), reason="glibc's GLIBC_TUNABLES needs Linux with glibc")
def test_a_plain_run_py_trains_with_the_setting_in_the_process_it_started_as(tmp_path, compilation_cache):
  env = {k: v for k, v in _env(compilation_cache).items() if k != "GLIBC_TUNABLES"}
  proc = subprocess.Popen([sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
                           "--config.num_train_steps=2", "--config.eval_splits=()", "--config.tensorboard=False"],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 0, stderr[-3000:]
  record = json.loads((tmp_path / "config.json").read_text())
  assert record["glibc_tunables"] == malloc.TUNABLES
  (span,) = [json.loads(line) for line in (tmp_path / "processes.jsonl").read_text().splitlines()]
  assert span["pid"] == proc.pid  # the same process, restarted in place
