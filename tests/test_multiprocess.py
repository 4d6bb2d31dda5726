"""Two processes equal one: run.py --multihost with JAX's multi-process runtime, 2 processes on localhost
(the batch placement of rpr.sharding, each process building its own rows; checkpoints and the stop signal
across processes), for the encoder-decoder (configs/tiny.py) and the language model (configs/lm.py:tiny, whose
vocabulary process 0 makes while process 1 waits).

Each process has 2 forced CPU devices and exchanges arrays through gloo (JAX's CPU collectives); the
reference is 1 process with 4 devices, the same 4-way data-parallel step. Checkpoints cross between the
two layouts both ways, and SIGTERM to one process stops the whole job with a checkpoint that resumes.

Equal to float32 round-off, not bit for bit: the 2-process all-reduce (gloo) sums the four devices'
gradients in another order than one process's does; after 16 steps the largest difference in any parameter
or optimiser moment was 1.2e-7. The metrics records are held to 1e-4 relative.
"""

import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from rpr.records import read_jsonl
from tests.test_checkpoint import flip_byte
from tests.test_train import ROOT, _env, load_state, timeless_records

TINY = ["--config=configs/tiny.py", "--config.eval_every_steps=12", "--config.checkpoint_every_steps=4",
        "--config.log_every_steps=4", "--config.keep_checkpoints=3", "--config.model.dropout_rate=0.1",
        "--config.tensorboard=False",  # TensorBoard events (process 0 only) would add TensorFlow's 6 s of import
        "--config.eval_splits=('valid',)"]  # one split: the long one's decoder adds about 1 s to each process


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



def assert_same_run(a, b, step, stopped=()):
  """Equal parameters and optimiser state (to float32 round-off) and the same metrics records, but the first
  ``train/*`` record after a stop at a step in ``stopped``, which averages only the steps trained since."""
  x, y = load_state(a, step), load_state(b, step)
  assert sorted(x) == sorted(y)
  for k in x:
    np.testing.assert_allclose(x[k], y[k], rtol=1e-5, atol=1e-6, err_msg=k)
  mx, my = timeless_records(a / "metrics.jsonl"), timeless_records(b / "metrics.jsonl")
  assert [r["step"] for r in mx] == [r["step"] for r in my]
  for r, s in zip(mx, my):
    assert r.keys() == s.keys()
    after_stop = any(r["step"] - 4 < n < r["step"] for n in stopped)
    for k in (k for k in r if not (after_stop and k.startswith("train/"))):
      np.testing.assert_allclose(r[k], s[k], rtol=1e-4, err_msg=(r["step"], k))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, compilation_cache):
  """1 process x 4 devices, 12 steps: the reference, with its checkpoints of steps 4, 8 and 12."""
  path = tmp_path_factory.mktemp("straight")
  finish(launch([*TINY, "--config.num_train_steps=12"], path, compilation_cache, 1))
  return path


@pytest.mark.slow
def test_two_processes_train_as_one_stop_together_and_checkpoints_cross_both_ways(straight, tmp_path,
                                                                                   compilation_cache):
  # 2 processes; SIGTERM to one of them after the first record stops both with a checkpoint (exit status 3),
  # or both finish if the job was quicker; then 1 process resumes the 2-process checkpoint and ends on the
  # straight run's state: the 2 processes trained as the 1 did, and their checkpoint restores in 1.
  path = tmp_path / "two_then_one"
  procs = launch([*TINY, "--config.num_train_steps=12"], path, compilation_cache, 2)
  while not (path / "metrics.jsonl").exists() or not read_jsonl(path / "metrics.jsonl"):
    assert all(p.poll() is None for p in procs), "the job ended before its first record"
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)  # one host only, as a preemption notice would
  errors = finish(procs, codes=(0, 3))
  assert [p.returncode for p in procs] in ([3, 3], [0, 0]), errors[0][-2000:]  # both stop, or neither
  assert all("JAX process %d of 2, 2 local / 4 global devices" % i in e for i, e in enumerate(errors))
  finish(launch([*TINY, "--config.num_train_steps=12"], path, compilation_cache, 1))
  stopped = [int(n) for e in errors for n in re.findall(r"Stopped by signal after step (\d+)", e)]
  assert_same_run(straight, path, 12, stopped)
  # 1 process to step 8 (the straight run with its newest checkpoint, 12, damaged), then 2 processes on to 12:
  # both find step 12 damaged, agree to fall back to step 8 (rpr.checkpoint.agreed) and resume from it.
  path = tmp_path / "one_then_two"
  shutil.copytree(straight, path)
  flip_byte(path / "checkpoints" / "12")
  errors = finish(launch([*TINY, "--config.num_train_steps=12"], path, compilation_cache, 2))
  for e in errors:
    assert re.search(r"resuming from step 8\b", e) and "Resumed from the checkpoint of step 8" in e, e[-3000:]
  assert_same_run(straight, path, 12)


@pytest.mark.slow
def test_a_language_model_trains_in_two_processes_as_in_one_and_its_vocabulary_is_made_once(tmp_path,
                                                                                            compilation_cache):
  # The decoder-only LM on a small corpus of our own: its TFDS data made here, its vocabulary left to the run.
  # 2 processes start together on the fresh data folder: process 0 trains the vocabulary, process 1 waits for it
  # and loads it. Then 1 process (4 devices) trains the same job on it: the 2 processes trained as it does.
  from rpr.data import sotu
  from tests.data import test_sotu

  corpus, data_dir = tmp_path / "corpus", tmp_path / "tfds"
  corpus.mkdir()
  sotu.prepare(str(data_dir), str(corpus), test_sotu.make_tarball(corpus))
  lm = ["--config=configs/lm.py:tiny", f"--config.data_dir={data_dir}", f"--config.corpus_dir={corpus}",
        "--config.lm_context_length=8", "--config.batch_size=8", "--config.num_train_steps=24",
        "--config.log_every_steps=4", "--config.checkpoint_every_steps=8", "--config.keep_checkpoints=2",
        "--config.eval_splits=('validation',)", "--config.tensorboard=False"]  # one window length to compile
  errors = finish(launch(lm, tmp_path / "two", compilation_cache, 2))
  assert ["Training a 1000-piece SentencePiece vocabulary" in e for e in errors] == [True, False], errors[1][-2000:]
  assert "Loaded SentencePiece vocabulary" in errors[1]
  for i, e in enumerate(errors):  # each process builds the rows of its own 2 devices only
    assert f"Process {i} builds rows {4 * i}:{4 * i + 4} of 8 of training batch 0" in e, e[-2000:]
  finish(launch(lm, tmp_path / "one", compilation_cache, 1))
  assert_same_run(tmp_path / "one", tmp_path / "two", 24)
