"""What a run records of the machine and the code beside its config (``config.json``), so that a number can be
traced to what made it; a run resumed where any of it differs is logged (``rpr.run_config.check_resume``)."""

from __future__ import annotations

import os
import subprocess
from typing import Optional

import jax

CODE = ("rpr", "configs", "run.py")  # the tracked paths whose changes :func:`code_version` reports


def code_version(root: Optional[str] = None) -> Optional[str]:
  """The git commit of the checkout at ``root`` (default: the one this package runs from), ``+modified`` when a
  tracked file of :data:`CODE` differs from it; None where ``root`` is not a checkout's top (an installed wheel)
  or without git."""
  root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  git = lambda *args: subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30,
                                     check=True).stdout.strip()
  try:
    if git("rev-parse", "--show-toplevel") != root:
      return None  # a git checkout around the package, not its own
    commit, modified = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no", "--", *CODE)
  except (OSError, subprocess.SubprocessError):
    return None
  return commit + ("+modified" if modified else "")


def environment() -> dict:
  """What ``config.json`` records of the machine and the code beside the config; a resumed run may differ in it
  (logged)."""
  # XLA:CPU's thread pool follows the cores the process may run on (its flags alone do not fix it), and its
  # threading can change reduction orders: a result reproduces bit for bit with the same flags and cores.
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"num_devices": jax.device_count(), "num_processes": jax.process_count(),
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "cpu_cores": cores, "jax_version": jax.__version__,
          "code_version": code_version()}
