"""SIGTERM ends a run at any phase (rpr.stop): before the first training step, even with the main thread blocked
inside a C call (XLA initialising or compiling a large model), at once with exit status 3 and one warning, the
workdir's lock released and the workdir resumable; after it, at a step with a checkpoint (tests/test_train.py,
tests/test_workdir.py's kill-anywhere test)."""

import signal
import subprocess
import sys
import time

import pytest

from rpr import stop
from rpr import workdir
from rpr.records import read_jsonl
from tests.test_train import ROOT, _env, tiny_config, train_run

BLOCKED = """
import sys, time, numpy as np
from rpr import stop, workdir
workdir.acquire(sys.argv[1])
with stop.handle_signals() as request:
  stop.end_at_once(request, workdir.release_all)
  print("blocking", flush=True)
  if sys.argv[2] == "C":
    a = np.ones((4000, 4000))
    for _ in range(100):  # minutes of C code: no Python handler runs until a product returns
      a @ a
  else:
    for _ in range(6000):  # Python between short waits: its handler runs as soon as the signal arrives
      time.sleep(0.01)
"""


@pytest.mark.parametrize("main_thread", ["C", "Python"])
def test_a_signal_before_the_first_step_ends_the_process_at_once_in_one_line_and_releases_its_lock(tmp_path,
                                                                                                  main_thread):
  # In C code only the watcher thread acts; in Python the loop's handler runs too, and says nothing (its warning
  # of a checkpoint "after this step" beside the watcher's was two lines, the first of them untrue).
  proc = subprocess.Popen([sys.executable, "-c", BLOCKED, str(tmp_path), main_thread], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "blocking\n"
  time.sleep(0.3)
  t0 = time.time()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == stop.STOPPED and time.time() - t0 < 5, (proc.returncode, err[-2000:])
  [line] = [l for l in err.splitlines() if "Received" in l]
  assert "signal 15 before the first training step" in line and "resumes the workdir" in line
  assert (tmp_path / workdir.LOCK).read_text() == ""  # released: no stale-lock warning next time


FAST = ["--config=configs/tiny.py", "--config.num_train_steps=8", "--config.checkpoint_every_steps=4",
        "--config.log_every_steps=4", "--config.eval_splits=()", "--config.tensorboard=False"]


def test_sigterm_while_run_py_starts_up_ends_it_at_once_and_the_same_command_goes_on(tmp_path, compilation_cache):
  # A resumed run (from step 4) stopped while it restores and compiles: status 3, then the same command ends it.
  # The first 4 steps: FAST's config trained in this process.
  cmd = [sys.executable, "run.py", *FAST, f"--workdir={tmp_path}"]
  first = train_run(tiny_config(num_train_steps=4, checkpoint_every_steps=4, log_every_steps=4, eval_splits=(),
                                tensorboard=False), str(tmp_path))
  assert first["step"] == 4
  proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(compilation_cache), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  lines = []
  for line in proc.stderr:  # JAX is up: what follows is the restore, the compilation and the steps
    lines.append(line)
    if "JAX process 0 of 1" in line:
      break
  proc.send_signal(signal.SIGTERM)
  lines.extend(proc.stderr)
  assert proc.wait(timeout=60) == stop.STOPPED, "".join(lines)[-3000:]
  assert any("before the first training step" in l for l in lines) and not any("Traceback" in l for l in lines)
  assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [4]
  again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=_env(compilation_cache), timeout=300)
  assert again.returncode == 0 and "Took over the lock" not in again.stderr, again.stderr[-3000:]
  assert "Resumed from the checkpoint of step 4" in again.stderr
  assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [4, 8]
