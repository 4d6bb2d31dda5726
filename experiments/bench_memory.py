"""Peak memory of a whole training step against sequence length: dense vs chunked attention.

    python -m experiments.bench_memory --lengths 4096,8192 --out experiments/results/bench/model_memory
    python -m experiments.bench_memory --report_only --out DIR     # README.md again from DIR/results.json

What is measured and how: :mod:`experiments.bench.memory` (the flags are its
``Settings``): each step is compiled, never run, and its peak is XLA's
estimate (:func:`experiments.machine.peak_bytes`). Writes ``results.json``
and ``README.md`` (:mod:`experiments.bench.memory_readme`; with ``notes.md``
of ``--out`` appended as the reading, if present) to ``--out`` after each
measurement, so partial results survive an interruption.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import sys

from absl import app
from absl import flags

from experiments import machine
from experiments import settings as settings_lib
from experiments.bench import memory
from experiments.bench import memory_readme

FLAGS = flags.FLAGS


def run(s: memory.Settings, out: str, command: str) -> dict:
  """Measures every (scheme, implementation, length), writing the report after each; returns the data."""
  date = datetime.datetime.now().isoformat(timespec="seconds")
  data = {"command": command, "args": dataclasses.asdict(s), "date": date,
          "machine": machine.machine(), "chunk_block": memory.chunk_block(), "positions": list(s.positions),
          "lengths": sorted(s.lengths), "results": {}}
  print(json.dumps(data["machine"]), flush=True)
  for position in s.positions:
    for impl in s.implementations:
      for n in data["lengths"]:
        k = memory.key(position, impl, n)
        if impl == "dense" and s.skip_dense_above and n > s.skip_dense_above:
          data["results"][k] = {"position": position, "implementation": impl, "length": n,
                                "status": f"skipped (--skip_dense_above {s.skip_dense_above})"}
          continue
        entry = memory.measure(s, position, impl, n, top=s.top_arrays if impl == "chunked" else 0)
        data["results"][k] = entry
        print(f"  {k:24s} peak {entry['memory']['peak'] / machine.GB:8.4f} GB  "
              f"(temp {entry['memory']['temp'] / machine.GB:.4f})  compile {entry['compile_s']:.1f} s", flush=True)
        memory.add_ratios(data)
        data["targets"] = memory.check_targets(data)
        memory_readme.write(data, out)
  return data


def define_flags() -> None:
  """The command line: a flag per Settings field, ``--out`` and ``--report_only``."""
  settings_lib.define(memory.Settings)
  flags.DEFINE_string("out", os.path.join(machine.ROOT, "experiments", "results", "bench", "model_memory"),
                      "Output directory of results.json and README.md.")
  flags.DEFINE_bool("report_only", False, "Re-render README.md from --out's results.json.")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  out = FLAGS.out
  if FLAGS.report_only:
    with open(os.path.join(out, "results.json")) as f:
      memory_readme.write(json.load(f), out)
    return
  try:
    s = settings_lib.parse(memory.Settings)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  data = run(s, out, "python -m experiments.bench_memory " + shlex.join(sys.argv[1:]))
  print(memory_readme.results_table(data))
  for t in data["targets"]:
    print(memory_readme.target_line(t))
  print(f"target (chunked peak(2L) / peak(L) <= {memory.TARGET_RATIO}): {memory.verdict(data['targets'])}")
  print(memory_readme.quadratic_line(data))
  print(f"wrote {out}/results.json and README.md")


if __name__ == "__main__":
  define_flags()
  app.run(main)
