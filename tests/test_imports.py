"""The light library stays light: importing rpr, its attention, model, training loop and run config loads no
TensorFlow and no TFDS (they come in when a data set or a metric writer is built), and the modules that bring
them in keep TensorFlow's INFO lines and TFDS's progress bars out of a run's log."""

import os
import subprocess
import sys

HEAVY = ("tensorflow", "tensorflow_datasets")


LIGHT = ("rpr", "rpr.attention", "rpr.model", "rpr.train", "rpr.config", "rpr.checkpoint", "rpr.decode",
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


def _level_after_importing(module, user_level):
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  if user_level is not None:
    env["TF_CPP_MIN_LOG_LEVEL"] = user_level
  code = f"import os, {module}; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, env=env)
  return out.stdout.strip()


def test_the_modules_that_bring_tensorflow_quiet_its_info_lines_unless_the_user_chose_a_level():
  # The data sets (TFDS) and the TensorBoard writer (clu) import TensorFlow; importing either module sets
  # TF_CPP_MIN_LOG_LEVEL=1 first, and keeps a level the user set (an empty one included).
  for module in ("rpr.data", "rpr.writers"):
    assert _level_after_importing(module, None) == "1", module
    for user_level in ("0", "3", ""):
      assert _level_after_importing(module, user_level) == user_level, (module, user_level)


def test_the_data_set_modules_turn_tfds_progress_bars_off():
  # Each module in a fresh state: the bars are switched on again before it is imported.
  modules = ("rpr.data.arithmetic", "rpr.data.wmt", "rpr.data.bible", "rpr.data.sotu")
  code = ("import importlib; from tensorflow_datasets.core.utils import tqdm_utils\n"
          f"for m in {modules!r}:\n"
          "  tqdm_utils.display_progress_bar(True); importlib.import_module(m)\n"
          "  print(m, isinstance(tqdm_utils.tqdm(disable=True), tqdm_utils.EmptyTqdm))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
  assert out.stdout.split() == [w for m in modules for w in (m, "True")], out.stdout
