"""Fixtures of the tests that read the committed results."""

import gc
import glob
import os
import pathlib
import subprocess
import types

import pytest

from experiments import runs as runs_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _collect_only_this_tests_objects():
  """The heap the worker built before the test kept out of the collector's reach while it runs: statsmodels' Holm
  correction calls ``gc.collect()`` each time (0.1 s in a report's own process, about 1 s in a worker that ran the
  JAX tests first); afterwards the objects are handed back."""
  gc.freeze()
  yield
  gc.unfreeze()


@pytest.fixture(scope="session")
def committed_workdirs() -> list[pathlib.Path]:
  """The committed workdirs under experiments/results (git's index, so a run in progress beside them is not
  one)."""
  out = subprocess.run(["git", "ls-files", "experiments/results"], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout.split()
  return sorted(ROOT / os.path.dirname(p) for p in out if p.endswith("/metrics.jsonl"))


@pytest.fixture
def committed_runs_only(monkeypatch, committed_workdirs):
  """Reports read only the committed runs: a run the background sweeps are training beside them, in the same
  folder, is left out (in a clean clone, as in CI, nothing is)."""
  tracked = {str(w.relative_to(ROOT)) for w in committed_workdirs}

  def committed(pattern):
    return [p for p in glob.glob(pattern) if os.path.relpath(os.path.abspath(p), ROOT) in tracked]

  monkeypatch.setattr(runs_lib, "glob", types.SimpleNamespace(glob=committed))
