"""A sweep's runs as submitit jobs: local processes (the default), a SLURM job array, or in this process (debug).

  jobs = [launch.Job("k=4/seed0", workdir, ("--config=configs/tiny.py", f"--workdir={workdir}"), config), ...]
  outcome = launch.launch(jobs, launch.Options(executor="local", workers=2), folder="<sweep dir>/submitit")
  print(status.format_status(status.status(jobs, folder)))  # experiments/status.py

A job is one training run: ``run.py`` with its flags (``Job.argv``), started as a child of the job's callable
(:class:`RunJob`, a ``submitit.helpers.Checkpointable``), or trained in this process (``debug``). Finished runs
(:func:`experiments.status.finished`) are not submitted, nor runs whose workdir another process holds. Each
job's stdout, stderr and result (its exit state) land in ``folder``;
``folder/jobs.json`` maps each workdir to its job, for :func:`status`. ``local`` runs ``workers`` jobs at once;
``slurm`` submits one job array (a run across nodes: one task per GPU, ``run.py --multihost``) and returns.

At a time limit SLURM sends SIGUSR2 (``--signal=USR2@<signal_delay_s>``, blocked in the run); submitit's handler
calls :meth:`RunJob.checkpoint`: the run gets SIGTERM, saves and exits with status 3 (``rpr.stop.STOPPED``), and
the job is requeued; its ``run.py`` resumes bit for bit. SIGTERM to the job (preemption, a stopped local sweep)
saves the run without a requeue. README.md, "Running a sweep on a cluster", has the commands.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from absl import logging
import submitit

from experiments import engine
from experiments import status as status_lib
from experiments.settings import knob
from rpr import progress
from rpr import records as records_lib
from rpr.stop import STOPPED  # run.py's exit status of a run a signal stopped (saved, resumable)

REPO = pathlib.Path(__file__).resolve().parents[1]
EXECUTORS = ("local", "slurm", "debug")
SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false"


@dataclasses.dataclass(frozen=True)
class Job:
  """One training run: ``run.py <argv>`` (``--config=``, ``--workdir=``, ``--config.<key>=``), its resolved config
  (what :func:`finished`, :func:`status` and ``debug`` read) and a name for logs and SLURM."""
  name: str
  workdir: str
  argv: tuple[str, ...]
  config: Any


@dataclasses.dataclass(frozen=True)
class Options:
  """Where and how the jobs run; each field is a flag of the ``sweep`` verb (``settings.define``)."""
  executor: str = knob("local", "Where the runs train: local (processes on this machine, --workers at once), "
                       "slurm (a SLURM job array) or debug (one after another in this process).")
  workers: int = knob(1, "local: train this many runs at once.")
  pin: bool = knob(True, "local, --workers > 1: pin each run to one core, with one XLA:CPU thread.")
  partition: str = knob("", "slurm: the partition ('' for the cluster's default).")
  nodes: int = knob(1, "slurm: nodes per run; above 1 a run starts one process per GPU (per node without GPUs) "
                    "and initialises jax.distributed from SLURM's variables.")
  gpus_per_node: int = knob(0, "slurm: GPUs per node.")
  cpus_per_task: int = knob(0, "slurm: CPUs per task (0: the cluster's default).")
  mem: str = knob("", "slurm: memory per node, as sbatch --mem takes it, e.g. 64G ('' for the default).")
  time: int = knob(24 * 60, "Time limit of a job in minutes (slurm: --time; local: the job is signalled, saves, "
                   "and starts again after it). The run is requeued at it and resumes.")
  account: str = knob("", "slurm: the account to charge ('' for the default).")
  constraint: str = knob("", "slurm: node features, as sbatch --constraint takes them, e.g. a100.")
  array_parallelism: int = knob(64, "slurm: at most this many runs of the array at once.")
  signal_delay_s: int = knob(120, "Seconds before the time limit at which the job gets SIGUSR2 to save and requeue.")
  max_requeues: int = knob(3, "Time limits a run may meet (each one requeues it) before its job fails.")
  checkpoints: str = knob("", "Keep each run's checkpoints/ under this directory, linked from its workdir: "
                          "scratch storage, or a folder outside a work tree that is cloned anew ('' keeps them in "
                          "the workdir).")

  def check(self) -> None:
    """Raises ValueError naming the first bad value and what is allowed."""
    if self.executor not in EXECUTORS:
      raise ValueError(f"--executor={self.executor!r}; allowed: {', '.join(EXECUTORS)}")
    for name, low in (("workers", 1), ("nodes", 1), ("gpus_per_node", 0), ("cpus_per_task", 0), ("time", 1),
                      ("array_parallelism", 1), ("signal_delay_s", 1), ("max_requeues", 0)):
      if getattr(self, name) < low:
        raise ValueError(f"--{name}={getattr(self, name)}; allowed: an integer >= {low}")
    if self.executor == "slurm" and not (shutil.which("sbatch") and shutil.which("srun")):
      raise ValueError("--executor=slurm: sbatch and srun are not on PATH; allowed: a machine that submits SLURM jobs")
    if self.signal_delay_s >= 60 * self.time:
      raise ValueError(f"--signal_delay_s={self.signal_delay_s}; allowed: under --time ({self.time} min)")
    changed = [f.name for f in dataclasses.fields(self)  # a SLURM setting's help says so first
               if f.metadata["help"].startswith("slurm:") and getattr(self, f.name) != f.default]
    if changed and self.executor != "slurm":
      raise ValueError(f"--{changed[0]} is a SLURM setting; allowed with --executor=slurm only")

  @property
  def tasks_per_node(self) -> int:
    """One process per GPU for a run across nodes (jax.distributed gives each the GPU of its local rank)."""
    return self.gpus_per_node if self.nodes > 1 and self.gpus_per_node else 1


class RunJob(submitit.helpers.Checkpointable):
  """The callable of one job: trains ``job`` (``run.py`` as a child process, or here with ``in_process``) and
  returns ``{"state": "done" | "stopped", "workdir": ...}``; a failed run raises (in process: ``"failed"``)."""
  program = str(REPO / "run.py")  # what the job runs, with the job's argv

  def __init__(self, job: Job, in_process: bool = False, core: Optional[int] = None, env=None, multihost=False):
    self.job, self.in_process, self.core, self.env, self.multihost = job, in_process, core, dict(env or {}), multihost
    self.program = self.program  # the class's, kept with the job when it is pickled
    self._proc: Optional[subprocess.Popen] = None

  def __getstate__(self):
    return {**self.__dict__, "_proc": None}  # the child process stays with this process

  def __call__(self) -> dict:
    if status_lib.finished(self.job.workdir, self.job.config):  # e.g. requeued after its last step
      return {"state": "done", "workdir": self.job.workdir}
    state = self._train_here() if self.in_process else self._train_child()
    return {"state": state, "workdir": self.job.workdir}

  def _train_child(self) -> str:
    argv = [sys.executable, self.program, *self.job.argv, *(["--multihost"] if self.multihost else [])]
    env = {**os.environ, **self.env}
    if self.core is not None:
      env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {SINGLE_THREAD}".strip()
    logging.info("%s: %s", self.job.name, " ".join(argv))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # the run inherits it blocked: the time-limit
    try:  # signal is the job's, which sends the run SIGTERM (no preexec_fn: this process may have threads)
      self._proc = subprocess.Popen(argv, cwd=str(REPO), env=env)
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if self.core is not None and hasattr(os, "sched_setaffinity"):  # before run.py starts XLA's threads
      os.sched_setaffinity(self._proc.pid, {self.core % os.cpu_count()})
    forward = lambda signum, frame: self._stop_child(wait=False)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      _wait_exited(self._proc)
      code = self._proc.wait()
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
      self._stop_child(wait=True)  # an exception here (a requeue's exit) must not leave the run behind
    if code == STOPPED:
      return "stopped"
    if code != 0:
      raise RuntimeError(f"{self.job.name}: run.py exited with status {code} (its log is this job's)")
    return "done"

  def _stop_child(self, wait: bool) -> None:
    """SIGTERM to the run (it saves after its current step and exits with status 3); ``wait`` for it to exit."""
    if self._proc is not None and self._proc.returncode is None:
      self._proc.send_signal(signal.SIGTERM)  # nothing once it has exited: Popen.send_signal polls first
      if wait:
        _wait_exited(self._proc)

  def _train_here(self) -> str:
    from rpr import stop
    from rpr import workdir as workdir_lib

    with stop.handle_signals():
      try:
        result = engine.train(engine.validate(self.job.config, self.job.workdir), self.job.workdir) or {}
      except workdir_lib.Busy as e:  # another process trains it: not a failure of the run
        logging.warning("%s; going on with the next run.", e)
        return "busy"
      except Exception:  # pylint: disable=broad-except
        logging.exception("%s failed.", self.job.name)  # not raised: the debug executor would start pdb
        return "failed"
    return "stopped" if result.get("stopped_by_signal") else "done"

  def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
    """submitit's time-limit or preemption handler: the run saves and exits, then the same job is requeued."""
    logging.warning("%s: time limit or preemption: saving the run, then requeueing it.", self.job.name)
    self._stop_child(wait=True)
    return super().checkpoint(*args, **kwargs)


def _wait_exited(proc: subprocess.Popen) -> None:
  """Blocks until ``proc`` has exited, unreaped (``Popen.wait`` reaps it), so a signal handler may wait too."""
  try:
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
  except ChildProcessError:  # reaped already
    pass


def make_executor(options: Options, folder: str) -> submitit.Executor:
  """The submitit executor ``options`` name, with its parameters set."""
  if options.executor == "debug":
    return submitit.DebugExecutor(folder)
  if options.executor == "local":
    executor = submitit.LocalExecutor(folder, max_num_timeout=options.max_requeues)
    executor.update_parameters(timeout_min=options.time, signal_delay_s=options.signal_delay_s)
    return executor
  executor = submitit.SlurmExecutor(folder, max_num_timeout=options.max_requeues)
  executor.update_parameters(**slurm_parameters(options))
  return executor


def slurm_parameters(options: Options, name: str = "rpr") -> dict[str, Any]:
  """SlurmExecutor's parameters: the resources of one run, its time limit, the signal, and ``--requeue``."""
  params = dict(job_name=name, time=options.time, nodes=options.nodes, ntasks_per_node=options.tasks_per_node,
                signal_delay_s=options.signal_delay_s, array_parallelism=options.array_parallelism,
                additional_parameters={"requeue": True})  # preemption and `scontrol requeue` put it back in line
  optional = dict(partition=options.partition, gpus_per_node=options.gpus_per_node,
                  cpus_per_task=options.cpus_per_task, mem=options.mem, account=options.account,
                  constraint=options.constraint)
  return {**params, **{k: v for k, v in optional.items() if v}}


def launch(jobs: Sequence[Job], options: Options, folder: str, env: Optional[dict] = None,
           poll_s: float = 1.0) -> dict[str, list[str]]:
  """Submits every unfinished job of ``jobs``; their workdirs by outcome.

  Outcomes: ``skipped`` (finished before), ``done``, ``stopped`` (a signal stopped it, saved), ``failed``
  (local, debug), ``busy`` (another process holds its workdir's lock: not submitted) and ``submitted`` (slurm: the
  array is in the queue; ``experiments.status`` follows it). ``local`` and ``debug`` return when their jobs have
  ended; SIGTERM or Ctrl-C stops every running run after its current step (each saves a checkpoint) and starts no
  more. ``env``: environment variables of every run (local, slurm).
  """
  options.check()
  os.makedirs(folder, exist_ok=True)
  outcome = {"skipped": [], "done": [], "stopped": [], "failed": [], "busy": [], "submitted": []}
  todo = []
  for job in jobs:
    if status_lib.finished(job.workdir, job.config):
      outcome["skipped"].append(job.workdir)
      logging.info("%s: finished, skipped.", job.workdir)
    elif _claimable(job.workdir, options.checkpoints):
      todo.append(job)
    else:
      outcome["busy"].append(job.workdir)
  if not todo:
    return outcome
  executor = make_executor(options, folder)
  if options.executor == "slurm":
    with executor.batch():
      submitted = [executor.submit(RunJob(j, env=env, multihost=options.nodes > 1)) for j in todo]
    _record(folder, {j.workdir: _entry(j, s, "slurm") for j, s in zip(todo, submitted)})
    logging.info("Submitted %d runs as SLURM job %s (logs in %s).", len(todo), submitted[0].job_id, folder)
    outcome["submitted"] = [j.workdir for j in todo]
    return outcome
  if options.executor == "debug":
    for job in todo:
      state = executor.submit(RunJob(job, in_process=True)).result()["state"]
      outcome[state].append(job.workdir)
      if state == "stopped":
        break  # a signal stops the sweep: the runs after it are not started
    return outcome
  return _run_local(executor, todo, options, folder, env, outcome, poll_s)


def checkpoint_home(workdir: str, where: str) -> pathlib.Path:
  """Where ``--checkpoints=where`` keeps ``workdir``'s checkpoints: ``where/<workdir relative to the repository
  (else to /)>/checkpoints``, so a new clone in the same place finds them again."""
  path = pathlib.Path(workdir).resolve()
  relative = path.relative_to(REPO) if path.is_relative_to(REPO) else path.relative_to(path.anchor)
  return pathlib.Path(where).resolve() / relative / "checkpoints"


def link_checkpoints(workdir: str, where: str) -> None:
  """Makes ``<workdir>/checkpoints`` a link to :func:`checkpoint_home`, moving a checkpoints folder there first.

  Raises:
    ValueError: the link points elsewhere, or both places hold checkpoints (nothing is moved then).
  """
  link, home = pathlib.Path(workdir) / "checkpoints", checkpoint_home(workdir, where)
  if link.is_symlink():
    if link.resolve() != home:
      raise ValueError(f"{link} links to {os.readlink(link)}, not to {home}; allowed: remove the link, or give the "
                       "--checkpoints it was made with")
    return
  home.parent.mkdir(parents=True, exist_ok=True)
  if link.exists():
    if home.exists() and any(home.iterdir()):
      raise ValueError(f"{link} and {home} both hold checkpoints; allowed: keep one of them")
    if home.exists():
      home.rmdir()
    shutil.move(str(link), str(home))
    logging.info("%s: checkpoints moved to %s.", workdir, home)
  home.mkdir(exist_ok=True)
  link.parent.mkdir(parents=True, exist_ok=True)
  link.symlink_to(home, target_is_directory=True)


def _claimable(workdir: str, checkpoints: str) -> bool:
  """False, with a line, when another process holds the workdir's lock (its run trains elsewhere: not submitted
  again); else its checkpoints are linked (``--checkpoints``) under the lock, which the run takes after."""
  from rpr import workdir as workdir_lib

  try:
    with workdir_lib.lock(workdir):
      if checkpoints:
        link_checkpoints(workdir, checkpoints)
  except workdir_lib.Busy as e:
    logging.warning("%s; not submitted.", e)
    return False
  return True


def _run_local(executor, todo: list[Job], options: Options, folder: str, env, outcome, poll_s: float):
  """``workers`` jobs at once, the next when one ends; none after SIGTERM/SIGINT (forwarded) or a stopped run."""
  queue, running, stopping = list(todo), {}, []
  _record(folder, {j.workdir: {"name": j.name, "executor": "local", "job_id": None, "launcher": os.getpid()}
                   for j in todo})

  def stop(signum, frame):
    logging.warning("Received signal %d: every run saves after its current step; no run starts.", signum)
    stopping.append(signum)
    for submitted in running.values():
      if submitted.state == "RUNNING":
        submitted._process.send_signal(signal.SIGTERM)  # pylint: disable=protected-access  # the controller's

  previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
  said = time.monotonic()
  try:
    while queue or running:
      if time.monotonic() - said >= progress.EVERY_SECONDS:  # the runs' logs are files: their progress here
        said = time.monotonic()
        for submitted in running.values():
          logging.info("%s", status_lib.format_status(status_lib.status([submitted.rpr_job], folder)).splitlines()[0])
      free = [c for c in range(options.workers) if c not in running]
      while queue and free and not stopping:
        job, slot = queue.pop(0), free.pop(0)
        core = slot if options.pin and options.workers > 1 else None
        running[slot] = submitted = executor.submit(RunJob(job, core=core, env=env))
        submitted.rpr_job = job
        _record(folder, {job.workdir: _entry(job, submitted, "local")})
        logging.info("%s: job %s%s.", job.workdir, submitted.job_id, "" if core is None else f" on core {core}")
      if stopping:
        outcome["stopped"] += [j.workdir for j in queue]
        queue = []
      for slot, submitted in list(running.items()):
        if submitted.done():
          del running[slot]
          state = "failed" if submitted.exception() else submitted.result()["state"]  # an error, or killed
          outcome[state].append(submitted.rpr_job.workdir)
          stopping += ["a run was stopped"] if state == "stopped" else []  # as a signal: no more runs start
          logging.log(logging.WARNING if state == "failed" else logging.INFO, "%s: %s (log %s).",
                      submitted.rpr_job.workdir, state, submitted.paths.stdout)
      time.sleep(poll_s if running else 0)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  return outcome


def _entry(job: Job, submitted, executor: str) -> dict:
  return {"name": job.name, "executor": executor, "job_id": submitted.job_id, "log": str(submitted.paths.stdout),
          "err": str(submitted.paths.stderr)}


def _record(folder: str, entries: dict) -> None:
  """Merges ``entries`` (workdir -> job) into ``folder/jobs.json``, replaced atomically."""
  manifest = {**status_lib.manifest(folder), **entries}
  records_lib.replace_lines(os.path.join(folder, status_lib.MANIFEST), [json.dumps(manifest, indent=1, sort_keys=True)])
