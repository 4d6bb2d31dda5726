"""python -m experiments VERB: one app over the verbs; a bad verb or flag is one line and exit status 2."""

import pathlib
import subprocess
import sys

import pytest
from absl import flags

from experiments import __main__ as app
from experiments import launch
from experiments import settings
from experiments import sweeps

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*args):
  return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


@pytest.mark.parametrize("args, message", [
    ((), "verb None; allowed: sweep, baselines, tables, bench"),
    (("train",), "verb 'train'; allowed: sweep, baselines, tables, bench"),
    (("bench", "disk"), "bench 'disk'; allowed: step, attention"),
    (("sweep", "nope"), "unknown sweep 'nope'; allowed: ['arithmetic',"),
    (("sweep", "length_tiny", "--workers", "0"), "--workers"),
    (("report", "x/*"), "verb 'report'; allowed: sweep, baselines, tables, bench"),  # retired: the tables' now
    (("tables", "--readme", "pyproject.toml"), "pyproject.toml has no <!-- tables --> ... <!-- /tables --> block"),
])
def test_a_bad_verb_or_flag_is_one_line_and_exit_status_2(args, message):
  # The sweep verb's ValueErrors (a sweep name or a flag value; the sweep turns them into this line) are checked in
  # this process; tests/experiments/test_launch.py's --executor=pbs is that path's process.
  if args[:2] == ("sweep", "length_tiny"):  # a value launch.Options.check refuses, on the sweep's own flags
    fv = flags.FlagValues()
    settings.define(launch.Options, fv)
    fv(["experiments sweep", *args[2:]])
    with pytest.raises(ValueError, match=message) as e:
      settings.parse(launch.Options, fv).check()
    assert "\n" not in str(e.value)
    return
  if args == ("sweep", "nope"):  # the name the sweep looks up
    with pytest.raises(ValueError) as e:
      sweeps.get("nope")
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    return
  proc = _run(*args)
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("python -m experiments: error: ") and message in lines[0], lines


def test_help_lists_every_verb():
  proc = _run("--help")
  assert proc.returncode == 0 and all(f"python -m experiments {verb}" in proc.stdout for verb in app.VERBS)


def test_every_verb_and_benchmark_names_a_module_with_flags_and_a_main():
  import importlib

  modules = [m for m in app.VERBS.values() if m] + list(app.BENCHMARKS.values())
  for name in modules:
    module = importlib.import_module(name)
    assert callable(module.define_flags) and callable(module.main), name


def test_sweep_list_names_every_sweep_that_the_configs_declare():
  proc = _run("sweep", "--list")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert [line.split()[0] for line in proc.stdout.splitlines()] == sorted(sweeps.SWEEPS)


def test_the_running_pilot_resumes_in_the_same_workdirs_under_the_new_command():
  # experiments/results/pilot/translation/<cell>,steps=<B>/seed<s>: the names the pilot started with.
  sweep = sweeps.get("translation_pilot")
  workdirs = {sweep.workdir(r, "experiments/results") for r in sweep.runs}
  assert workdirs == {f"experiments/results/pilot/translation/{cell},steps={b}/seed{s}"
                      for cell in ("shaw", "sinusoidal") for b in (4000, 8000, 16000, 32000) for s in (0, 1)}
