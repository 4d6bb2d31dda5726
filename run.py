"""Trains and evaluates one experiment: ``python run.py --config=configs/<name>.py[:variant] --workdir=<dir>``.

Without ``--config`` it runs ``configs/arithmetic.py:quick`` in ``workdirs/default``
(CPU-sized, a few minutes): seed 002's arithmetic trained once with a position
encoding and once without (``<workdir>/<scheme>``, by the sweeps' runner), then
the report of the two beside the bag-of-characters bound (``<workdir>/report``,
by experiments/report.py). With ``--config`` it is one run.

A user error (a config key or value, a variant word, a flag, the workdir)
ends the run with one line on stderr naming the bad thing and what is
allowed, and exit status 2; ``--debug`` (or ``RPR_DEBUG=1``) shows the
traceback instead. ``--print_config`` prints the resolved config (every key,
documented in configs/base.py) and exits. A killed run resumes from its last
checkpoint when the same command runs again (an older one if the last does
not restore; see rpr/checkpoint.py); a changed config is refused unless its
keys are in rpr.run_config.RESUME_SAFE_KEYS or ``--allow_config_change``.
Single keys are overridden with ``--config.<key>=<value>``. On a multi-host
cluster (TPU pod slice, several GPU hosts) pass ``--multihost`` on every host
so that ``jax.distributed.initialize()`` runs before JAX is used.
"""

import logging as pylogging
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_HERE, "configs", "arithmetic.py") + ":quick",
    "Experiment config file (Python, get_config), optionally with :variant.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", os.path.join(_HERE, "workdirs", "default"),
                               "Directory of the run: config, metrics, TensorBoard events, checkpoints.")
QUICK_SCHEMES = ("sinusoidal", "none")  # one scheme that sees the order, one that cannot
STOPPED = 3  # exit status of a run a signal stopped (checkpoint saved; the same command resumes)
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (one process per host).")
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved config and exit.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the traceback of a user error instead of one line.")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_list(
    "allow_config_change", [], "Config keys a resumed run may change besides rpr.run_config.RESUME_SAFE_KEYS, "
    "e.g. learning_rate,model.dropout_rate.")


def _debugging(argv=()) -> bool:
  return "--debug" in argv or os.environ.get("RPR_DEBUG") == "1" or (flags.FLAGS.is_parsed() and _DEBUG.value)


def _fail(message: str) -> None:
  """One line on stderr and exit status 2: a user error, not a bug."""
  print(f"run.py: error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def _parse_flags(argv):
  """absl's flag parsing; a bad flag or config override is one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, ValueError, TypeError, AttributeError) as e:
    if _debugging(argv):
      raise
    message = str(e)
    if isinstance(e, (KeyError, AttributeError)):  # an override of a key the config does not have
      key = message.strip("\"'")
      overrides = [a.partition("=")[0] for a in argv if a.startswith("--config.")]
      named = [o for o in overrides if key in o[len("--config."):].split(".")]
      if named:
        _fail(f"{named[0]}: the config has no key {key!r}; allowed: the keys --print_config shows (documented in "
              "configs/base.py)")
    if "Traceback (most recent call last)" in message:  # config_flags wraps what the config file raised
      last = message.strip().splitlines()[-1]
      if not last.startswith("ValueError: "):
        raise  # a bug in the config file, not a bad value: keep the traceback
      message = last[len("ValueError: "):]
    _fail(message)


class _OrbaxInfoFilter(pylogging.Filter):
  """Drops orbax's per-save INFO chatter so the progress lines stay readable (warnings pass)."""

  def filter(self, record):
    return record.levelno >= pylogging.WARNING or "/orbax/" not in record.pathname


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}; allowed: flags only (--config, --workdir, ...; see --help)")
  if _PRINT_CONFIG.value:
    print(_CONFIG.value)
    return
  try:
    _run()
  except Exception as e:  # user errors are one line; bugs keep their traceback
    from rpr import checkpoint
    from rpr import run_config

    if isinstance(e, (run_config.ConfigError, checkpoint.CheckpointError)) and not _debugging():
      _fail(str(e))
    raise


def _run():
  logging.get_absl_handler().addFilter(_OrbaxInfoFilter())
  from rpr import run_config  # imports JAX without starting its runtime

  config, single = _CONFIG.value, flags.FLAGS["config"].present
  # Every check but the device count's before JAX starts (or logs anything), so a user error is the only line.
  run_config.validate(config, 1, _WORKDIR.value if single else None, _ALLOW_CONFIG_CHANGE.value if single else (),
                      quiet=True)
  import jax  # after flag parsing, so --multihost can initialise the runtime first

  if _MULTIHOST.value:
    jax.distributed.initialize()
  from rpr import train

  run_config.validate(config, jax.device_count())  # the batch sizes against the devices, before the first log line
  logging.info("JAX process %d of %d, %d local / %d global devices (%s).", jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count(), jax.devices()[0].platform)
  if not single:  # the default: the quick comparison
    _compare(config, _WORKDIR.value)
    return
  results = train.train_and_evaluate(config, _WORKDIR.value, allow_config_change=_ALLOW_CONFIG_CHANGE.value)
  logging.info("Final metrics: %s", ", ".join(f"{k} {v:.4f}" for k, v in sorted(results.items())))
  if results.get("stopped_by_signal"):
    sys.exit(STOPPED)  # saved and resumable, but not finished


def _compare(config, workdir: str) -> None:
  """``config`` once per scheme of QUICK_SCHEMES (``<workdir>/<scheme>``), then the report beside the bound."""
  from experiments import report
  from experiments import sweep

  jobs = []
  for scheme in QUICK_SCHEMES:
    c = config.copy_and_resolve_references()
    c.model.position = scheme
    jobs.append(sweep.Job(c, os.path.join(workdir, scheme), f"python run.py --workdir={workdir} (pe={scheme})"))
  outcome = sweep.train_all(jobs)
  if outcome["stopped"]:
    sys.exit(STOPPED)
  if outcome["failed"]:
    sys.exit(f"run.py: {len(outcome['failed'])} run(s) failed: {outcome['failed']} (their logs above)")
  out = os.path.join(workdir, "report")
  report.write_report([j.workdir for j in jobs], out, metric=f"{config.eval_splits[0]}/exact_match",
                      bound=("bag",) if config.dataset == "arithmetic" else (),
                      command="python run.py " + " ".join(sys.argv[1:]))
  with open(os.path.join(out, "table.md"), encoding="utf-8") as f:
    print(f.read(), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
