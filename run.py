"""Trains and evaluates one experiment: ``python run.py --config=configs/<name>.py[:variant] --workdir=<dir>``.

With no flags it runs ``configs/arithmetic.py:quick`` in ``workdirs/default``
(CPU-sized, a few minutes): seed 002's arithmetic trained once with a position
encoding and once without, printed beside the bag-of-characters bound. A
config that names schemes in ``compare_positions`` is trained once per scheme
(:func:`rpr.compare.compare_positions`); any other is one run.
Single keys are overridden with ``--config.<key>=<value>``. On a multi-host
cluster (TPU pod slice, several GPU hosts) pass ``--multihost`` on every host
so that ``jax.distributed.initialize()`` runs before JAX is used.
"""

import logging as pylogging
import os

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
_MULTIHOST = flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (one process per host).")


class _OrbaxInfoFilter(pylogging.Filter):
  """Drops orbax's per-save INFO chatter so the progress lines stay readable (warnings pass)."""

  def filter(self, record):
    return record.levelno >= pylogging.WARNING or "/orbax/" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_OrbaxInfoFilter())
  import jax  # after flag parsing, so --multihost can initialise the runtime first

  if _MULTIHOST.value:
    jax.distributed.initialize()
  from rpr import train

  logging.info("JAX process %d of %d, %d local / %d global devices (%s).", jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count(), jax.devices()[0].platform)
  if _CONFIG.value.get("compare_positions"):
    from rpr import compare

    compare.compare_positions(_CONFIG.value, _WORKDIR.value)
    return
  results = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  logging.info("Final metrics: %s", ", ".join(f"{k} {v:.4f}" for k, v in sorted(results.items())))


if __name__ == "__main__":
  app.run(main)
