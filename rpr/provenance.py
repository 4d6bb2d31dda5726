"""What a run records of the machine and the code beside its config (``config.json``), so that a number can be
traced to what made it; a run resumed where any of it differs is logged (``rpr.record.check_resume``)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from typing import Optional

import jax

CODE = ("rpr", "configs", "run.py")
# Recorded keys that do not change a run's numbers (the allocator setting: experiments/results/bench/malloc/), so
# a resume where they differ is not logged as one that may not repeat a straight run.
SAME_NUMBERS = ("glibc_tunables",)  # the tracked paths whose changes :func:`code_version` reports


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


@functools.cache
def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
  """The processor's model name and its widest vector extension, e.g. ``"AMD EPYC (avx2)"`` (``/proc/cpuinfo`` on
  Linux; elsewhere :func:`platform.processor`, else the architecture). XLA:CPU compiles for the processor it runs
  on, so the same run on another one can take another floating-point order (a resumed run there is logged)."""
  name, flags = None, set()
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name is None:
          name = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:  # x86, Arm
          flags = set(value.split())
  except OSError:
    pass
  name = name or platform.processor() or platform.machine()
  widest = next((x for x in ("avx512f", "avx2", "avx", "sse4_2", "asimd") if x in flags), None)
  return f"{name} ({widest})" if widest else name


def environment() -> dict:
  """What ``config.json`` records of the machine and the code beside the config; a resumed run may differ in it
  (logged)."""
  # XLA:CPU's thread pool follows the cores the process may run on (its flags alone do not fix it), and its
  # threading can change reduction orders: a result reproduces bit for bit with the same flags and cores.
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"num_devices": jax.device_count(), "num_processes": jax.process_count(),
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
          "cpu_cores": cores, "cpu": cpu_model(),
          "jax_version": jax.__version__, "code_version": code_version()}
