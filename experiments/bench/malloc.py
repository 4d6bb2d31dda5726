"""Training steps a second under glibc's default malloc and under malloc tunables, in the same run.

    python -m experiments bench malloc --out experiments/results/bench/malloc

Each setting trains the same config and seed with ``run.py`` (no evaluation,
one checkpoint at the end), as a process pinned to one core with ``taskset``.
With two cores the two settings train at once, one per core, then again with
the cores swapped; with one, one after the other. Per process: its steady
step rate (the steps after the first log record over their logged time, so
compilation is left out), its user and system CPU seconds and its page
faults (``os.wait4``). Then whether the settings trained the same run: every
metrics record but the step rate, and every parameter of the last
checkpoint, bit for bit. Writes ``results.json`` and ``README.md`` (with
``notes.md`` of ``--out`` appended as the reading, if present) to ``--out``;
``--report_only`` writes ``README.md`` again from ``results.json``. Each
process's log is ``<name>.log`` in a temporary folder, kept when one fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from absl import app
from absl import flags

from experiments import machine
from experiments import render
from experiments import engine
from experiments import settings as settings_lib
from rpr import malloc
from rpr.records import read_jsonl

TUNED = malloc.TUNABLES  # what run.py applies by itself


@dataclasses.dataclass(frozen=True)
class Settings:
  config: str = settings_lib.knob("configs/translation.py:pe=shaw,k=16", "run.py's --config.")
  steps: int = settings_lib.knob(400, "Training steps of each process.")
  log_every: int = settings_lib.knob(100, "Steps between log records; the rate is read after the first.")
  tunables: str = settings_lib.knob(TUNED, "GLIBC_TUNABLES of the tuned setting.")
  cores: tuple[int, ...] = settings_lib.knob((0, 1), "Cores to pin to: two run both settings at once, swapped.")


def command(s: Settings, workdir: str, core: int) -> list[str]:
  return ["taskset", "-c", str(core), sys.executable, "run.py", f"--config={s.config}", f"--workdir={workdir}",
          f"--config.num_train_steps={s.steps}", f"--config.log_every_steps={s.log_every}",
          "--config.eval_splits=()", "--config.final_eval_splits=()", "--config.tensorboard=False",
          f"--config.checkpoint_every_steps={s.steps}"]


def env(tunables: str) -> dict:
  """This process's environment with ``GLIBC_TUNABLES`` set to ``tunables``: "" keeps glibc's defaults, since a
  set variable, even empty, is run.py's opt-out from its own setting (rpr/malloc.py)."""
  return {**os.environ, "GLIBC_TUNABLES": tunables}


def steady_rate(records: list[dict]) -> float:
  """Steps a second over the log records after the first (each rate covers the steps since the record before)."""
  logged = [r for r in records if "train/steps_per_sec" in r]
  steps = [b["step"] - a["step"] for a, b in zip(logged, logged[1:])]
  seconds = sum(n / r["train/steps_per_sec"] for n, r in zip(steps, logged[1:]))
  return sum(steps) / seconds


def launch(s: Settings, jobs: list[tuple[str, str, int]], root: str) -> dict:
  """Runs ``jobs`` ((name, tunables, core), at once); per name its rate, CPU seconds and page faults."""
  procs = {}
  for name, tunables, core in jobs:
    with open(os.path.join(root, f"{name}.log"), "w", encoding="utf-8") as log:  # a file: a pipe would fill
      procs[subprocess.Popen(command(s, os.path.join(root, name), core), env=env(tunables), cwd=machine.ROOT,
                             stdout=log, stderr=subprocess.STDOUT).pid] = (name, core)
  out = {}
  while procs:
    pid, status, usage = os.wait4(-1, 0)
    if pid not in procs:
      continue
    name, core = procs.pop(pid)
    if os.waitstatus_to_exitcode(status) != 0:
      raise RuntimeError(f"{name} exited with status {os.waitstatus_to_exitcode(status)}; its log: "
                         f"{os.path.join(root, name + '.log')}")
    records = read_jsonl(os.path.join(root, name, "metrics.jsonl"))
    out[name] = {"core": core, "steps_per_sec": steady_rate(records), "user_s": usage.ru_utime,
                 "system_s": usage.ru_stime, "page_faults": usage.ru_minflt}
  return out


def same_run(a: str, b: str) -> dict:
  """Whether two workdirs hold the same records (but the step rate) and the same parameters, bit for bit."""
  timeless = lambda w: [{k: v for k, v in r.items() if k != "train/steps_per_sec"}
                        for r in read_jsonl(os.path.join(w, "metrics.jsonl"))]
  from flax import traverse_util

  pa, pb = (traverse_util.flatten_dict(engine.load_params(w)) for w in (a, b))
  return {"records": timeless(a) == timeless(b),
          "parameters": pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa),
          "arrays": len(pa)}


def measure(s: Settings, root: str) -> dict:
  both = len(s.cores) > 1
  rounds = ([[("default", "", s.cores[0]), ("tuned", s.tunables, s.cores[1])],
             [("default_swapped", "", s.cores[1]), ("tuned_swapped", s.tunables, s.cores[0])]] if both
            else [[("default", "", s.cores[0])], [("tuned", s.tunables, s.cores[0])]])
  runs = {}
  for jobs in rounds:
    runs.update(launch(s, jobs, root))
  rate = lambda prefix: np.mean([r["steps_per_sec"] for n, r in runs.items() if n.startswith(prefix)])
  return {"runs": runs, "ratio": float(rate("tuned") / rate("default")),
          "same_run": same_run(os.path.join(root, "default"), os.path.join(root, "tuned"))}


def write(data: dict, out: str) -> str:
  """Writes ``README.md`` of ``data`` to ``out``, ``notes.md`` there appended as the reading; returns it."""
  rows = [[name, str(r["core"]), f"{r['steps_per_sec']:.2f}", f"{r['user_s']:.0f}", f"{r['system_s']:.0f}",
           f"{r['page_faults']:,}"] for name, r in data["runs"].items()]
  same = data["same_run"]
  lines = [
      "# Training steps a second under two malloc settings", "", f"Generated by `{data['command']}`.", "",
      f"Machine: {data['machine']['cpu']}, {data['machine']['cores']} cores, jax {data['machine']['jax']}; "
      f"{data['settings']['config']}, {data['settings']['steps']} steps. Tuned: `GLIBC_TUNABLES="
      f"{data['settings']['tunables']}`.", "",
      render.markdown_table(["setting", "core", "steps/s (after the first log record)", "user s", "system s",
                             "page faults"], rows), "",
      f"**Tuned / default steps a second: {data['ratio']:.2f}x.** The same run under both: records "
      f"{'identical' if same['records'] else 'DIFFER'}, parameters ({same['arrays']} arrays) "
      f"{'identical' if same['parameters'] else 'DIFFER'}.", ""]
  notes = os.path.join(out, "notes.md")
  if os.path.exists(notes):
    with open(notes, encoding="utf-8") as f:
      lines += ["## Reading", "", f.read().strip(), ""]
  with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return "\n".join(lines)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  out = flags.FLAGS.out
  if flags.FLAGS.report_only:
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
      print(write(json.load(f), out))
    return
  s = settings_lib.parse(Settings)
  if shutil.which("taskset") is None or not s.cores:
    raise app.UsageError(f"--cores {list(s.cores)} needs taskset and at least one core")
  root = tempfile.mkdtemp(prefix="bench_malloc_")
  data = {"command": " ".join(["python -m experiments", *map(shlex.quote, sys.argv[1:])]),
          "settings": dataclasses.asdict(s), "machine": machine.machine(), **measure(s, root)}
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)
  print(write(data, out))
  shutil.rmtree(root)


def define_flags() -> None:
  """The ``bench malloc`` verb's flags: a flag per Settings field, ``--out`` and ``--report_only``."""
  settings_lib.define(Settings)
  flags.DEFINE_string("out", None, "Output directory (results.json, README.md).", required=True)
  flags.DEFINE_bool("report_only", False, "Write README.md again from --out's results.json; measure nothing.")
