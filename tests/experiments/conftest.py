"""Fixtures of the tests that read the committed results."""

import glob
import os
import pathlib
import subprocess
import types

import pytest

from experiments import runs as runs_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
