"""The training step of the translation and LM configs: steps a second, model FLOPs, share of the matmul peak,
memory, and bfloat16's loss beside float32's (:mod:`experiments.bench.step`).

    python -m experiments.bench_step                       # every case, 2 rounds, 2 cores
    python -m experiments.bench_step --cases translation/shaw --steps 50 --rounds 1 --out /tmp/x

Each measurement is a process of its own pinned to one core, two at a time (one per core), as the sweeps train;
the rounds interleave the cases, and the README gives each case's median over its rounds. Stop other work on the
machine first: the numbers are rates.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys

from absl import app
from absl import flags

from experiments import machine
from experiments.bench import step

FLAGS = flags.FLAGS
OUT = os.path.join("experiments", "results", "bench", "step")


def _one(case: step.Case, steps: int, core: int) -> subprocess.Popen:
  code = ("import json, sys; from experiments.bench import step; "
          f"print(json.dumps(step.measure(step.Case(*{list(dataclasses.astuple(case))!r}), {steps})))")
  env = {**os.environ, "PYTHONPATH": machine.ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
  return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", code], cwd=machine.ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(cases, steps: int, rounds: int, cores) -> list[dict]:
  """Every case ``rounds`` times, ``len(cores)`` processes at once; one record per measurement."""
  queue = [c for _ in range(rounds) for c in cases]
  out = []
  while queue:
    batch, queue = queue[:len(cores)], queue[len(cores):]
    procs = [(c, _one(c, steps, core)) for c, core in zip(batch, cores)]
    for c, p in procs:
      stdout, stderr = p.communicate()
      if p.returncode:
        raise RuntimeError(f"{c.name} ({c.dtype}) failed:\n{stderr[-3000:]}")
      out.append(json.loads(stdout.strip().splitlines()[-1]))
      print(f"{c.name} {c.dtype}: {out[-1]['steps_per_sec']:.2f} steps/s, "
            f"{out[-1]['fraction_of_peak']:.2f} of the matmul peak", flush=True)
  return out


def table(records: list[dict]) -> str:
  """One row per case: the medians over its rounds."""
  by = {}
  for r in records:
    by.setdefault((r["case"]["name"], r["case"]["dtype"]), []).append(r)
  f32 = {name: statistics.median(x["loss"] for x in rs) for (name, dtype), rs in by.items() if dtype == "float32"}
  rows = ["| case | dtype | steps/s | GFLOP/step | GFLOP/s | matmul peak GFLOP/s | share of peak | peak memory MB "
          "| loss (last quarter) | vs float32 |", "|" + " --- |" * 10]
  for (name, dtype), rs in by.items():
    med = lambda key: statistics.median(x[key] for x in rs)
    loss = med("loss")
    delta = f"{loss - f32[name]:+.4f}" if name in f32 else "-"
    rows.append(f"| {name} | {dtype} | {med('steps_per_sec'):.2f} | {med('flops_per_step') / 1e9:.2f} | "
                f"{med('flops_per_sec') / 1e9:.1f} | {med('matmul_peak') / 1e9:.1f} | {med('fraction_of_peak'):.2f} | "
                f"{statistics.median(x['memory']['peak'] for x in rs) / 1e6:.0f} | {loss:.4f} | {delta} |")
  return "\n".join(rows)


def write(data: dict, out: str) -> None:
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)
  text = (f"# Training step\n\nMade by `{data['command']}` on {data['date']} ({data['machine']['cpu']}, "
          f"{data['machine']['cores']} cores), {data['steps']} steps a measurement, median of {data['rounds']} "
          "rounds, one process per core, two at once.\n\n" + table(data["records"]) + "\n")
  with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
    f.write(text)


def main(argv):
  del argv
  names = FLAGS.cases or sorted({c.name for c in step.CASES})
  cases = [c for c in step.CASES if c.name in names and c.dtype in FLAGS.dtypes]
  if not cases:
    raise app.UsageError(f"--cases {FLAGS.cases}: allowed: {sorted({c.name for c in step.CASES})}")
  records = run(cases, FLAGS.steps, FLAGS.rounds, [int(c) for c in FLAGS.cores])
  write({"command": "python -m experiments.bench_step " + shlex.join(sys.argv[1:]),
         "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine.machine(),
         "steps": FLAGS.steps, "rounds": FLAGS.rounds, "records": records}, FLAGS.out)


if __name__ == "__main__":
  flags.DEFINE_list("cases", [], "Case names (default: all), e.g. translation/shaw,lm/sinusoidal.")
  flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "model.dtype values.")
  flags.DEFINE_integer("steps", 150, "Timed training steps a measurement.")
  flags.DEFINE_integer("rounds", 2, "Measurements of each case, interleaved.")
  flags.DEFINE_list("cores", ["0", "1"], "Cores to pin to, one process each at a time.")
  flags.DEFINE_string("out", OUT, "Directory of results.json and README.md.")
  app.run(main)
