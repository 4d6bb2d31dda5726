"""Trains and evaluates one experiment: ``python run.py --config=configs/<name>.py[:variant] --workdir=<dir>``.

With no flags it runs ``configs/default.py`` in ``workdirs/default`` (CPU-sized).
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
    "config", os.path.join(_HERE, "configs", "default.py"), "Experiment config file (Python, get_config).",
    lock_config=True)
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
  results = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  logging.info("Final metrics: %s", ", ".join(f"{k} {v:.4f}" for k, v in sorted(results.items())))


if __name__ == "__main__":
  app.run(main)
