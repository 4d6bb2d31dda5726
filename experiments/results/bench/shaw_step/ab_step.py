"""Shaw against sinusoidal training steps of one config, in one process, interleaved: the ratio of step times.

    PYTHONPATH=<checkout> GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647 \
        taskset -c 0 .venv/bin/python experiments/results/bench/shaw_step/ab_step.py translation 60 8 [out.json]

Builds both steps as ``experiments/bench/step.py``'s ``measure`` does (the config's real batches, donation, the
allocator setting), compiles every batch shape, then runs ``rounds`` rounds; each round trains ``steps`` steps of
one scheme then the same ``steps`` batches of the other, in a fresh random order each round. A round's ratio is
Shaw's time over sinusoidal's for the same batches at (nearly) the same time; the median over rounds is reported.
The checkout measured is the one on PYTHONPATH (the library), this file being standalone.
"""
import functools
import json
import statistics
import sys
import tempfile
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P


def build(task_name, pe, steps):
  from experiments import engine
  from rpr.sharding import host_batch, make_mesh

  config = engine.load_config(f"configs/{task_name}.py", f"pe={pe}", {"model.dtype": "float32"})
  mesh = make_mesh()
  task, _, model, (tx, schedule) = engine.task_and_model(config, tempfile.mkdtemp(prefix="ab_"), mesh.size)
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  first = task.train_batch(0, slice(0, 1))
  init = jax.jit(functools.partial(engine.init_state, model=model, tx=tx, input_length=first["inputs"].shape[1],
                                   target_length=first["targets"].shape[1]), out_shardings=replicated)
  step = jax.jit(functools.partial(engine.train_step, model=model, tx=tx, schedule=schedule,
                                   label_smoothing=config.label_smoothing),
                 in_shardings=(replicated, rows), out_shardings=(replicated, replicated), donate_argnums=0)
  batches = [host_batch(task, s, mesh) for s in range(steps)]
  state = init(jax.random.PRNGKey(config.seed))
  for b in batches:  # compile and warm every shape
    state, _ = step(state, b)
  jax.block_until_ready(state)
  return {"state": state, "step": step, "batches": batches}


def run(built, steps):
  state, step = built["state"], built["step"]
  t0 = time.perf_counter()
  for b in built["batches"][:steps]:
    state, _ = step(state, b)
  jax.block_until_ready(state)
  built["state"] = state
  return time.perf_counter() - t0


def main(task_name, steps, rounds, out=""):
  steps, rounds = int(steps), int(rounds)
  built = {pe: build(task_name, pe, steps) for pe in ("shaw", "sinusoidal")}
  order = np.random.default_rng(0)
  times = {pe: [] for pe in built}
  for _ in range(rounds):
    for pe in order.permutation(list(built)):
      times[pe].append(run(built[pe], steps))
  ratios = [a / b for a, b in zip(times["shaw"], times["sinusoidal"])]
  q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
  result = {"task": task_name, "steps": steps, "rounds": rounds, "shaw_s": times["shaw"],
            "sinusoidal_s": times["sinusoidal"], "ratios": ratios, "ratio_median": statistics.median(ratios),
            "ratio_quartiles": [q[0], q[2]], "argv": sys.argv}
  print(f"{task_name}: Shaw/sinusoidal step time median {result['ratio_median']:.3f} (quartiles {q[0]:.3f}-{q[2]:.3f},"
        f" {rounds} rounds of {steps} steps; medians {statistics.median(times['shaw']) / steps * 1e3:.1f} vs "
        f"{statistics.median(times['sinusoidal']) / steps * 1e3:.1f} ms a step)", flush=True)
  if out:
    with open(out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main(*sys.argv[1:])
