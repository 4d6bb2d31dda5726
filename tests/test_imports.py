"""The light library stays light: importing rpr, its attention, model, training loop and run config loads no
TensorFlow and no TFDS (they come in when a data set or a metric writer is built)."""

import subprocess
import sys

HEAVY = ("tensorflow", "tensorflow_datasets")


LIGHT = ("rpr", "rpr.attention", "rpr.model", "rpr.train", "rpr.run_config", "rpr.checkpoint", "rpr.decode",
         "rpr.predict")


def test_importing_the_library_loads_no_tensorflow():
  # One interpreter imports them all: if together they load neither, none of them does alone.
  code = f"import sys, {', '.join(LIGHT)}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
  assert out.stdout.strip() == "[]", out.stdout


def test_a_data_set_still_brings_them_when_it_is_built():
  code = ("import sys; from configs import translation; from rpr.data import bible; "
          f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
  assert "tensorflow_datasets" in out.stdout, out.stdout  # the check above can fail
