"""Runs a named sweep (``configs/<task>.py``'s ``get_sweeps()``, read by experiments/sweeps.py), follows it
(``--status``), or prints each run's command (``--print``); the commands: experiments/README.md, "Sweeps".

Run from the repository root. Every run trains in its own workdir, ``<root>/<folder>/<run name>/seed<seed>``
(``--root``, default ``workdirs/sweeps``); a cell that is another sweep's run with the same config (``Run.same_as``)
uses that run's workdir, so it is trained once. A finished run is skipped and an interrupted one resumes from its
latest checkpoint, so re-running a sweep finishes whatever is left. A failing run is logged and the sweep goes on
(exit status 1). Compiled programs are kept in a persistent JAX cache (``--compilation_cache``), so the seeds of
one variant compile once. ``--print`` also prints the steps left, their hours, and the tables' command.

Where the runs train, and how a signal stops them (exit status 3, ``rpr.stop.STOPPED``), is the launcher's
(experiments/launch.py: each run a submitit job; its flags are :class:`launch.Options`); each job's logs are in
``<root>/<folder>/submitit``. With ``--workers N`` or ``slurm``, the files the runs share are made first.
"""

from __future__ import annotations

import os
import shlex
import statistics
from typing import Sequence

from absl import app
from absl import flags
from absl import logging

from experiments import engine
from experiments import launch
from experiments import settings
from experiments import runs as runs_lib
from experiments import status as status_lib
from experiments import sweeps
from rpr import config as rpr_config
from rpr import workdir as workdir_lib
from rpr.stop import STOPPED

FLAGS = flags.FLAGS


def load_config(run: sweeps.Run, root: str):
  """The run's config: ``get_config(variant)`` of its file, locked, with the run's keys set (as run.py would)."""
  return engine.load_config(run.config, run.variant, run.settings(root))


def command(run: sweeps.Run, root: str, sweep: str) -> str:
  """``python run.py --config=<file>[:<variant>] --workdir=<dir> --config.<key>=<value> ...``."""
  config = run.config + (f":{run.variant}" if run.variant else "")
  workdir = sweeps.get(sweep).workdir(run, root)
  words = ["python", "run.py", f"--config={shlex.quote(config)}", f"--workdir={shlex.quote(workdir)}"]
  words += [f"--config.{k}={shlex.quote(str(v))}" for k, v in run.settings(root).items()]
  return " ".join(words)


def print_sweep(sweep: sweeps.Sweep, runs: Sequence[sweeps.Run], root: str) -> None:
  """Each run's command, "# finished: " before those that are; a comment with the step reached before each run
  in progress (and, under a plateau rule, its metric's latest value and gain); then how many are finished and the
  tables' command, with the steps left and the time they take at the runs' logged step rates."""
  done = in_progress = left = 0
  rates, plateau_rule = {False: [], True: []}, False  # each run's step rate (_run_rate): in progress, finished
  for run in runs:
    workdir, config = sweep.workdir(run, root), load_config(run, root)
    records = runs_lib.records(workdir)
    is_finished = status_lib.finished(workdir, config)
    rates[is_finished] += [rate for rate in [_run_rate(records)] if rate]
    if is_finished:
      done += 1
      print("# finished: " + command(run, root, sweep.name))
      continue
    saved = workdir_lib.checkpoint_steps(workdir)
    left += config.num_train_steps - (saved[0] if saved else 0)
    plateau_rule = plateau_rule or bool(config.get("plateau_metric"))
    if records:
      step = max(int(r["step"]) for r in records)
      in_progress += 1
      how = (f"the command resumes it from its newest checkpoint, step {saved[0]:,}" if saved else
             "no checkpoint: the command starts it at step 0 and sets these records aside")
      rule = rpr_config.Budget(**{k: config[k] for k in rpr_config.PLATEAU_KEYS}).plateau_rule()
      print(f"# in progress: step {step:,} of {config.num_train_steps:,} ({how})"
            + (f"; {rule.describe(records)}" if rule else ""))
    print(command(run, root, sweep.name))
  print(f"# {done} of {len(runs)} runs finished, {in_progress} in progress")
  print("# " + _time_left(left, rates, plateau_rule))
  print("# tables: " + tables_command(root))


def _run_rate(records: Sequence[dict]) -> float | None:
  """A run's steps per second over its logged training intervals, evaluations included: the harmonic mean of its
  logged rates, each over the same number of steps. Their median would leave the evaluations out, since most
  intervals hold none (translation's curves: 2.1 steps/s against 1.8)."""
  logged = [r["train/steps_per_sec"] for r in records if r.get("train/steps_per_sec")]
  return statistics.harmonic_mean(logged) if logged else None


def _time_left(steps: int, rates: dict[bool, list[float]], plateau_rule: bool) -> str:
  """The steps the unfinished runs have left, and their hours at the median of the step rates (``_run_rate``) of
  the runs in progress (they run where and how the rest will), else of the finished ones."""
  if not steps:
    return "0 steps left"
  text = f"{steps:,} steps left" + (" at most (a plateau rule may stop a run sooner)" if plateau_rule else "")
  whose = "runs in progress" if rates[False] else "finished runs"
  if not rates[False] and not rates[True]:
    return text + "; no step rate is logged yet"
  rate = statistics.median(rates[False] or rates[True])
  return (f"{text}: {steps / rate / 3600:.1f} hours of one process at {rate:.2f} steps/s, the median step rate of "
          f"its {whose} (evaluations included; divide by the processes run side by side)")


def select(sweep: sweeps.Sweep, only=(), seeds=()) -> list[sweeps.Run]:
  runs = [r for r in sweep.runs if (not only or r.name in only) and (not seeds or r.seed in seeds)]
  if not runs:
    raise ValueError(f"no run of sweep {sweep.name!r} matches --only {list(only)} --seeds {list(seeds)}; "
                     f"runs: {sorted({r.name for r in sweep.runs})}, seeds: {sorted({r.seed for r in sweep.runs})}")
  return runs


def tables_command(root: str) -> str:
  """The command of the one report writer over ``root``'s runs: the protocol's tables. Over another root than the
  committed results, its tables go beside the runs (``<root>/paper``) and the README is left alone."""
  if os.path.normpath(root) == "experiments/results":
    return "python -m experiments tables"
  return (f"python -m experiments tables --root {shlex.quote(root)} --out {shlex.quote(os.path.join(root, 'paper'))} "
          "--readme ''")


def launch_jobs(sweep: sweeps.Sweep, runs: Sequence[sweeps.Run], root: str) -> list[launch.Job]:
  """The launcher's job of each run: ``run.py``'s flags (:func:`command`) and the run's config."""
  return [launch.Job(f"{run.name}/seed{run.seed}", sweep.workdir(run, root),
                     tuple(shlex.split(command(run, root, sweep.name))[2:]), load_config(run, root)) for run in runs]


def submitit_folder(sweep: sweeps.Sweep, root: str) -> str:
  """Where the sweep's jobs keep their logs, pickles and ``jobs.json``: ``<root>/<the sweep's folder>/submitit``."""
  return os.path.join(root, sweep.folder, "submitit")


def define_flags() -> None:
  """The ``sweep`` verb's flags."""
  flags.DEFINE_string("root", "workdirs/sweeps", "Directory holding the sweeps' workdirs.")
  flags.DEFINE_bool("print", False, "Print each run's command instead of running it.")
  flags.DEFINE_bool("list", False, "List the registered sweeps.")
  flags.DEFINE_multi_string("only", [], "Run only the runs of these names (e.g. k=4).")
  flags.DEFINE_list("seeds", [], "Run only these seeds (e.g. 0,1).")
  flags.DEFINE_bool("status", False, "List every run: queued, running, done or failed, its step, ETA and log.")
  settings.define(launch.Options)  # --executor, --workers, the SLURM resources (experiments/launch.py)
  flags.DEFINE_string("compilation_cache", "{root}/jax_cache", "JAX persistent compilation cache ('' for none): "
                      "runs that differ only in seed compile the same programs.")


def main(argv) -> int:
  if FLAGS.list:
    for name, sweep in sorted(sweeps.SWEEPS.items()):
      print(f"{name:20s} {len(sweep.runs):3d} runs  {sweep.description}")
    return 0
  if len(argv) != 2:
    raise app.UsageError(f"name one sweep; allowed: {sorted(sweeps.SWEEPS)}")
  options = settings.parse(launch.Options)
  try:
    options.check()
    sweep = sweeps.get(argv[1])
    runs = select(sweep, FLAGS.only, [int(s) for s in FLAGS.seeds])
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  root = FLAGS.root
  if FLAGS.print:
    print_sweep(sweep, runs, root)
    return 0
  jobs, folder = launch_jobs(sweep, runs, root), submitit_folder(sweep, root)
  if FLAGS.status:
    rows = status_lib.status(jobs, folder)
    print(status_lib.format_status(rows))
    if all(r.state == "done" for r in rows):
      print("tables: " + tables_command(root))
    return 0
  from rpr import checkpoint

  checkpoint.quiet_orbax_logs()
  logging.set_verbosity(logging.INFO)
  cache = FLAGS.compilation_cache.format(root=root)
  env = {"JAX_COMPILATION_CACHE_DIR": os.path.abspath(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5"
         } if cache else {}
  if cache and options.executor == "debug":
    import jax

    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  if options.executor == "slurm" or options.workers > 1:
    engine.prepare_data(job.config for job in jobs)  # once, before the jobs race to make the same files
  outcome = launch.launch(jobs, options, folder, env=env)
  logging.info("Sweep %s: %d trained, %d skipped (finished before), %d busy (trained by another process), %d failed, "
               "%d submitted%s.", sweep.name, len(outcome["done"]), len(outcome["skipped"]), len(outcome["busy"]),
               len(outcome["failed"]), len(outcome["submitted"]),
               "".join(f"\n  failed: {w}" for w in outcome["failed"]))
  if outcome["stopped"]:
    return STOPPED
  if outcome["submitted"]:
    logging.info("Follow it with: python -m experiments sweep %s --status%s", sweep.name,
                 "" if root == "workdirs/sweeps" else f" --root {shlex.quote(root)}")
  elif not outcome["failed"]:
    logging.info("Tables: %s", tables_command(root))
  return 1 if outcome["failed"] else 0

