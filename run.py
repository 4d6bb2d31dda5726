"""Trains and evaluates one experiment: ``python run.py --config=configs/<name>.py[:variant] --workdir=<dir>``.

Without ``--config`` it runs ``configs/arithmetic.py:quick`` in ``workdirs/default``
(CPU-sized, a few minutes): seed 002's arithmetic trained with Shaw's relative
attention, with sinusoids and with no position information
(``<workdir>/<scheme>``, by the sweeps' launcher), then the table of the three
beside the bag-of-characters bound (``<workdir>/report``, by
experiments/tables.py). With ``--config`` it is one run.

A user error (a config key or value, a variant word, a flag, the config
file, the workdir, a checkpoint, a failed save or write, a damaged
metrics.jsonl, a data file, a diverged run) ends the run with one line on
stderr naming the bad thing and what is allowed, and exit status 2;
``--debug`` (or ``RPR_DEBUG=1``) shows the traceback instead.
``--print_config`` prints the resolved config (every key, documented in
configs/base.py) and exits. One run holds a workdir at a time
(rpr/workdir.py); every clean exit releases it. A killed run resumes from
its last verified checkpoint when the same command runs again (an older one
if the last does not restore; see rpr/checkpoint.py; ``--restore_unverified``
for one without checksums); a changed config is refused unless its keys are in
rpr.record.RESUME_SAFE_KEYS or ``--allow_config_change``, and
checkpoints without a config.json unless ``--trust_checkpoints``. The
config file's ConfigDict is parsed here once, into the typed
``rpr.config.RunConfig`` the library takes (``rpr.config.parse``). SIGTERM
saves a checkpoint after the current step and exits with status 3; before
the first step (starting up, initialising, compiling) it ends the run at
once, with status 3 and nothing new to save (rpr/stop.py). A process of a
``--multihost`` run whose peer dies ends in one line naming it (rpr/peers.py).
Single keys are overridden with ``--config.<key>=<value>``. On a multi-host
cluster (TPU pod slice, several GPU hosts) pass ``--multihost`` on every host
so that ``jax.distributed.initialize()`` runs before JAX is used.
"""

import signal
import sys

if __name__ == "__main__":  # glibc's allocator setting first: it restarts the process (rpr/malloc.py)
  from rpr import malloc

  malloc.apply()

# SIGTERM or Ctrl-C from the first line on: recorded here until rpr.stop takes over, so a run stopped while it
# imports or compiles exits with status 3 and a workdir that resumes, never with the default 143.
_EARLY_SIGNALS: list[int] = []
for _signal in (signal.SIGTERM, signal.SIGINT):
  signal.signal(_signal, lambda signum, frame: _EARLY_SIGNALS.append(signum))

import os  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from rpr.peers import HEARTBEAT_SECONDS  # noqa: E402
from rpr.stop import STOPPED  # noqa: E402  (exit status 3: stopped by a signal, resumable)

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(_HERE, "configs", "arithmetic.py") + ":quick"  # the main job's
_CONFIG = config_flags.DEFINE_config_file(
    "config", DEFAULT_CONFIG,
    "Experiment config file (Python, get_config), optionally with :variant.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", os.path.join(_HERE, "workdirs", "default"),
                               "Directory of the run: config, metrics, TensorBoard events, checkpoints.")
QUICK_SCHEMES = ("shaw", "sinusoidal", "none")  # relative, absolute, and no position information
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (one process per host).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "--multihost: host:port of process 0; None: "
                                   "detected from the cluster (TPU VM, SLURM, ...).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "--multihost: the job's process count; None: detected.",
                                      lower_bound=1)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "--multihost: this process's index; None: detected.",
                                   lower_bound=0)
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_seconds", HEARTBEAT_SECONDS, "--multihost: a process silent this long counts as dead, and every "
    "other ends within about this plus a few seconds, naming it.", lower_bound=1)
_MULTIHOST_ONLY = ("coordinator_address", "num_processes", "process_id", "heartbeat_seconds")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved config and exit.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the traceback of a user error instead of one line.")
_RESTORE_UNVERIFIED = flags.DEFINE_bool(
    "restore_unverified", False, "Restore a checkpoint whose SHA256SUMS is missing or incomplete (never one that "
    "differs from its checksums).")
_TRUST_CHECKPOINTS = flags.DEFINE_bool(
    "trust_checkpoints", False, "Go on in a workdir that has checkpoints but no config.json, taking this config as "
    "the one that trained them.")
_SKIP_MEMORY_CHECK = flags.DEFINE_bool(
    "skip_memory_check", False, "Start a run whose estimated memory (rpr/memory.py: parameters, gradients, "
    "Adam's moments and one step's activations, a lower bound) exceeds this machine's.")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_list(
    "allow_config_change", [], "Config keys a resumed run may change besides rpr.record.RESUME_SAFE_KEYS, "
    "e.g. learning_rate,model.dropout_rate.")


def _debugging(argv=()) -> bool:
  return "--debug" in argv or os.environ.get("RPR_DEBUG") == "1" or (flags.FLAGS.is_parsed() and _DEBUG.value)


def _fail(message: str) -> None:
  """One line on stderr and exit status 2: a user error, not a bug."""
  from rpr import peers

  print(f"run.py: error: {message}", file=sys.stderr, flush=True)
  if peers.running():
    peers.exit_now(2)  # several processes: not through JAX's shutdown barrier (rpr/peers.py)
  sys.exit(2)


def _parse_flags(argv):
  """absl's flag parsing; a bad flag or config override is one line, not a traceback."""
  try:
    parsed = flags.FLAGS(argv)
    alone = [f"--{name}={flags.FLAGS[name].value}" for name in _MULTIHOST_ONLY if flags.FLAGS[name].present]
    if alone and not _MULTIHOST.value:  # options that would do nothing
      raise flags.ValidationError(f"{', '.join(alone)}: {'acts' if len(alone) == 1 else 'act'} only with --multihost")
    return parsed
  except (flags.Error, KeyError, ValueError, TypeError, AttributeError) as e:
    if _debugging(argv):
      raise
    message = str(e)
    if isinstance(e, (KeyError, AttributeError)):  # unwrap AttributeError(KeyError("'key'\nDid you mean ...")))
      arg = e
      while isinstance(arg, BaseException) and arg.args:
        arg = arg.args[0]
      message = str(arg)
    if isinstance(e, (KeyError, AttributeError)):  # an override of a key the config does not have
      message = " ".join(message.split())  # ml_collections adds "\nDid you mean ...?"
      key = message.split()[0].strip("\"'")
      overrides = [a.partition("=")[0] for a in argv if a.startswith("--config.")]
      named = [o for o in overrides if key in o[len("--config."):].split(".")]
      if named:
        hint = message[len(message.split()[0]):].strip()
        _fail(f"{named[0]}: the config has no key {key!r}{' (' + hint + ')' if hint else ''}; allowed: the keys "
              "--print_config shows (documented in configs/base.py)")
    if "Traceback (most recent call last)" in message:  # config_flags wraps what the config file raised
      last = message.strip().splitlines()[-1]
      if not last.startswith("ValueError: "):
        raise  # a bug in the config file, not a bad value: keep the traceback
      message = last[len("ValueError: "):]
    _fail(message)


def _load_config():
  """The config the flags name; one line for a file that does not exist or a get_config that returns no config."""
  import ml_collections

  name = flags.FLAGS["config"].config_filename
  path = name.split(":", 1)[0]
  if not os.path.isfile(path):
    _fail(f"--config {name!r}: {path!r} is not a file; allowed: a Python config file with get_config(), such as "
          "configs/tiny.py, optionally followed by :variant")
  config = _CONFIG.value
  if type(config).__name__ == "_ErrorConfig":  # the file failed to load: a bug in it, shown with its traceback
    config.keys()
  if not isinstance(config, ml_collections.ConfigDict):
    _fail(f"--config {name!r}: get_config returned a {type(config).__name__}; allowed: an "
          "ml_collections.ConfigDict")
  return config


def _user_errors() -> tuple:
  """The exceptions that are the user's to fix, reported in one line (bugs keep their traceback)."""
  from rpr import checkpoint
  from rpr import config as config_lib
  from rpr import data
  from rpr import records
  from rpr import workdir

  errors = (config_lib.ConfigError, checkpoint.CheckpointError, workdir.Busy, workdir.Unusable, data.DataError,
            records.Damaged, records.Unwritable)
  if "rpr.train" in sys.modules:  # imports JAX: only once a run has started
    errors += (sys.modules["rpr.train"].NonFiniteError,)
  return errors


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}; allowed: flags only (--config, --workdir, ...; see --help)")
  if _PRINT_CONFIG.value:
    print(_load_config())
    return
  from rpr import peers
  from rpr import stop

  if _MULTIHOST.value and not os.environ.get(peers.SUPERVISED):  # the work in a child: a dead peer is one line
    sys.exit(peers.supervise([sys.executable, *sys.orig_argv[1:]], _PROCESS_ID.value, _NUM_PROCESSES.value))

  try:
    with stop.handle_signals() as request:  # SIGTERM stops the run with a checkpoint and exit status 3
      request.requested = bool(_EARLY_SIGNALS)
      # One run (not the quick comparison, whose runs stop themselves; not several processes, which stop
      # together at a step: rpr/loop.py).
      if flags.FLAGS["config"].present and not _MULTIHOST.value:
        from rpr import workdir

        stop.end_at_once(request, workdir.release_all)  # until the first step: XLA may block for minutes
      _run()
  except Exception as e:  # user errors are one line; bugs keep their traceback
    peers.settle(_HEARTBEAT.value)  # several processes: a dead peer, if the error echoes one, is named instead
    if isinstance(e, _user_errors()) and not _debugging():
      _fail(str(e))
    raise
  finally:
    # Nothing is left to save: a signal from here on must not turn a finished run's exit status into 143.
    # (Python's shutdown puts back the default handler of a signal with a Python handler, not of an ignored one.)
    for s in (signal.SIGTERM, signal.SIGINT):
      signal.signal(s, signal.SIG_IGN)


def _run():
  from rpr import checkpoint
  from rpr import config as config_lib  # imports JAX without starting its runtime
  from rpr import workdir

  checkpoint.quiet_orbax_logs()
  single = flags.FLAGS["config"].present
  # Every check but the device count's before JAX starts (or logs anything), so a user error is the only line;
  # the config's own before the workdir is made, then the workdir's lock (one run per workdir), then its history.
  config = config_lib.parse(_load_config())
  if not _SKIP_MEMORY_CHECK.value:  # before the workdir is made and JAX allocates anything
    from rpr import memory

    memory.check(config)
  if single and not _MULTIHOST.value:
    workdir.acquire(_WORKDIR.value)
  try:  # a clean exit (finished, stopped by a signal, a user error) leaves the lock empty: nothing stale
    _start(config, single)
  finally:
    workdir.release(_WORKDIR.value)


def _start(config, single: bool) -> None:
  """The run of the parsed ``config``, once its workdir is held: the workdir's history checked, JAX started, then
  one training run (or the quick comparison)."""
  from rpr import config as config_lib
  from rpr import record

  if single:
    record.check_resume(config, _WORKDIR.value, _ALLOW_CONFIG_CHANGE.value, quiet=True,
                        trust_checkpoints=_TRUST_CHECKPOINTS.value)
  import jax  # after flag parsing, so --multihost can initialise the runtime first

  if _MULTIHOST.value:
    from rpr import peers

    peers.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _HEARTBEAT.value)
  from rpr import train

  config_lib.check_devices(config, jax.device_count())  # the batch sizes against the devices, before any log line
  logging.info("JAX process %d of %d, %d local / %d global devices (%s).", jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count(), jax.devices()[0].platform)
  if not single:  # the default: the quick comparison
    _compare(_load_config(), _WORKDIR.value)  # the config file's ConfigDict, once per scheme
    return
  results = train.train_and_evaluate(config, _WORKDIR.value, allow_config_change=_ALLOW_CONFIG_CHANGE.value,
                                     restore_unverified=_RESTORE_UNVERIFIED.value,
                                     trust_checkpoints=_TRUST_CHECKPOINTS.value)
  logging.info("Final metrics: %s", ", ".join(f"{k} {v:.4f}" for k, v in sorted(results.items())))
  if results.get("stopped_by_signal"):
    sys.exit(STOPPED)  # saved and resumable, but not finished


def _compare(config, workdir: str) -> None:
  """``config`` once per scheme of QUICK_SCHEMES (``<workdir>/<scheme>``), then their table beside the bound.

  The runs are ``run.py`` processes under the sweeps' launcher (submitit's local executor), two at a time on two
  or more cores, each on its own core with one XLA thread: this small model trains about as fast on one thread as
  on two, so two at a time take half the time. The flags given here reach every run."""
  from experiments import engine
  from experiments import launch
  from experiments import protocol
  from experiments import tables

  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  given = [a for a in sys.argv[1:] if not a.startswith(("--workdir", "--noworkdir"))]
  jobs = []
  for scheme in QUICK_SCHEMES:
    c = config.copy_and_resolve_references()
    c.model.position = scheme
    run_dir = os.path.join(workdir, scheme)
    argv = (f"--config={DEFAULT_CONFIG}",
            f"--workdir={run_dir}", *given, f"--config.model.position={scheme}")
    jobs.append(launch.Job(f"pe={scheme}", run_dir, argv, c))
  options = launch.Options(executor="local", workers=min(2, cores), pin=cores >= 2)
  engine.prepare_data([config])  # the data set once, before two runs race to make it
  outcome = launch.launch(jobs, options, os.path.join(workdir, "submitit"))
  if outcome["stopped"]:
    sys.exit(STOPPED)
  if outcome["failed"]:
    sys.exit(f"run.py: {len(outcome['failed'])} run(s) failed: {outcome['failed']} (their logs: "
             f"{os.path.join(workdir, 'submitit')})")
  metric, bound = f"{config.eval_splits[0]}/exact_match", ()
  if config.dataset == "arithmetic":  # what a model that cannot see the order can reach (rpr/data/bounds.py)
    from rpr.data import bounds

    bound = (("bound without order: bag of characters (whole set)",
              bounds.arithmetic_bounds(config.arithmetic_config, ("bag",))["bag_all"]),)
  table = protocol.Table("plot", f"Position information ({metric})", metric,
                         tuple(protocol.Row(s, folder=s) for s in QUICK_SCHEMES), "none", baselines=bound, runs="",
                         digits=4)
  print(tables.write_one(table, workdir, os.path.join(workdir, "report"), "python run.py " + " ".join(sys.argv[1:])),
        flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
