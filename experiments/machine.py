"""The machine a measurement ran on, and the one definition of a compiled program's peak memory.

:func:`peak_bytes` is what every benchmark here reports as "peak memory":
XLA's estimate from ``compiled.memory_analysis()``,
``temp + argument + output - alias`` (:data:`PEAK`). :func:`machine` is the
record of the hardware and software a number was measured on, :func:`command` the command that measured it.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys

GB = 1e9
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEAK = "temp + argument + output - alias"  # the formula of peak_bytes, for the reports' text


def peak_bytes(compiled) -> dict[str, int]:
  """XLA's memory estimate of ``compiled`` (a ``jax.stages.Compiled``), and ``peak`` = temp + argument + output - alias.

  ``CompiledMemoryStats`` (jaxlib 0.10) has ``argument_size_in_bytes`` (the
  inputs), ``output_size_in_bytes`` (the results), ``alias_size_in_bytes``
  (outputs written into donated inputs, counted in both of the former, so
  subtracted once; 0 without donation), ``temp_size_in_bytes`` (XLA's buffer
  assignment: the one block holding every intermediate, activations kept for
  the backward pass included, with buffers whose lifetimes do not overlap
  sharing bytes) and ``generated_code_size_in_bytes``. Its
  ``peak_memory_in_bytes`` is recorded (``xla_peak_memory_in_bytes``) but not
  used: on XLA:CPU it leaves out the temp block, so it would hide exactly the
  O(L^2) tensors the benchmarks look for.

  Returns:
    ``temp``, ``argument``, ``output``, ``alias``, ``generated_code``, ``xla_peak_memory_in_bytes`` (-1 where
    jaxlib has none) and ``peak``, in bytes.
  """
  m = compiled.memory_analysis()
  out = {key: int(getattr(m, f"{key}_size_in_bytes")) for key in ("temp", "argument", "output", "alias",
                                                                   "generated_code")}
  out["xla_peak_memory_in_bytes"] = int(getattr(m, "peak_memory_in_bytes", -1))
  out["peak"] = out["temp"] + out["argument"] + out["output"] - out["alias"]
  return out


def machine() -> dict:
  """CPU, cores, library versions, devices, XLA flags, git commit, memory and JAX backend of this process."""
  import flax
  import jax

  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
  return {"cpu": cpu, "cores": os.cpu_count(), "jax": jax.__version__, "jaxlib": jax.lib.__version__,
          "flax": flax.__version__, "python": platform.python_version(), "devices": [str(d) for d in jax.devices()],
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "git_commit": commit.strip(),
          "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 1),
          "backend": jax.default_backend()}


def command() -> str:
  """This process's command line as typed at the repository root: ``python -m experiments VERB [flags]``."""
  return "python -m experiments " + shlex.join(sys.argv[1:])
