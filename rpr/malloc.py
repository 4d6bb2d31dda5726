"""glibc's allocator set for XLA:CPU training, applied by the entry points before they start any work.

XLA:CPU allocates each training step's temporary buffer (about 236 MB for the
translation model) from a thread's malloc arena, which cannot hold it, so
glibc maps it with ``mmap`` and unmaps it when the step ends; the next step
faults every page back in, and a third of the CPU time goes to the kernel.
One arena, no ``mmap`` and no trimming keep the buffer: 1.63x the training
steps a second, every record and parameter bit for bit the same
(``experiments/results/bench/malloc/``). glibc reads ``GLIBC_TUNABLES`` once,
when the process starts, so :func:`apply` starts the process again with it.

Opt out by setting ``GLIBC_TUNABLES`` yourself, to anything (``GLIBC_TUNABLES=``
keeps glibc's defaults). This module imports nothing heavy: the entry points
call it first.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLES = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"


def applies() -> bool:
  """Whether the setting can act here: Linux with glibc (musl and other systems ignore ``GLIBC_TUNABLES``)."""
  return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def apply() -> None:
  """Starts this process again, the same command with ``GLIBC_TUNABLES = TUNABLES``, unless the variable is set
  (the user's choice, or done already) or glibc is not the C library. Call it before any work: nothing done before
  it survives the ``exec``, and the process keeps its PID."""
  if "GLIBC_TUNABLES" in os.environ or not applies():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": TUNABLES})
