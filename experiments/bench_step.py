"""The training step of the translation and LM configs: steps a second, model FLOPs, share of the matmul peak,
memory, and bfloat16's loss beside float32's (:mod:`experiments.bench.step`).

    python -m experiments.bench_step                       # every case, 2 rounds, 2 cores
    python -m experiments.bench_step --cases translation/shaw --steps 50 --rounds 1 --out /tmp/x
    git worktree add /tmp/old <commit>; python -m experiments.bench_step --baseline /tmp/old --dtypes float32

Each measurement is a process of its own pinned to one core, two at a time (one per core), as the sweeps train;
the rounds interleave the cases, and the README gives each case's median over its rounds. Every process runs with
run.py's allocator setting (rpr/malloc.py). ``--baseline DIR`` measures each case in another checkout too, at the
same time on the other core, and gives the ratios. Stop other work on the machine first: the numbers are rates.
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
from rpr import malloc

FLAGS = flags.FLAGS
OUT = os.path.join("experiments", "results", "bench", "step")


def _one(case: step.Case, steps: int, core: int, root: str = machine.ROOT,
         tunables: str = malloc.TUNABLES) -> subprocess.Popen:
  """``case`` measured in a process pinned to ``core``, with the library (rpr, configs) of the checkout ``root``
  and this checkout's measuring code (so an older checkout, without it, can be measured the same way)."""
  here = os.path.join(machine.ROOT, "experiments", "bench", "step.py")
  code = ("import importlib.util, json, sys; "
          f"spec = importlib.util.spec_from_file_location('bench_step_measure', {here!r}); "
          "step = sys.modules['bench_step_measure'] = importlib.util.module_from_spec(spec); "
          "spec.loader.exec_module(step); "
          f"print(json.dumps(step.measure(step.Case(*{list(dataclasses.astuple(case))!r}), {steps})))")
  env = {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2", "GLIBC_TUNABLES": tunables}
  return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", code], cwd=root, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(cases, steps: int, rounds: int, cores, baseline: str = "", baseline_tunables: str = malloc.TUNABLES
        ) -> list[dict]:
  """Every case ``rounds`` times, ``len(cores)`` processes at once; one record per measurement. With a
  ``baseline`` checkout, each case is measured there and here at once, on swapped cores from round to round."""
  if baseline:
    jobs = [[(c, root) for root in ((baseline, machine.ROOT) if r % 2 == 0 else (machine.ROOT, baseline))]
            for r in range(rounds) for c in cases]
  else:
    flat = [(c, machine.ROOT) for _ in range(rounds) for c in cases]
    jobs = [flat[i:i + len(cores)] for i in range(0, len(flat), len(cores))]
  out = []
  for batch in jobs:
    procs = [(c, root, _one(c, steps, core, root, malloc.TUNABLES if root == machine.ROOT else baseline_tunables))
             for (c, root), core in zip(batch, cores)]
    for c, root, p in procs:
      stdout, stderr = p.communicate()
      if p.returncode:
        raise RuntimeError(f"{c.name} ({c.dtype}) in {root} failed:\n{stderr[-3000:]}")
      out.append({**json.loads(stdout.strip().splitlines()[-1]), "baseline": root != machine.ROOT})
      print(f"{c.name} {c.dtype}{' (baseline)' if out[-1]['baseline'] else ''}: {out[-1]['steps_per_sec']:.2f} "
            f"steps/s, {out[-1]['fraction_of_peak']:.2f} of the matmul peak", flush=True)
  return out


def ratios(records: list[dict]) -> str:
  """Per case, this checkout's steps a second over the baseline's, round by round (measured at the same time)."""
  lines = []
  by = {}
  for r in records:
    by.setdefault((r["case"]["name"], r["case"]["dtype"]), []).append(r)
  for (name, dtype), rs in by.items():
    pairs = [(rs[i], rs[i + 1]) for i in range(0, len(rs) - 1, 2)]
    each = [(b if not b["baseline"] else a)["steps_per_sec"] / (a if a["baseline"] else b)["steps_per_sec"]
            for a, b in pairs]
    if each:
      lines.append(f"| {name} | {dtype} | " + ", ".join(f"{x:.2f}" for x in each) + " |")
  return "\n".join(["| case | dtype | steps/s here / baseline, each round |", "| --- | --- | --- |", *lines])


def table(records: list[dict]) -> str:
  """One row per case: the medians over its rounds (this checkout's records only)."""
  by = {}
  for r in (r for r in records if not r.get("baseline")):
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
  if data.get("baseline"):
    text += (f"\nAgainst the checkout {data['baseline']} (commit {data['baseline_commit']}, GLIBC_TUNABLES="
             f"'{data['baseline_glibc_tunables']}'), measured at the same time on the other core, cores swapped from "
             "round to round:\n\n" + ratios(data["records"]) + "\n")
  with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
    f.write(text)


def main(argv):
  del argv
  names = FLAGS.cases or sorted({c.name for c in step.CASES})
  cases = [c for c in step.CASES if c.name in names and c.dtype in FLAGS.dtypes]
  if not cases:
    raise app.UsageError(f"--cases {FLAGS.cases}: allowed: {sorted({c.name for c in step.CASES})}")
  records = run(cases, FLAGS.steps, FLAGS.rounds, [int(c) for c in FLAGS.cores], FLAGS.baseline,
                FLAGS.baseline_glibc_tunables)
  commit = lambda root: subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                                       text=True).stdout.strip()
  write({"command": "python -m experiments.bench_step " + shlex.join(sys.argv[1:]), "commit": commit(machine.ROOT),
         "baseline": FLAGS.baseline, "baseline_glibc_tunables": FLAGS.baseline_glibc_tunables,
         "baseline_commit": commit(FLAGS.baseline) if FLAGS.baseline else "",
         "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine.machine(),
         "steps": FLAGS.steps, "rounds": FLAGS.rounds, "records": records}, FLAGS.out)


if __name__ == "__main__":
  flags.DEFINE_list("cases", [], "Case names (default: all), e.g. translation/shaw,lm/sinusoidal.")
  flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "model.dtype values.")
  flags.DEFINE_integer("steps", 150, "Timed training steps a measurement.")
  flags.DEFINE_integer("rounds", 2, "Measurements of each case, interleaved.")
  flags.DEFINE_list("cores", ["0", "1"], "Cores to pin to, one process each at a time.")
  flags.DEFINE_string("out", OUT, "Directory of results.json and README.md.")
  flags.DEFINE_string("baseline", "", "Another checkout (e.g. a git worktree of an older commit): each case is also "
                      "measured there, at the same time on the other core, and the README gives the ratios.")
  flags.DEFINE_string("baseline_glibc_tunables", malloc.TUNABLES, "GLIBC_TUNABLES of the baseline's processes ('': "
                      "glibc's defaults, what a plain run got before run.py set it)")
  app.run(main)
