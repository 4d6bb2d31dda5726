"""Attention cost per position scheme: the configurations, one jitted step each, and their timing.

Every scheme's attention (plain, Shaw a^K + a^V, Shaw a^K only, T5, RoPE,
ALiBi, and the materialising Shaw formulation of tensor2tensor,
:func:`rpr.attention.reference.shaw_attention_reference`) runs on random
projected queries, keys and values ``[batch, length, heads, head_dim]``,
through the dense path (:func:`rpr.attention.dot_product_attention`) and the
chunked path (:func:`rpr.attention.chunked_attention`), as one jitted
``value_and_grad`` of ``sum(attention(q, k, v) * g)`` with respect to q, k, v
and the scheme's parameters (:func:`make_step`). :func:`run_length` compiles
every configuration of one length, then times them in interleaved rounds (one
call of each per round, in a fresh random order), so that load from other
processes hits them alike; the ratios are medians of per-round ratios to plain
dense attention of the same round. Peak memory is
:func:`experiments.machine.peak_bytes`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from experiments import engine
from experiments import machine
from experiments.settings import knob
from rpr import attention as attn
from rpr.attention import positions

# (name, scheme, position options). Each runs dense and chunked; "plain/dense" is the reference of every ratio.
_SCHEMES = [
    ("plain", "none", {}),
    ("shaw", "shaw", {}),
    ("shaw_k", "shaw", {"use_values": False}),
    ("t5", "t5", {}),
    ("rope", "rope", {}),
    ("alibi", "alibi", {}),
]
# JAX's own attention, jax.nn.dot_product_attention, with each of its implementations: the plain-attention
# baseline of the platform (cuDNN's fused kernel runs on CUDA GPUs only; elsewhere it is reported as skipped).
JAX_NN = [("jax_nn", "none", {}, "jax_xla"), ("jax_nn", "none", {}, "jax_cudnn")]
CONFIGS = ([(*c, "dense") for c in _SCHEMES] + [("shaw_reference", "shaw", {}, "reference")]
           + [(*c, "chunked") for c in _SCHEMES] + JAX_NN)
LONG_CONFIGS = [c for c in CONFIGS if c[3] == "chunked" and c[0] in ("plain", "shaw", "t5")] + [
    c for c in CONFIGS if c[3] == "dense" and c[0] in ("plain", "shaw")]
RSS_CONFIGS = [c for c in CONFIGS if c[0] in ("plain", "shaw") and c[3] in ("dense", "chunked")]

DESCRIPTIONS = {
    "plain": "no position terms",
    "shaw": "Shaw a^K + a^V, k clipped, tables per head",
    "shaw_k": "Shaw a^K only",
    "t5": "T5 bucketed bias (32 buckets, max distance 128)",
    "rope": "rotary query/key",
    "alibi": "ALiBi linear bias",
    "shaw_reference": "Shaw, tables gathered into [b, h, q, k, d] (tensor2tensor-style)",
    "jax_nn": "jax.nn.dot_product_attention, no position terms (implementation: xla or cudnn)",
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """The benchmark's knobs (``python -m experiments bench attention``'s flags)."""
  quick: bool = knob(False, "smoke run: tiny shapes, two lengths, two rounds (QUICK)")
  lengths: tuple[int, ...] = knob((128, 256, 512, 1024, 2048, 4096), "sequence lengths (self-attention)")
  batch: int = knob(8, "rows per call")
  heads: int = knob(8, "attention heads")
  head_dim: int = knob(64, "width of a head")
  max_distance: int = knob(positions.defaults("shaw")["max_distance"], "Shaw's clipping distance k")
  block_q: int = knob(128, "chunked query block")
  block_k: int = knob(128, "chunked key block")
  repeats: int = knob(9, "timed interleaved rounds per length")
  min_sample_s: float = knob(0.3, "repeat short calls within one timed sample")
  min_repeats: int = knob(3, "rounds at lengths > 1024 (scaled down from --repeats)")
  warmup: int = knob(1, "untimed calls per configuration first")
  memory_budget_gb: float = knob(14.0, "run only configs whose estimate is below")
  long_length: int = knob(16384, "chunked self-attention length (batch 1); 0: off")
  long_repeats: int = knob(2, "rounds at the long length")
  rss_lengths: tuple[int, ...] = knob((), "lengths for the fresh-process RSS cross-check, e.g. 512,1024")
  model_step: bool = knob(False, "also time the base Transformer's training step")
  model_preset: str = knob("base", "rpr.model preset of the model step")
  model_batch: int = knob(8, "rows of the model step")
  model_length: int = knob(64, "source = target tokens of the model step")
  model_repeats: int = knob(5, "timed rounds of the model step")
  model_implementation: str = knob("dense", "attention_implementation (dense or chunked) of every attention layer, "
                                   "on both sides of the model-step ratio")


# --quick: tiny shapes, a short long-sequence run and one model-step round.
QUICK = dict(lengths=(64, 128), batch=2, heads=2, head_dim=16, repeats=2, long_length=1024, long_repeats=1,
             model_repeats=1, min_sample_s=0.05, model_preset="tiny", model_batch=2, model_length=16)


def shape(a: dict) -> str:
  """The attention shape of a recorded run's settings ``a``, as the report states it."""
  return f"batch {a['batch']}, {a['heads']} heads of {a['head_dim']}, Shaw k = {a['max_distance']}"


def label(config) -> str:
  return f"{config[0]}/{config[3]}"


def make_step(config, length: int, batch: int, s: Settings, seed: int = 0):
  """``(jitted value_and_grad, args)`` of ``sum(attention(q, k, v) * g)`` for one configuration."""
  name, scheme_name, overrides, implementation = config
  rng = np.random.default_rng(seed)
  shape = (batch, length, s.heads, s.head_dim)
  q, k, v, g = (jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(4))
  options = {"max_distance": s.max_distance, **overrides} if scheme_name == "shaw" else dict(overrides)
  scheme = positions.make(scheme_name, s.heads, s.head_dim, options=options)
  params = scheme.init(jax.random.PRNGKey(seed), q[:1, :2], k[:1, :2], method=scheme.terms)

  def attention(params, q, k, v):
    def body(module, q, k, v):
      terms = module.terms(q, k, 0)
      if implementation == "dense":
        return attn.dot_product_attention(terms.query, terms.key, v, bias=terms.bias(length, length),
                                          relative=terms.relative)
      if implementation in ("jax_xla", "jax_cudnn"):
        return jax.nn.dot_product_attention(terms.query, terms.key, v, implementation=implementation[4:])
      if implementation == "chunked":
        return attn.chunked_attention(terms.query, terms.key, v, relative=terms.relative, bias_fn=terms.bias_fn,
                                      block_q=s.block_q, block_k=s.block_k)
      from rpr.attention.reference import shaw_attention_reference
      rel = terms.relative
      return shaw_attention_reference(q, k, v, rel.key_table, rel.value_table)
    return scheme.apply(params, q, k, v, method=body)

  def loss(params, q, k, v):
    return jnp.sum(attention(params, q, k, v) * g)

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
  return step, (params, q, k, v)


def _compile_all(configs, length: int, s: Settings, batch: int) -> tuple[dict, dict]:
  """Compiles each configuration: ``(entries, runnable)``; over the memory budget, or failing, it is not run."""
  results, runnable = {}, {}
  for config in configs:
    entry = {"name": config[0], "implementation": config[3], "length": length, "batch": batch}
    results[label(config)] = entry
    if config[3] == "jax_cudnn" and jax.default_backend() != "gpu":
      entry["status"] = f"skipped (cuDNN needs a CUDA GPU; this is {jax.default_backend()})"
      print(f"  L={length} {label(config):24s} {entry['status']}", flush=True)
      continue
    try:
      step, step_args = make_step(config, length, batch, s)
      t0 = time.perf_counter()
      compiled = step.lower(*step_args).compile()
      entry["compile_s"] = time.perf_counter() - t0
      entry["memory"] = machine.peak_bytes(compiled)
    except Exception as e:  # a configuration that cannot be built is reported, not fatal
      entry["status"] = f"error: {type(e).__name__}: {e}"[:300]
      continue
    peak_gb = entry["memory"]["peak"] / machine.GB
    if peak_gb > s.memory_budget_gb:
      entry["status"] = f"skipped (est. {peak_gb:.1f} GB)"
    else:
      entry["status"] = "ok"
      runnable[label(config)] = (compiled, step_args)
    print(f"  L={length} {label(config):24s} est. {peak_gb:7.3f} GB  {entry['status']}", flush=True)
  return results, runnable


def run_length(configs, length: int, s: Settings, batch: int, repeats: int) -> dict:
  """Compiles every configuration at ``length``, then times the runnable ones in ``repeats`` interleaved rounds."""
  results, runnable = _compile_all(configs, length, s, batch)
  inner = {}
  for key, (compiled, step_args) in runnable.items():  # warm-up; calls per sample so that a sample lasts
    for _ in range(max(s.warmup, 1)):                  # >= min_sample_s (short calls are noisy alone)
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(*step_args))
      once = time.perf_counter() - t0
    inner[key] = max(1, int(np.ceil(s.min_sample_s / max(once, 1e-6))))
    results[key]["calls_per_sample"] = inner[key]
  if length > 1024:  # fewer rounds where one call takes seconds to minutes
    repeats = max(s.min_repeats, min(repeats, round(repeats * (1024 / length) ** 2)))
  calls = {key: lambda c=compiled, a=step_args: jax.block_until_ready(c(*a)) for key, (compiled, step_args)
           in runnable.items()}
  wall, cpu = interleaved(calls, repeats, length, inner)
  for key in runnable:
    results[key].update(wall_s=wall[key], cpu_s=cpu[key], wall_median_s=statistics.median(wall[key]),
                        cpu_median_s=statistics.median(cpu[key]))
  add_ratios(results, "plain/dense", "vs_plain_dense")
  for impl in ("dense", "chunked"):
    for key, entry in results.items():
      if entry["implementation"] == impl:
        add_ratios({key: entry, f"plain/{impl}": results.get(f"plain/{impl}", {})}, f"plain/{impl}",
                   "vs_plain_same_impl")
  return results


def interleaved(calls: dict, rounds: int, seed: int, inner: Optional[dict] = None) -> tuple[dict, dict]:
  """Wall and CPU seconds per call of each of ``calls`` (key -> a call that blocks until its result is ready), a
  list of ``rounds`` samples each: every round times each call once (``inner[key]`` calls a sample), in a fresh
  random order from ``seed``, so that no call always follows the same one (e.g. the materialising baseline, whose
  freed gigabytes the next call would fault back in) and load from other processes hits them alike."""
  wall, cpu, order_rng = {k: [] for k in calls}, {k: [] for k in calls}, np.random.default_rng(seed)
  for _ in range(rounds):
    for key in order_rng.permutation(list(calls)):
      n = (inner or {}).get(key, 1)
      w0, c0 = time.perf_counter(), time.process_time()
      for _ in range(n):
        calls[key]()
      wall[key].append((time.perf_counter() - w0) / n)
      cpu[key].append((time.process_time() - c0) / n)
  return wall, cpu


def add_ratios(results: dict, reference: str, field: str) -> None:
  """Per-round time ratios (median) and memory ratio of each entry to ``reference``, as ``entry[field]``."""
  ref = results.get(reference) or {}
  for entry in results.values():
    ratios = {}
    if "memory" in entry and "memory" in ref:
      ratios["memory"] = entry["memory"]["peak"] / ref["memory"]["peak"]
    for clock in ("wall", "cpu"):
      mine, theirs = entry.get(f"{clock}_s"), ref.get(f"{clock}_s")
      if mine and theirs and len(mine) == len(theirs):
        ratios[f"time_{clock}"] = statistics.median(a / b for a, b in zip(mine, theirs))
    if ratios:
      entry[field] = ratios


# ----------------------------------------------------------------------------
# Cross-check: peak RSS of one call in a fresh process.


def _rss_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  return 0


def child_rss(name: str, implementation: str, length: int, batch: int, s: Settings) -> dict:
  """The RSS growth of one call of a configuration, measured in this (fresh) process."""
  config = next(c for c in CONFIGS if c[0] == name and c[3] == implementation)
  step, step_args = make_step(config, length, batch, s)
  compiled = step.lower(*step_args).compile()
  jax.block_until_ready(step_args)
  with open("/proc/self/clear_refs", "w") as f:  # reset the high-water mark (Linux): measure the call only
    f.write("5")
  before = _rss_kb("VmRSS")
  jax.block_until_ready(compiled(*step_args))
  return {"rss_before_kb": before, "rss_peak_kb": _rss_kb("VmHWM"),
          "rss_growth_bytes": (_rss_kb("VmHWM") - before) * 1024}


def rss_check(configs, length: int, batch: int, s: Settings) -> dict:
  """Per configuration, :func:`child_rss` in a fresh ``python -m experiments bench attention --rss_child`` process."""
  out = {}
  shape = [f"--heads={s.heads}", f"--head_dim={s.head_dim}", f"--max_distance={s.max_distance}",
           f"--block_q={s.block_q}", f"--block_k={s.block_k}"]
  for config in configs:
    cmd = [sys.executable, "-m", "experiments", "bench", "attention",
           f"--rss_child={config[0]},{config[3]},{length},{batch}", *shape]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=machine.ROOT)
    try:
      out[label(config)] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
      out[label(config)] = {"error": proc.stderr[-300:]}
    print(f"  rss L={length} {label(config):24s} {out[label(config)]}", flush=True)
  return out


# ----------------------------------------------------------------------------
# The base Transformer's training step, relative vs absolute positions.


def model_step(s: Settings) -> dict:
  """Time of one training step of the ``model_preset`` model with Shaw positions over the same with sinusoidal ones.

  Rounds interleave the two steps in a fresh random order; the ratio is the median of per-round ratios. An error
  is reported in ``status``, not raised.
  """
  try:
    import optax

    rng = np.random.default_rng(0)
    batch = {"inputs": jnp.asarray(rng.integers(3, 1000, (s.model_batch, s.model_length)), jnp.int32),
             "targets": jnp.asarray(rng.integers(3, 1000, (s.model_batch, s.model_length)), jnp.int32)}
    steps, out = {}, {"batch": s.model_batch, "length": s.model_length, "preset": s.model_preset,
                      "implementation": s.model_implementation}
    for position in ("sinusoidal", "shaw"):
      model = engine.preset_model(s.model_preset, position=position, max_length=max(256, s.model_length),
                                  attention_implementation=s.model_implementation)
      tx = optax.adam(1e-4)
      state = engine.steps().init_state(jax.random.PRNGKey(0), model, tx, s.model_length, s.model_length)
      step = jax.jit(lambda st, b, model=model, tx=tx: engine.steps().train_step(
          st, b, model=model, tx=tx, schedule=lambda i: 1e-4, label_smoothing=0.1))
      compiled = step.lower(state, batch).compile()
      out[f"{position}_memory"] = machine.peak_bytes(compiled)
      steps[position] = (compiled, state)
    calls = {p: lambda c=compiled, st=state: jax.block_until_ready(c(st, batch)) for p, (compiled, state)
             in steps.items()}
    for call in calls.values():  # warm-up
      call()
    times, _ = interleaved(calls, s.model_repeats, s.model_length)  # as the attention configs are timed
    out.update({f"{p}_wall_s": t for p, t in times.items()})
    ratios = [a / b for a, b in zip(times["shaw"], times["sinusoidal"])]
    out["ratio_wall"] = statistics.median(ratios)
    if len(ratios) >= 2:
      quartiles = statistics.quantiles(ratios, n=4)
      out["ratio_wall_quartiles"] = [quartiles[0], quartiles[2]]
    out["ratio_memory"] = out["shaw_memory"]["peak"] / out["sinusoidal_memory"]["peak"]
    out["status"] = "ok"
    return out
  except Exception as e:  # pylint: disable=broad-except  (reported in the README, like a failed configuration)
    return {"status": f"error: {type(e).__name__}: {e}"[:300]}
