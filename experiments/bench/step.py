"""The training step of the translation and LM configs: steps a second, model FLOPs, share of the matmul peak,
memory, and bfloat16's loss beside float32's.

    python -m experiments bench step                       # every case, 2 rounds, 2 cores
    python -m experiments bench step --cases translation/shaw --steps 50 --rounds 1 --out /tmp/x
    git worktree add /tmp/old <commit>; python -m experiments bench step --baseline /tmp/old --dtypes float32

Each measurement is a process of its own pinned to one core, two at a time (one per core), as the sweeps train;
the rounds interleave the cases, and the README gives each case's median over its rounds. Every process runs with
run.py's allocator setting (rpr/malloc.py). ``--baseline DIR`` measures each case in another checkout too, at the
same time on the other core, and gives the ratios. Stop other work on the machine first: the numbers are rates.

One measurement (:func:`measure`) builds the config's task, model and optimizer as ``rpr.train`` does, compiles
the step for every batch shape the timed steps meet, then trains ``steps`` steps from the first batch on, host
batches included, and times them.

* FLOPs: XLA's cost analysis of each compiled step (``compiled.cost_analysis()["flops"]``), weighted by how
  often the timed steps met its batch shape. XLA:CPU does not rematerialise, so these are the model's FLOPs,
  forward and backward, plus the optimizer's.
* Peak: a ``jnp.dot`` of two ``[n, n]`` matrices in the same process, on the same core, in the step's dtype: the
  FLOP/s the machine reaches on the one operation a Transformer is made of.
* Memory: :func:`experiments.machine.peak_bytes` of the largest batch shape's step, and the process's peak RSS.
* Loss: the mean training loss of the last quarter of the timed steps (the same batches for every dtype).
"""


from __future__ import annotations

import collections
import dataclasses
import datetime
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

from absl import app
from absl import flags

from experiments import machine
from experiments import render
from rpr import malloc


@dataclasses.dataclass(frozen=True)
class Case:
  name: str  # e.g. "translation/shaw"
  config: str  # "<file>:<variant>", as run.py's --config
  dtype: str = "float32"  # model.dtype: the activations' (parameters stay float32)
  overrides: tuple = ()  # (dotted key, value) set on the config, e.g. (("model.dropout_rate", 0.0),)


CASES = tuple(Case(f"{task}/{pe}", f"configs/{task}.py:pe={pe}", dtype)
              for task in ("translation", "lm") for pe in ("shaw", "sinusoidal") for dtype in ("float32", "bfloat16"))


def load(case: Case):
  """The config ``case`` names, as run.py resolves ``--config=file:variant``, with ``model.dtype`` set."""
  from experiments import engine

  path, _, variant = case.config.partition(":")
  return engine.load_config(path, variant, {"model.dtype": case.dtype, **dict(case.overrides)})


def matmul_peak(n: int = 2048, dtype: str = "float32", repeats: int = 10) -> float:
  """FLOP/s of ``x @ y`` for two ``[n, n]`` matrices of ``dtype``: the best of ``repeats`` timed calls."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  x = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), dtype)
  dot = jax.jit(lambda a, b: a @ b)
  dot(x, x).block_until_ready()
  best = min(timeit.repeat(lambda: dot(x, x).block_until_ready(), repeat=repeats, number=1))
  return 2 * n ** 3 / best


def measure(case: Case, steps: int) -> dict:
  """Trains ``steps`` steps of ``case`` as ``rpr.train`` would and measures them (module docstring)."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from experiments import engine
  from rpr.sharding import host_batch, make_mesh

  config = load(case)
  mesh = make_mesh()
  task, model_config, model, (tx, schedule) = engine.task_and_model(
      config, tempfile.mkdtemp(prefix="bench_step_"), mesh.size)
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  first = task.train_batch(0, slice(0, 1))
  init_fn = functools.partial(engine.steps().init_state, model=model, tx=tx, input_length=first["inputs"].shape[1],
                              target_length=first["targets"].shape[1])
  init = jax.jit(init_fn, out_shardings=replicated)
  state = init(jax.random.PRNGKey(config.seed))
  step_fn = jax.jit(functools.partial(engine.steps().train_step, model=model, tx=tx, schedule=schedule,
                                      label_smoothing=config.label_smoothing),
                    in_shardings=(replicated, rows), out_shardings=(replicated, replicated), donate_argnums=0)
  batches = [host_batch(task, s, mesh) for s in range(steps)]
  shapes = collections.Counter(tuple(v.shape for v in b.values()) for b in batches)
  compiled, flops = {}, {}
  for b in batches:  # compile each batch shape once, before the clock starts
    shape = tuple(v.shape for v in b.values())
    if shape not in compiled:
      compiled[shape] = step_fn.lower(state, b).compile()
      flops[shape] = float(compiled[shape].cost_analysis()["flops"])
  warm = state
  for shape in compiled:  # one real call per shape: the first call of a compiled program allocates
    warm, _ = step_fn(warm, next(b for b in batches if tuple(v.shape for v in b.values()) == shape))
  jax.block_until_ready(warm)
  state = init(jax.random.PRNGKey(config.seed))  # the step donates its state: train from a fresh one
  losses, t0 = [], time.perf_counter()
  for s in range(steps):  # the host batch inside the clock, as in training
    state, m = step_fn(state, host_batch(task, s, mesh))
    losses.append(m)
  jax.block_until_ready(state)
  seconds = time.perf_counter() - t0
  losses = jax.device_get(losses)
  tail = losses[-max(steps // 4, 1):]
  loss = sum(float(m["loss_sum"]) for m in tail) / sum(float(m["weight_sum"]) for m in tail)
  step_flops = sum(flops[s] * n for s, n in shapes.items()) / steps
  peak = matmul_peak(dtype=case.dtype)
  largest = max(compiled, key=lambda s: flops[s])
  return {"case": dataclasses.asdict(case), "steps": steps, "seconds": seconds, "steps_per_sec": steps / seconds,
          "flops_per_step": step_flops, "flops_per_sec": step_flops * steps / seconds, "matmul_peak": peak,
          "fraction_of_peak": step_flops * steps / seconds / peak, "loss": loss,
          "shapes": {json.dumps(s): n for s, n in shapes.items()},
          "memory": machine.peak_bytes(compiled[largest]),
          "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ----------------------------------------------------------------------------
# The command: measurements in pinned processes, two at once, and the README.

FLAGS = flags.FLAGS
OUT = os.path.join("experiments", "results", "bench", "step")


def _one(case: Case, steps: int, core: int, root: str = machine.ROOT,
         tunables: str = malloc.TUNABLES) -> subprocess.Popen:
  """``case`` measured in a process pinned to ``core``, with the library (rpr, configs) of the checkout ``root``
  and this checkout's measuring code (so an older checkout, without it, can be measured the same way)."""
  here = os.path.abspath(__file__)
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
  by, rows = {}, []
  for r in records:
    by.setdefault((r["case"]["name"], r["case"]["dtype"]), []).append(r)
  for (name, dtype), rs in by.items():
    pairs = [(rs[i], rs[i + 1]) for i in range(0, len(rs) - 1, 2)]
    each = [(b if not b["baseline"] else a)["steps_per_sec"] / (a if a["baseline"] else b)["steps_per_sec"]
            for a, b in pairs]
    if each:
      rows.append([name, dtype, ", ".join(f"{x:.2f}" for x in each)])
  return render.markdown_table(["case", "dtype", "steps/s here / baseline, each round"], rows)


def table(records: list[dict]) -> str:
  """One row per case: the medians over its rounds (this checkout's records only)."""
  by = {}
  for r in (r for r in records if not r.get("baseline")):
    by.setdefault((r["case"]["name"], r["case"]["dtype"]), []).append(r)
  f32 = {name: statistics.median(x["loss"] for x in rs) for (name, dtype), rs in by.items() if dtype == "float32"}
  rows = []
  for (name, dtype), rs in by.items():
    med = lambda key: statistics.median(x[key] for x in rs)
    loss = med("loss")
    rows.append([name, dtype, f"{med('steps_per_sec'):.2f}", f"{med('flops_per_step') / 1e9:.2f}",
                 f"{med('flops_per_sec') / 1e9:.1f}", f"{med('matmul_peak') / 1e9:.1f}",
                 f"{med('fraction_of_peak'):.2f}", f"{statistics.median(x['memory']['peak'] for x in rs) / 1e6:.0f}",
                 f"{loss:.4f}", f"{loss - f32[name]:+.4f}" if name in f32 else "-"])
  return render.markdown_table(["case", "dtype", "steps/s", "GFLOP/step", "GFLOP/s", "matmul peak GFLOP/s",
                                "share of peak", "peak memory MB", "loss (last quarter)", "vs float32"], rows)


def write(data: dict, out: str) -> None:
  text = (f"# Training step\n\nMade by `{data['command']}` on {data['date']} ({data['machine']['cpu']}, "
          f"{data['machine']['cores']} cores), {data['steps']} steps a measurement, median of {data['rounds']} "
          "rounds, one process per core, two at once.\n\n" + table(data["records"]) + "\n")
  if data.get("baseline"):
    text += (f"\nAgainst the checkout {data['baseline']} (commit {data['baseline_commit']}, GLIBC_TUNABLES="
             f"'{data['baseline_glibc_tunables']}'), measured at the same time on the other core, cores swapped from "
             "round to round:\n\n" + ratios(data["records"]) + "\n")
  render.write_report(out, data, text)


def main(argv):
  del argv
  names = FLAGS.cases or sorted({c.name for c in CASES})
  cases = [c for c in CASES if c.name in names and c.dtype in FLAGS.dtypes]
  if not cases:
    raise app.UsageError(f"--cases {FLAGS.cases}: allowed: {sorted({c.name for c in CASES})}")
  records = run(cases, FLAGS.steps, FLAGS.rounds, [int(c) for c in FLAGS.cores], FLAGS.baseline,
                FLAGS.baseline_glibc_tunables)
  commit = lambda root: subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                                       text=True).stdout.strip()
  write({"command": machine.command(), "commit": commit(machine.ROOT),
         "baseline": FLAGS.baseline, "baseline_glibc_tunables": FLAGS.baseline_glibc_tunables,
         "baseline_commit": commit(FLAGS.baseline) if FLAGS.baseline else "",
         "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine.machine(),
         "steps": FLAGS.steps, "rounds": FLAGS.rounds, "records": records}, FLAGS.out)


def define_flags() -> None:
  """The ``bench step`` verb's flags."""
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
