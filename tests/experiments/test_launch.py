"""experiments.launch: local jobs N at once, a run signalled mid-way that requeues and ends as an unbroken one, the
SLURM path through stub commands (the batch script, the array, the signal, the requeue), status, bad flags."""

import json
import logging
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest
from absl import flags as absl_flags

from experiments import launch
from experiments import settings
from experiments import status
from experiments import sweep as sweep_lib
from experiments import sweeps
from rpr import progress
from rpr import records as records_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# 50 steps of the tiny config with a checkpoint every 10: the run is seconds long, so a signal sent at its first
# record (step 10) lands mid-way.
# No TensorBoard events (test_train.py's run.py test has them) and one evaluation split: each run.py process is
# spared TensorFlow's import and the long split's decoder.
STEPS = 50
LONG_TINY = (("num_train_steps", STEPS), ("checkpoint_every_steps", 10), ("eval_every_steps", 25),
             ("tensorboard", False), ("eval_splits", ("valid",)))


def _job(workdir, settings=LONG_TINY, name="tiny"):
  from configs import tiny

  config = tiny.get_config()
  config.lock()
  for key, value in settings:
    config[key] = value
  argv = ("--config=configs/tiny.py", f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in settings))
  return launch.Job(name, str(workdir), argv, config)


def _env(cache):
  return {"JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _final(workdir):
  """The run's records at its last step, merged, without the wall-clock rate."""
  records = records_lib.dedupe(records_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  last = max(r["step"] for r in records)
  merged = {}
  for r in records:
    if r["step"] == last:
      merged.update(r)
  merged.pop("train/steps_per_sec", None)
  return merged


def _spans(workdir):
  return [(p["from_step"], p["to_step"]) for p in records_lib.read_jsonl(os.path.join(workdir, "processes.jsonl"))]


def _signal_when_training(workdir, send, failures):
  """Once ``workdir`` logs a step, ``send(pid of the run)``: from another thread, while the launcher waits."""
  try:
    deadline = time.time() + 240
    metrics = os.path.join(workdir, "metrics.jsonl")
    while time.time() < deadline:
      if os.path.exists(metrics) and records_lib.read_jsonl(metrics):
        with open(os.path.join(workdir, ".lock")) as f:
          send(json.load(f)["pid"])
        return
      time.sleep(0.02)
    failures.append("the run never logged a step")
  except Exception as e:  # pylint: disable=broad-except
    failures.append(repr(e))


def _parent(pid):
  with open(f"/proc/{pid}/status") as f:
    return int(next(line.split()[1] for line in f if line.startswith("PPid:")))


@pytest.mark.slow
def test_local_jobs_two_at_once_one_signalled_requeues_and_ends_as_the_unbroken_one(tmp_path, compilation_cache,
                                                                                    monkeypatch, caplog):
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)  # a progress line per running job at every poll
  caplog.set_level(logging.INFO, logger="absl")
  a, b = _job(tmp_path / "a", name="a"), _job(tmp_path / "b", name="b")
  folder = str(tmp_path / "submitit")
  failures = []

  def usr2_to_the_job(run_pid):  # as SLURM's time-limit signal: to the job's process, the run's parent
    job_pid = _parent(run_pid)
    with open(f"/proc/{job_pid}/cmdline") as f:
      assert "submitit.core._submit" in f.read()
    os.kill(job_pid, signal.SIGUSR2)

  watcher = threading.Thread(target=_signal_when_training, args=(a.workdir, usr2_to_the_job, failures))
  watcher.start()
  outcome = launch.launch([a, b], launch.Options(workers=2, pin=False), folder, env=_env(compilation_cache),
                          poll_s=0.2)
  watcher.join()
  assert not failures
  assert sorted(outcome["done"]) == sorted([a.workdir, b.workdir]) and not outcome["failed"]
  manifest = json.loads((tmp_path / "submitit" / "jobs.json").read_text())
  ids = {manifest[j.workdir]["job_id"] for j in (a, b)}
  assert len(ids) == 2
  # Both ran at once: the second job started before the first ended.
  spans = {w: _spans(w) for w in (a.workdir, b.workdir)}
  assert len(spans[b.workdir]) == 1 and spans[b.workdir][0] == (0, STEPS)
  # a: stopped mid-way with a checkpoint, then the requeued job resumed it from there to the end.
  (first, stop), (resumed, end) = spans[a.workdir]
  assert first == 0 and 0 < stop < STEPS and resumed == stop and end == STEPS, spans[a.workdir]
  err = pathlib.Path(manifest[a.workdir]["err"]).read_text()
  assert "Caught signal SIGUSR2" in err and "Requeued job" in err
  assert _final(a.workdir) == _final(b.workdir)
  # Every job's output and exit state are in the sweep's folder.
  for j in (a, b):
    assert pathlib.Path(manifest[j.workdir]["log"]).exists()
    with open(tmp_path / "submitit" / f"{manifest[j.workdir]['job_id']}_0_result.pkl", "rb") as f:
      assert pickle.load(f) == ("success", {"state": "done", "workdir": j.workdir})
  rows = status.status([a, b], folder)
  assert [(r.state, r.step, r.eta_s) for r in rows] == [("done", STEPS, None)] * 2
  # The runs' logs are files: the launcher's own log says how far each running run is.
  said = [r.getMessage().split() for r in caplog.records if r.module == "launch"]
  assert any(w[:3] == ["a", "running", "step"] and "ETA" in w for w in said), said
  # Launched again, both are finished: nothing is submitted.
  assert launch.launch([a, b], launch.Options(), folder)["skipped"] == [a.workdir, b.workdir]


def _stubs(tmp_path, monkeypatch):
  """sbatch, srun, sacct, scancel and scontrol on PATH, all tests/experiments/slurm_stub.py; their state folder."""
  bin_dir, state = tmp_path / "bin", tmp_path / "slurm"
  bin_dir.mkdir()
  state.mkdir()
  stub = bin_dir / "slurm_stub.py"
  stub.write_text(f"#!{sys.executable}\n" + (ROOT / "tests" / "experiments" / "slurm_stub.py").read_text())
  stub.chmod(0o755)
  for name in ("sbatch", "srun", "sacct", "scancel", "scontrol"):
    (bin_dir / name).symlink_to(stub)
  monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("SLURM_STUB_DIR", str(state))
  return state


@pytest.mark.slow
def test_slurm_array_through_stubs_signals_requeues_and_resumes(tmp_path, monkeypatch, compilation_cache):
  state = _stubs(tmp_path, monkeypatch)
  a = _job(tmp_path / "a", name="a")
  bad = _job(tmp_path / "b", name="b")  # the array's second run fails at once: run.py refuses an unknown key
  b = launch.Job("b", bad.workdir, bad.argv + ("--config.no_such_key=1",), bad.config)
  folder = str(tmp_path / "submitit")
  options = launch.Options(executor="slurm", partition="gpu", gpus_per_node=8, cpus_per_task=16, mem="200G",
                           time=600, account="lab", constraint="a100", array_parallelism=1 + 1, signal_delay_s=180)
  failures = []

  def time_limit(run_pid):  # what SLURM does --signal's seconds before the limit, through scancel's stand-in
    subprocess.check_call(["scancel", f"{manifest()[a.workdir]['job_id']}", "--signal=USR2"])

  manifest = lambda: json.loads((tmp_path / "submitit" / "jobs.json").read_text())
  watcher = threading.Thread(target=_signal_when_training, args=(a.workdir, time_limit, failures))
  outcome = launch.launch([a, b], options, folder, env=_env(compilation_cache))
  assert outcome["submitted"] == [a.workdir, b.workdir]
  watcher.start()
  script = (state / "1000.sh").read_text()
  for line in ("#SBATCH --array=0-1%2", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=8",
               "#SBATCH --cpus-per-task=16", "#SBATCH --mem=200G", "#SBATCH --time=600", "#SBATCH --account=lab",
               "#SBATCH --constraint=a100", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
               "#SBATCH --signal=USR2@180", "#SBATCH --requeue", f"#SBATCH --output={folder}/%A_%a_0_log.out"):
    assert line in script.splitlines(), line
  assert manifest()[a.workdir]["job_id"] == "1000_0" and manifest()[b.workdir]["job_id"] == "1000_1"
  deadline = time.time() + 300
  while time.time() < deadline and not all((state / f"1000_{i}.state").read_text() in ("COMPLETED", "FAILED")
                                           for i in (0, 1)):
    time.sleep(0.5)
  watcher.join()
  assert not failures
  calls = (state / "calls.log").read_text()
  assert "scancel 1000_0 --signal=USR2" in calls and "scontrol requeue 1000_0" in calls
  assert "scontrol requeue 1000_1" not in calls
  (first, stop), (resumed, end) = _spans(a.workdir)
  assert first == 0 and 0 < stop < STEPS and resumed == stop and end == STEPS  # the requeued job resumed the run
  assert [r.state for r in status.status([a, b], folder)] == ["done", "failed"]
  assert "the config has no key 'no_such_key'" in pathlib.Path(manifest()[b.workdir]["err"]).read_text()


def test_a_run_across_nodes_asks_one_task_per_gpu_and_initialises_jax_distributed(tmp_path, monkeypatch):
  state = _stubs(tmp_path, monkeypatch)
  monkeypatch.setenv("SLURM_STUB_HOLD", "1")  # submitted, never started: it stays PENDING
  job = _job(tmp_path / "run")
  folder = str(tmp_path / "submitit")
  options = launch.Options(executor="slurm", nodes=4, gpus_per_node=8)
  assert launch.launch([job], options, folder)["submitted"] == [job.workdir]
  script = (state / "1000.sh").read_text().splitlines()
  assert {"#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8"} <= set(script)
  assert not [line for line in script if line.startswith("#SBATCH --array")]  # one run: no array
  with open(tmp_path / "submitit" / "1000_submitted.pkl", "rb") as f:
    assert pickle.load(f).function.multihost
  (row,) = status.status([job], folder)
  assert (row.state, row.log) == ("queued", f"{folder}/1000_0_log.out")


def _fake_run(tmp_path, monkeypatch):
  """A stand-in for run.py: it writes whether SIGUSR2 is blocked, its cores and XLA flags to its last argument, then
  waits for SIGTERM and exits 3 as a stopped run does."""
  program = tmp_path / "fake_run.py"
  program.write_text("import os, signal, sys, time\n"
                     "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
                     "ignored = signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
                     "open(sys.argv[-1], 'w').write(f'{ignored} {sorted(os.sched_getaffinity(0))} "
                     "{os.environ.get(\"XLA_FLAGS\", \"\")}')\n"
                     "time.sleep(120)\n")
  monkeypatch.setattr(launch.RunJob, "program", str(program))
  return lambda name: launch.Job(name, str(tmp_path / name), (str(tmp_path / f"{name}.ready"),),
                                 _job(tmp_path / name).config)


def test_the_job_forwards_sigterm_to_its_run_and_keeps_sigusr2_from_it(tmp_path, monkeypatch):
  job = _fake_run(tmp_path, monkeypatch)("run")
  ready = tmp_path / "run.ready"
  core = sorted(os.sched_getaffinity(0))[-1]
  timer = threading.Thread(target=lambda: (_wait_for(ready), os.kill(os.getpid(), signal.SIGTERM)))
  timer.start()
  assert launch.RunJob(job, core=core)() == {"state": "stopped", "workdir": job.workdir}
  timer.join()
  ignored, cores, flags = ready.read_text().split(" ", 2)
  assert ignored == "True" and cores == f"[{core}]" and launch.SINGLE_THREAD in flags


def test_sigterm_to_a_local_sweep_stops_its_running_jobs_and_starts_no_more(tmp_path, monkeypatch):
  jobs = [_fake_run(tmp_path, monkeypatch)(name) for name in ("a", "b")]  # --workers 1: b waits for a
  timer = threading.Thread(target=lambda: (_wait_for(tmp_path / "a.ready"), os.kill(os.getpid(), signal.SIGTERM)))
  timer.start()
  handler = signal.getsignal(signal.SIGTERM)
  outcome = launch.launch(jobs, launch.Options(), str(tmp_path / "submitit"), poll_s=0.1)
  timer.join()
  # SIGTERM went from the launcher to the job's controller, the job and its run, which exited 3 (saved).
  assert sorted(outcome["stopped"]) == [jobs[0].workdir, jobs[1].workdir] and not outcome["done"] + outcome["failed"]
  assert not (tmp_path / "b.ready").exists() and signal.getsignal(signal.SIGTERM) == handler


def _wait_for(path):
  deadline = time.time() + 60
  while not path.exists() or not path.read_text():
    assert time.time() < deadline
    time.sleep(0.02)


def test_debug_trains_in_this_process_one_run_after_another_and_stops_at_a_signal(tmp_path, monkeypatch):
  from rpr import train

  calls = []

  def fake_train(config, workdir):
    calls.append(workdir)
    return {"stopped_by_signal": 1.0} if len(calls) == 2 else {}

  monkeypatch.setattr(train, "train_and_evaluate", fake_train)
  jobs = [_job(tmp_path / name, settings=()) for name in "abc"]
  outcome = launch.launch(jobs, launch.Options(executor="debug"), str(tmp_path / "submitit"))
  assert calls == [jobs[0].workdir, jobs[1].workdir]  # the third is not started after the signal
  assert outcome["done"] == [jobs[0].workdir] and outcome["stopped"] == [jobs[1].workdir]


def test_checkpoints_kept_elsewhere_are_linked_found_again_by_a_new_clone_and_resume(tmp_path, compilation_cache):
  """--checkpoints: the run's checkpoints live outside its workdir; a work tree laid anew (the link gone, the
  records kept) links them again and the run resumes from them, not from step 0."""
  workdir, keep = tmp_path / "tree" / "run", tmp_path / "keep"
  short = (("num_train_steps", 4), ("checkpoint_every_steps", 2), ("eval_every_steps", 4), ("tensorboard", False),
           ("eval_splits", ("valid",)))  # as LONG_TINY: no TensorFlow to import, no long split's decoder
  options = launch.Options(executor="debug", checkpoints=str(keep))
  outcome = launch.launch([_job(workdir, short)], options, str(tmp_path / "submitit"))
  link, home = workdir / "checkpoints", launch.checkpoint_home(str(workdir), str(keep))
  assert outcome["done"] == [str(workdir)] and link.is_symlink() and link.resolve() == home
  assert str(home).startswith(str(keep.resolve())) and {"2", "4"} <= {p.name for p in home.iterdir()}
  link.unlink()  # a new clone: records committed, checkpoints not
  longer = (("num_train_steps", 6),) + short[1:]
  outcome = launch.launch([_job(workdir, longer)], options, str(tmp_path / "submitit"))
  assert outcome["done"] == [str(workdir)] and link.is_symlink() and _spans(workdir) == [(0, 4), (4, 6)]
  other = tmp_path / "elsewhere"
  with pytest.raises(ValueError, match="links to .*, not to .*; allowed: remove the link"):
    launch.link_checkpoints(str(workdir), str(other))
  real = tmp_path / "tree" / "second"
  (real / "checkpoints" / "2").mkdir(parents=True)  # a real folder moves to its home, then is linked
  launch.link_checkpoints(str(real), str(keep))
  assert (real / "checkpoints").is_symlink() and (launch.checkpoint_home(str(real), str(keep)) / "2").is_dir()


def test_a_workdir_another_process_holds_is_passed_over_not_submitted(tmp_path, monkeypatch):
  from rpr import workdir as workdir_lib

  jobs = [_job(tmp_path / name, settings=()) for name in "ab"]
  monkeypatch.setattr(launch.RunJob, "__call__", lambda self: {"state": "done", "workdir": self.job.workdir})
  holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from rpr import workdir; "
                             f"workdir.acquire({jobs[0].workdir!r}); print('held', flush=True); time.sleep(60)"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    outcome = launch.launch(jobs, launch.Options(executor="debug"), str(tmp_path / "submitit"))
  finally:
    holder.kill()
    holder.wait()
  assert outcome["busy"] == [jobs[0].workdir] and outcome["done"] == [jobs[1].workdir]
  workdir_lib.acquire(jobs[0].workdir)  # the holder is gone: the workdir is free again
  workdir_lib.release(jobs[0].workdir)


def test_status_reads_each_run_from_its_workdir_and_its_job(tmp_path):
  folder = tmp_path / "submitit"
  folder.mkdir()
  jobs = {name: _job(tmp_path / name, settings=(("num_train_steps", 100),))
          for name in ("done", "running", "failed", "stopped", "queued", "new")}
  for name, step in (("done", 100), ("running", 40), ("failed", 20), ("stopped", 30)):
    records = [{"step": step, "train/loss": 1.0, "train/steps_per_sec": 2.0}]
    if name == "done":
      records.append({"step": 100, **{f"{s}/loss": 1.0 for s in ("valid", "long")}})
    pathlib.Path(jobs[name].workdir).mkdir()
    (pathlib.Path(jobs[name].workdir) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  for name, result in (("failed", ("error", "Traceback ...")), ("stopped", ("success", {"state": "stopped"}))):
    with open(folder / f"{name}_0_result.pkl", "wb") as f:
      pickle.dump(result, f)
  entry = lambda name, job_id: {"name": name, "executor": "local", "job_id": job_id, "log": f"{name}.out"}
  (folder / "jobs.json").write_text(json.dumps({
      jobs["running"].workdir: entry("running", str(os.getpid())),  # a live process: this one
      jobs["failed"].workdir: entry("failed", "failed"), jobs["stopped"].workdir: entry("stopped", "stopped"),
      jobs["queued"].workdir: {**entry("queued", None), "launcher": os.getpid()}}))
  rows = status.status(list(jobs.values()), str(folder))
  assert [(r.state, r.step) for r in rows] == [("done", 100), ("running", 40), ("failed", 20), ("stopped", 30),
                                               ("queued", None), ("not submitted", None)]
  assert rows[1].eta_s == pytest.approx((100 - 40) / 2.0) and rows[1].log == "running.out"
  text = status.format_status(rows).splitlines()
  assert text[1].split()[:6] == ["tiny", "running", "step", "40", "of", "100"] and "ETA   0:00:30" in text[1]
  assert text[-1] == "1 done, 1 failed, 1 not submitted, 1 queued, 1 running, 1 stopped"


@pytest.mark.parametrize("flags, message", [
    (["--executor=pbs"], "--executor='pbs'; allowed: local, slurm, debug"),
    (["--nodes=2"], "--nodes is a SLURM setting; allowed with --executor=slurm only"),
    (["--executor=slurm", "--nodes=0"], "--nodes=0; allowed: an integer >= 1"),
    (["--time=1", "--signal_delay_s=90"], "--signal_delay_s=90; allowed: under --time (1 min)"),
    (["--executor=slurm"], "--executor=slurm: sbatch and srun are not on PATH; allowed: a machine that submits SLURM "
     "jobs"),
    (["--workers=two"], "flag --workers=two: invalid literal for int() with base 10: 'two'"),
])
def test_a_bad_flag_is_one_line_and_exit_status_2_before_any_work(tmp_path, flags, message):
  # One `python -m experiments` process for each way a bad flag ends: a value launch.Options.check refuses
  # (--executor=pbs) and one absl's parser refuses (--workers=two). The other values are checked in this process,
  # on the same flags (experiments/settings.py, with flags of its own) and the same check.
  if flags not in (["--executor=pbs"], ["--workers=two"]):
    fv = absl_flags.FlagValues()
    settings.define(launch.Options, fv)
    fv(["experiments sweep", *flags])
    with pytest.raises(ValueError) as e:
      settings.parse(launch.Options, fv).check()
    assert str(e.value) == message
    return
  proc = subprocess.run([sys.executable, "-m", "experiments", "sweep", "length_tiny", "--root", str(tmp_path), *flags],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert (proc.returncode, proc.stderr) == (2, f"python -m experiments: error: experiments sweep: {message}\n")
  assert not list(tmp_path.iterdir())  # nothing made


def test_the_sweeps_jobs_are_the_printed_commands_and_their_logs_go_to_the_sweeps_folder():
  sweep = sweeps.get("wmt_table2")
  jobs = sweep_lib.launch_jobs(sweep, list(sweep.runs), "root")
  assert len(jobs) == 7 and jobs[0].name == "k=0/seed0"
  for run, job in zip(sweep.runs, jobs):
    assert "python run.py " + " ".join(job.argv) == sweep_lib.command(run, "root", sweep.name)
  assert sweep_lib.submitit_folder(sweep, "root") == "root/wmt_table2/submitit"


def test_status_of_a_sweep_lists_every_run_and_gives_the_tables_once_all_are_done(tmp_path):
  sweep = sweeps.get("length_tiny")
  status = lambda: subprocess.run([sys.executable, "-m", "experiments", "sweep", "length_tiny", "--status",
                                   "--root", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
  for i, run in enumerate(sweep.runs):
    config = sweep_lib.load_config(run, str(tmp_path))
    workdir = pathlib.Path(sweep.workdir(run, str(tmp_path)))
    workdir.mkdir(parents=True)
    splits = ("valid", "long") if i else ()  # the first run has not evaluated its last step
    (workdir / "metrics.jsonl").write_text(json.dumps(
        {"step": config.num_train_steps, **{f"{s}/loss": 1.0 for s in splits}}) + "\n")
  lines = status().stdout.splitlines()
  assert [line.split()[:2] for line in lines[:4]] == [["shaw/seed0", "stopped"]] + [
      [f"{r.name}/seed{r.seed}", "done"] for r in sweep.runs[1:]]
  assert lines[4:] == ["3 done, 1 stopped"]
  steps = sweep_lib.load_config(sweep.runs[0], str(tmp_path)).num_train_steps
  (pathlib.Path(sweep.workdir(sweep.runs[0], str(tmp_path))) / "metrics.jsonl").write_text(
      json.dumps({"step": steps, "valid/loss": 1.0, "long/loss": 1.0}) + "\n")
  assert status().stdout.splitlines()[-2:] == ["4 done", "tables: " + sweep_lib.tables_command(str(tmp_path))]
