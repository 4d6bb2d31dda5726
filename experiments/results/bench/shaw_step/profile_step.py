"""Per-op XLA:CPU times of a training step (translation / LM default configs), from a jax.profiler trace.

    PYTHONPATH=. GLIBC_TUNABLES=... taskset -c 0 .venv/bin/python experiments/results/bench/shaw_step/profile_step.py \
        translation/shaw 30 /tmp/prof_ts

Builds the step as ``experiments/bench/step.py``'s ``measure`` does (same config, batches, donation), traces
``steps`` steps after warm-up, and prints the trace's XLA op events summed by name (ms a step), largest first,
with the HLO of the step's largest batch shape written beside the trace (``<out>/step.hlo.txt``).
"""
import collections
import functools
import glob
import gzip
import json
import os
import sys
import tempfile

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, os.getcwd())
from experiments import engine  # noqa: E402
from experiments.bench import step as bench_step  # noqa: E402
from rpr.sharding import host_batch, make_mesh  # noqa: E402


def hlo_ops(text):
  """``name -> (shape, op_name, sources)`` of every instruction; a fusion's sources include its body's."""
  from experiments.bench import hlo
  frames = hlo._stack_frames(text)
  bodies, ops, computation = {}, {}, None
  for line in text.splitlines():
    c = hlo._COMPUTATION.match(line)
    if c:
      computation = c.group(1)
      continue
    m = hlo._INSTRUCTION.match(line)
    if not m:
      continue
    op, frame = hlo._OP_NAME.search(line), hlo._FRAME.search(line)
    src = frames.get(int(frame.group(1)), "") if frame else ""
    bodies.setdefault(computation, set()).add(src)
    calls = hlo._FUSION_CALL.search(line)
    ops[m.group(1)] = [f"{m.group(2)}[{m.group(3)}]", op.group(1) if op else "", {src}, calls.group(1) if calls else None]
  for name, o in ops.items():
    if o[3]:
      o[2] |= bodies.get(o[3], set())
    o[2].discard("")
  return ops


def main(case_name, steps, out, dtype="float32", shape_index="0"):
  case = next(c for c in bench_step.CASES if c.name == case_name and c.dtype == dtype)
  config = bench_step.load(case)
  mesh = make_mesh()
  task, _, model, (tx, schedule) = engine.task_and_model(config, tempfile.mkdtemp(prefix="prof_"), mesh.size)
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  first = task.train_batch(0, slice(0, 1))
  init = jax.jit(functools.partial(engine.init_state, model=model, tx=tx, input_length=first["inputs"].shape[1],
                                   target_length=first["targets"].shape[1]), out_shardings=replicated)
  state = init(jax.random.PRNGKey(config.seed))
  step_fn = jax.jit(functools.partial(engine.train_step, model=model, tx=tx, schedule=schedule,
                                      label_smoothing=config.label_smoothing),
                    in_shardings=(replicated, rows), out_shardings=(replicated, replicated), donate_argnums=0)
  batches = [host_batch(task, s, mesh) for s in range(steps)]
  shapes = collections.Counter(tuple(v.shape for v in b.values()) for b in batches)
  print("shapes", dict(shapes))
  # One batch shape (the shape_index-th most common), every step on it: op names then map to one module.
  chosen = shapes.most_common()[int(shape_index)][0]
  print("profiled shape", chosen)
  os.makedirs(out, exist_ok=True)
  b0 = next(b for b in batches if tuple(v.shape for v in b.values()) == chosen)
  batches = [b0] * steps
  text = step_fn.lower(state, b0).compile().as_text()
  with open(os.path.join(out, "step.hlo.txt"), "w") as f:
    f.write(text)
  ops = hlo_ops(text)
  for b in batches:  # warm every shape
    state, _ = step_fn(state, b)
  jax.block_until_ready(state)
  with jax.profiler.trace(out):
    for b in batches:
      state, _ = step_fn(state, b)
    jax.block_until_ready(state)
  path = sorted(glob.glob(os.path.join(out, "**", "*.trace.json.gz"), recursive=True))[-1]
  events = json.load(gzip.open(path))["traceEvents"]
  totals, counts = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") != "X":
      continue
    name = e.get("name", "")
    args = e.get("args", {})
    if "hlo_op" in args or "long_name" in args or name.startswith(("fusion", "dot", "convolution", "copy")) or \
        "hlo_module" in args:
      totals[name] += e["dur"] / 1000
      counts[name] += 1
  total = sum(totals.values())
  print(f"{case_name}: summed op events {total / steps:.1f} ms a step")
  groups = collections.Counter()
  for name, ms in totals.items():
    shape, op_name, sources, _ = ops.get(name, ["?", "?", set(), None])
    key = "other"
    if any("relative.py" in x for x in sources):
      key = "shaw maps (relative.py)"
    elif "position" in op_name or any("positions.py" in x for x in sources):
      key = "position scheme (positions.py)"
    elif "attention" in op_name.lower() or any("attention/" in x for x in sources):
      key = "attention (other)"
    groups[key] += ms
  for key, ms in groups.most_common():
    print(f"  group {key:32s} {ms / steps:7.2f} ms")
  for name, ms in totals.most_common(int(os.environ.get("TOP", "60"))):
    shape, op_name, sources, _ = ops.get(name, ["?", "?", set(), None])
    print(f"  {ms / steps:7.2f} ms  x{counts[name] / steps:4.1f}  {name:28s} {shape:22s} "
          f"{op_name.replace('jit(train_step)/', '')[-90:]}  {sorted(sources)[:3]}")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:])
