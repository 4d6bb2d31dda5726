"""Attention cost per position scheme: forward + backward time and peak memory, as ratios to plain attention.

    python -m experiments.bench_attention                 # full run
    python -m experiments.bench_attention --quick         # smoke run: tiny shapes, two lengths
    python -m experiments.bench_attention --report_only --out DIR   # README.md again from DIR/results.json

What is measured and how: :mod:`experiments.bench.attention` (the flags are
its ``Settings``). Configurations whose peak-memory estimate exceeds
``--memory_budget_gb`` are compiled for the estimate but not run;
``--long_length`` times the chunked path at one long length (batch 1);
``--rss_lengths`` cross-checks the estimate with the peak resident set size
of a fresh process running one call; ``--model_step`` times a whole training
step with Shaw over sinusoidal positions.

Writes ``results.json`` and ``README.md`` (:mod:`experiments.bench.attention_readme`)
to ``--out`` (default ``experiments/results/bench``, or ``.../bench/quick``
with ``--quick``), after each length, so partial results survive an
interruption.
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
from experiments.bench import attention
from experiments.bench import attention_readme

FLAGS = flags.FLAGS


def run(s: attention.Settings, out: str, command: str) -> dict:
  """Measures every length, the long run, the RSS check and the model step as ``s`` asks; writes the report."""
  date = datetime.datetime.now().isoformat(timespec="seconds")
  data = {"command": command, "args": dataclasses.asdict(s), "date": date,
          "machine": machine.machine(), "load_start": round(os.getloadavg()[0], 2), "lengths": {}}
  print(json.dumps(data["machine"]), flush=True)
  for n in s.lengths:
    print(f"length {n}", flush=True)
    data["lengths"][str(n)] = attention.run_length(attention.CONFIGS, n, s, s.batch, s.repeats)
    attention_readme.write(data, out)  # partial results survive an interrupted run
  if s.long_length:
    print(f"long: length {s.long_length}, batch 1", flush=True)
    data["long"] = {"length": s.long_length, "batch": 1,
                    "results": attention.run_length(attention.LONG_CONFIGS, s.long_length, s, 1, s.long_repeats)}
  if s.rss_lengths:
    data["rss"] = {str(n): attention.rss_check(attention.RSS_CONFIGS, n, s.batch, s) for n in s.rss_lengths}
  if s.model_step:
    print("model step", flush=True)
    data["model_step"] = attention.model_step(s)
  data["load_end"] = round(os.getloadavg()[0], 2)
  data["targets"] = attention_readme.check_targets(data)
  attention_readme.write(data, out)
  return data


def define_flags() -> None:
  """The command line: a flag per Settings field, ``--out``, ``--report_only`` and the internal ``--rss_child``."""
  settings_lib.define(attention.Settings)
  flags.DEFINE_string("out", None, "Output directory (default experiments/results/bench, or bench/quick with --quick).")
  flags.DEFINE_bool("report_only", False, "Re-render README.md from --out's results.json (e.g. after editing "
                    "notes.md).")
  flags.DEFINE_string("rss_child", None, "Internal: 'name,implementation,length,batch': print the RSS growth of one "
                      "call of that configuration (run by --rss_lengths in a fresh process).")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  s = settings_lib.parse(attention.Settings)
  if s.quick:
    s = dataclasses.replace(s, **attention.QUICK)
  if FLAGS.rss_child:
    name, implementation, length, batch = FLAGS.rss_child.split(",")
    print(json.dumps(attention.child_rss(name, implementation, int(length), int(batch), s)))
    return
  out = FLAGS.out or os.path.join(machine.ROOT, "experiments", "results", "bench", "quick" if s.quick else "")
  if FLAGS.report_only:
    with open(os.path.join(out, "results.json")) as f:
      data = json.load(f)
    data["targets"] = attention_readme.check_targets(data)
    attention_readme.write(data, out)
    return
  data = run(s, out, "python -m experiments.bench_attention " + shlex.join(sys.argv[1:]))
  print("\n".join(data["targets"]))
  print(f"wrote {out}/results.json and README.md")


if __name__ == "__main__":
  define_flags()
  app.run(main)
