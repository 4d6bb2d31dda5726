"""A dead peer named (rpr.peers): when one process of a multi-process run dies, the survivor ends within 30 s in
one line naming it, with exit status 2, and the same command resumes from the last checkpoint; the relay of a
child's stderr drops the coordination service's abort report and passes every other line on."""

import io
import re
import signal
import subprocess
import sys
import time

import pytest

from rpr import peers
from rpr.records import read_jsonl
from tests.test_multiprocess import _port
from tests.test_train import ROOT, _env
from tests.test_workdir import one_error_line

ABORT = """\
E1129 12:01:05.927017   27491 coordination_service.cc:1549] [1190] Use error polling to propagate the following \
error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error.
E1129 12:01:05.927603   27502 coordination_service_agent.cc:289] Polled an error from coordination service.
F1129 12:01:05.927815   27502 client.h:80] Terminating process because the JAX distributed service detected fatal \
errors. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1
*** Check failure stack trace: ***
    @     0x7f61230a71f5  (unknown)
Fatal Python error: Aborted
"""
STEPS = "I1129 12:00:00.515414 1400 loop.py:161] step 20/100: loss 1.6936\nI1129 12:00:01.1 1400 other.py:1] done\n"
# What process 1 says when process 0, and the coordination service with it, is gone (jaxlib 0.10.2): no task named.
LOST = """\
E1201 23:08:32.870013   26013 coordination_service_agent.cc:289] Polled an error from coordination service (this \
can be an error from this or another task).
F1201 23:08:32.870185   26013 client.h:80] Terminating process because the JAX distributed service detected fatal \
errors. This most likely indicates that another task died; see the other task logs for more details. absl::Status: \
UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted \
unexpectedly or this task is experiencing network issues.
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}
*** Check failure stack trace: ***
Fatal Python error: Aborted
"""
PROCESS_1 = "I1201 23:07:38.8 1400 run.py:236] JAX process 1 of 2, 1 local / 2 global devices (cpu).\n"


def relayed(text, status, process_id=0, num_processes=2):
  out = io.StringIO()
  relay = peers.Relay(out)
  for line in text.splitlines(keepends=True):
    relay.line(line)
  line = relay.end(status, process_id, num_processes)
  return out.getvalue(), line


def test_the_relay_names_the_dead_peer_of_an_abort_and_drops_its_report():
  out, line = relayed(STEPS + ABORT, -signal.SIGABRT)
  assert out == STEPS and line.startswith("process 1 of 2 stopped responding at step 20, so this one stopped too; "
                                          "resume with the same command")
  # The coordinator gone: named as process 0 by a process that knows its own index, from --process_id or from
  # run.py's log line when JAX detected it; a process that knows neither cannot tell which one died.
  coordinator = "process 0 of 2 (the coordinator) stopped responding "
  assert relayed(LOST, -signal.SIGABRT, process_id=1)[1].startswith(coordinator + "before its first step, so ")
  out, line = relayed(PROCESS_1 + STEPS + LOST, -signal.SIGABRT, process_id=None, num_processes=None)
  assert out == PROCESS_1 + STEPS and line.startswith(coordinator + "at step 20, so this one stopped too; ")
  assert relayed(STEPS + LOST, -signal.SIGABRT, process_id=None)[1].startswith("another process stopped responding "
                                                                               "at step 20")
  # Not aborted: the coordination service's lines are passed on, held back only until the child ends.
  out, line = relayed(ABORT.splitlines(keepends=True)[0] + "1\n" + STEPS, 0)
  assert line is None and out == ABORT.splitlines(keepends=True)[0] + "1\n" + STEPS
  out, line = relayed(STEPS + ABORT, 1)  # an abort of another kind: everything passed on
  assert line is None and out == STEPS + ABORT


JOB = ["--config=configs/tiny.py", "--config.num_train_steps=4000", "--config.checkpoint_every_steps=4",
       "--config.log_every_steps=4", "--config.eval_splits=()", "--config.tensorboard=False",
       "--heartbeat_seconds=3"]  # a survivor waits this long for a dead process's heartbeat (10 s by default)


def _start(workdir, cache, logs):
  address = f"localhost:{_port()}"
  return [subprocess.Popen([sys.executable, "run.py", *JOB, f"--workdir={workdir}", "--multihost",
                            f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}"],
                           cwd=ROOT, env=_env(cache, devices=2), stdout=subprocess.DEVNULL, stderr=log)
          for i, log in enumerate(logs)]


def _kill_after(procs, workdir, records, victim):
  """SIGKILL to process ``victim`` once metrics.jsonl holds ``records`` records; the survivor's exit status and
  the seconds it took to end."""
  path = workdir / "metrics.jsonl"
  while not path.exists() or len(read_jsonl(path)) < records:
    assert all(p.poll() is None for p in procs), "the job ended before the kill"
    time.sleep(0.05)
  procs[victim].kill()
  t0 = time.time()
  survivor = procs[1 - victim]
  survivor.wait(timeout=120)
  procs[victim].wait()
  return survivor.returncode, time.time() - t0


@pytest.mark.slow
def test_a_dead_peer_is_named_in_one_line_within_30_s_and_the_run_resumes(tmp_path, compilation_cache):
  # Process 1 killed: process 0 (the coordinator) notices its missing heartbeats. Then the same command resumes
  # from the last checkpoint, and process 0 is killed: process 1 loses the coordinator at once.
  workdir = tmp_path / "run"
  for attempt, victim, records in ((0, 1, 2), (1, 0, 1)):
    logs = [tmp_path / f"{attempt}.{i}.err" for i in range(2)]
    with open(logs[0], "w") as a, open(logs[1], "w") as b:
      procs = _start(workdir, compilation_cache, (a, b))
      before = len(read_jsonl(workdir / "metrics.jsonl")) if attempt else 0
      status, seconds = _kill_after(procs, workdir, before + records, victim)
    err = logs[1 - victim].read_text()
    proc = subprocess.CompletedProcess([], status, "", err)
    line = one_error_line(proc)  # exit status 2, one line, no traceback
    who = "process 0 of 2 (the coordinator)" if victim == 0 else "process 1 of 2"
    assert seconds < 30 and line.startswith(f"run.py: error: {who} stopped responding at step "), (seconds, line)
    assert line.endswith("resume with the same command (it goes on from the last checkpoint)")
    for noise in ("could not save", "Fatal Python error", "Terminating process", "Check failure"):
      assert noise not in err, err[-3000:]
    assert not re.search(r"^[EF]\d{4} ", err, re.M), err[-3000:]  # no error line of JAX's or orbax's
    if attempt:
      assert "Resumed from the checkpoint of step" in err, err[-3000:]


def test_the_heartbeat_timeout_given_reaches_jax_and_bounds_the_wait_for_a_verdict(monkeypatch):
  import jax

  given, slept = {}, []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *args, **kwargs: given.update(kwargs))
  monkeypatch.setattr(jax.config, "update", lambda *args: None)  # gloo: not for this process's own runtime
  peers.initialize("localhost:1234", 2, 0, 3)
  assert given["heartbeat_timeout_seconds"] == 3
  monkeypatch.setattr(peers, "running", lambda: True)
  monkeypatch.setattr(time, "sleep", slept.append)
  peers.settle(3)  # an error that may echo a dead peer waits out the heartbeat before it is reported
  assert slept == [3 + 5]
