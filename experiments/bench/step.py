"""The training step of a real config, measured as training runs it: steps a second, model FLOPs, their share of
the machine's matmul peak, peak memory, and the loss it reaches.

One measurement (:func:`measure`) runs in a process of its own, pinned to one core as the sweeps' runs are:
it builds the config's task, model and optimizer as ``rpr.train`` does, compiles the step for every batch shape
the timed steps meet, then trains ``steps`` steps from the first batch on, host batches included, and times them.

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
import functools
import importlib
import json
import resource
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import machine


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
  path, _, variant = case.config.partition(":")
  module = importlib.import_module("configs." + path.removeprefix("configs/").removesuffix(".py"))
  config = module.get_config(variant)
  config.model.dtype = case.dtype
  for key, value in case.overrides:
    *parents, leaf = key.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


def matmul_peak(n: int = 2048, dtype: str = "float32", repeats: int = 10) -> float:
  """FLOP/s of ``x @ y`` for two ``[n, n]`` matrices of ``dtype``: the best of ``repeats`` timed calls."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), dtype)
  dot = jax.jit(lambda a, b: a @ b)
  dot(x, x).block_until_ready()
  best = min(_timed(lambda: dot(x, x).block_until_ready()) for _ in range(repeats))
  return 2 * n ** 3 / best


def _timed(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def measure(case: Case, steps: int) -> dict:
  """Trains ``steps`` steps of ``case`` as ``rpr.train`` would and measures them (module docstring)."""
  from rpr import config as config_lib, data, optim
  from rpr.model import build
  from rpr.sharding import host_batch, make_mesh
  from rpr.steps import init_state, train_step
  from jax.sharding import NamedSharding, PartitionSpec as P

  mesh = make_mesh()
  config = config_lib.parse(load(case), num_devices=mesh.size)
  task = data.get_task(config.data, tempfile.mkdtemp(prefix="bench_step_"), mesh.size)
  model_config = config.model.replace(vocab_size=task.vocab.size)
  model = build(model_config)
  tx, schedule = optim.make_optimizer(config.optim, model_config.d_model, config.budget.num_train_steps)
  replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  first = task.train_batch(0, slice(0, 1))
  init_fn = functools.partial(init_state, model=model, tx=tx, input_length=first["inputs"].shape[1],
                              target_length=first["targets"].shape[1])
  init = jax.jit(init_fn, out_shardings=replicated)
  state = init(jax.random.PRNGKey(config.data.seed))
  step_fn = jax.jit(functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                                      label_smoothing=config.optim.label_smoothing),
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
  state = init(jax.random.PRNGKey(config.data.seed))  # the step donates its state: train from a fresh one
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
