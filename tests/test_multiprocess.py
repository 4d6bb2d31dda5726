"""Two processes equal one: run.py --multihost with JAX's multi-process runtime, 2 processes on localhost.

Each process has 2 forced CPU devices and exchanges arrays through gloo (JAX's CPU collectives); the
reference is 1 process with 4 devices, the same 4-way data-parallel step. Checkpoints cross between the
two layouts both ways, and SIGTERM to one process stops the whole job with a checkpoint that resumes.

Equal to float32 round-off, not bit for bit: the 2-process all-reduce (gloo) sums the four devices'
gradients in another order than one process's does; after 16 steps the largest difference in any parameter
or optimiser moment was 1.2e-7. The metrics records are held to 1e-4 relative.
"""

import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from rpr import writers
from tests.test_train import ROOT, _env, compilation_cache, load_state  # noqa: F401 (a fixture)

TINY = ["--config=configs/tiny.py", "--config.eval_every_steps=8", "--config.checkpoint_every_steps=4",
        "--config.log_every_steps=4", "--config.keep_checkpoints=3", "--config.model.dropout_rate=0.1"]


def _port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(args, workdir, cache, processes):
  """run.py as ``processes`` processes of 4 // processes CPU devices each (one plain process for 1)."""
  env = _env(cache, devices=4 // processes)
  if processes == 1:
    cmds = [[sys.executable, "run.py", *args, f"--workdir={workdir}"]]
  else:
    address = f"localhost:{_port()}"
    cmds = [[sys.executable, "run.py", *args, f"--workdir={workdir}", "--multihost",
             f"--coordinator_address={address}", f"--num_processes={processes}", f"--process_id={i}"]
            for i in range(processes)]
  return [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for c in cmds]


def finish(procs, codes=(0,)):
  errors = [p.communicate(timeout=600)[1] for p in procs]
  for p, err in zip(procs, errors):
    assert p.returncode in codes, (p.returncode, err[-3000:])
  return errors


def _timeless(path):
  return [{k: v for k, v in r.items() if k != "train/steps_per_sec"} for r in writers.read_jsonl(path)]


def assert_same_run(a, b, step):
  """Equal parameters and optimiser state (to float32 round-off) and the same metrics records."""
  x, y = load_state(a, step), load_state(b, step)
  assert sorted(x) == sorted(y)
  for k in x:
    np.testing.assert_allclose(x[k], y[k], rtol=1e-5, atol=1e-6, err_msg=k)
  mx, my = _timeless(a / "metrics.jsonl"), _timeless(b / "metrics.jsonl")
  assert [r["step"] for r in mx] == [r["step"] for r in my]
  for r, s in zip(mx, my):
    assert r.keys() == s.keys()
    for k in r:
      np.testing.assert_allclose(r[k], s[k], rtol=1e-4, err_msg=(r["step"], k))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, compilation_cache):
  """1 process x 4 devices: 8 steps (kept aside as a starting point), then on to 16."""
  path = tmp_path_factory.mktemp("straight")
  finish(launch([*TINY, "--config.num_train_steps=8"], path, compilation_cache, 1))
  half = tmp_path_factory.mktemp("half") / "run"
  shutil.copytree(path, half)
  finish(launch([*TINY, "--config.num_train_steps=16"], path, compilation_cache, 1))
  return path, half


def test_two_processes_train_as_one_and_checkpoints_cross_both_ways(straight, tmp_path, compilation_cache):
  reference, half = straight
  # 2 processes for 8 steps, then 1 process on to 16: the 2-process checkpoint restores in 1.
  two_then_one = tmp_path / "two_then_one"
  errors = finish(launch([*TINY, "--config.num_train_steps=8"], two_then_one, compilation_cache, 2))
  assert all("JAX process %d of 2, 2 local / 4 global devices" % i in e for i, e in enumerate(errors))
  assert_same_run(half, two_then_one, 8)
  finish(launch([*TINY, "--config.num_train_steps=16"], two_then_one, compilation_cache, 1))
  assert_same_run(reference, two_then_one, 16)
  # 1 process for 8 steps, then 2 processes on to 16: the 1-process checkpoint restores in 2.
  one_then_two = tmp_path / "one_then_two"
  shutil.copytree(half, one_then_two)
  finish(launch([*TINY, "--config.num_train_steps=16"], one_then_two, compilation_cache, 2))
  assert_same_run(reference, one_then_two, 16)


def test_sigterm_to_one_process_stops_the_job_with_a_checkpoint_and_it_resumes(straight, tmp_path,
                                                                               compilation_cache):
  reference, _ = straight
  path = tmp_path / "stopped"
  procs = launch([*TINY, "--config.num_train_steps=16"], path, compilation_cache, 2)
  while not (path / "metrics.jsonl").exists() or not writers.read_jsonl(path / "metrics.jsonl"):
    assert all(p.poll() is None for p in procs), "the job ended before its first record"
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)  # one host only, as a preemption notice would
  errors = finish(procs, codes=(0, 3))
  stopped = [p.returncode for p in procs]
  assert stopped in ([3, 3], [0, 0]), (stopped, errors[0][-2000:])  # both stop, or both had already finished
  finish(launch([*TINY, "--config.num_train_steps=16"], path, compilation_cache, 2))
  x, y = load_state(reference, 16), load_state(path, 16)
  for k in x:
    np.testing.assert_allclose(x[k], y[k], rtol=1e-5, atol=1e-6, err_msg=k)
