"""Attention cost per position scheme: forward + backward time and peak memory, as ratios to plain attention.

Every scheme's attention (plain, Shaw a^K + a^V, Shaw a^K only, T5, RoPE,
ALiBi, and the materialising Shaw formulation of tensor2tensor,
:func:`rpr.reference.shaw_attention_reference`) is run on random projected
queries, keys and values ``[batch, length, heads, head_dim]``, through the
dense path (:func:`rpr.attention.dot_product_attention`) and the chunked
path (:func:`rpr.chunked.chunked_attention`), as one jitted
``value_and_grad`` of ``sum(attention(q, k, v) * g)`` with respect to q, k,
v and the scheme's parameters. All configurations of one length are compiled,
warmed up, then timed in interleaved rounds (one call of each per round), so
that load from other processes hits them alike; the ratios are medians of
per-round ratios to plain dense attention of the same round.

Peak memory is XLA's compiled estimate, ``memory_analysis()`` of the
executable: temp + argument + output bytes (the buffers live at once when the
step runs). Configurations whose estimate exceeds ``--memory_budget_gb`` are
compiled for the estimate but not run. ``--rss`` cross-checks the estimate
with the peak resident set size of a fresh process running one call.

    python -m experiments.bench_attention                 # full run (~1 h on 2 CPU cores)
    python -m experiments.bench_attention --quick         # smoke run (~1 min)

Writes ``results.json`` and ``README.md`` to ``--out`` (default
``experiments/results/bench``, or ``.../bench/quick`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from rpr import attention as attn
from rpr.attention import positions
from rpr.attention.chunked import chunked_attention

GB = 1e9

# (name, scheme, position options, implementation). "plain/dense" is the reference of every ratio.
_SCHEMES = [
    ("plain", "none", {}),
    ("shaw", "shaw", {}),
    ("shaw_k", "shaw", {"use_values": False}),
    ("t5", "t5", {}),
    ("rope", "rope", {}),
    ("alibi", "alibi", {}),
]
CONFIGS = ([(*c, "dense") for c in _SCHEMES] + [("shaw_reference", "shaw", {}, "reference")]
           + [(*c, "chunked") for c in _SCHEMES])
LONG_CONFIGS = [c for c in CONFIGS if c[3] == "chunked" and c[0] in ("plain", "shaw", "t5")] + [
    c for c in CONFIGS if c[3] == "dense" and c[0] in ("plain", "shaw")]

DESCRIPTIONS = {
    "plain": "no position terms",
    "shaw": "Shaw a^K + a^V, k clipped, tables per head",
    "shaw_k": "Shaw a^K only",
    "t5": "T5 bucketed bias (32 buckets, max distance 128)",
    "rope": "rotary query/key",
    "alibi": "ALiBi linear bias",
    "shaw_reference": "Shaw, tables gathered into [b, h, q, k, d] (tensor2tensor-style)",
}


def label(config) -> str:
  return f"{config[0]}/{config[3]}"


# ----------------------------------------------------------------------------
# One configuration: a jitted forward + backward step and its arguments.


def make_step(config, length: int, batch: int, heads: int, head_dim: int, max_distance: int,
              block_q: int, block_k: int, seed: int = 0):
  """``(jitted value_and_grad, args)`` of ``sum(attention(q, k, v) * g)`` for one configuration."""
  name, scheme_name, overrides, implementation = config
  rng = np.random.default_rng(seed)
  shape = (batch, length, heads, head_dim)
  q, k, v, g = (jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(4))
  options = {"max_distance": max_distance, **overrides} if scheme_name == "shaw" else dict(overrides)
  scheme = positions.make(scheme_name, heads, head_dim, options=options)
  params = scheme.init(jax.random.PRNGKey(seed), q[:1, :2], k[:1, :2], method=scheme.terms)

  def attention(params, q, k, v):
    def body(module, q, k, v):
      terms = module.terms(q, k, 0)
      if implementation == "dense":
        return attn.dot_product_attention(terms.query, terms.key, v, bias=terms.bias(length, length),
                                          relative=terms.relative)
      if implementation == "chunked":
        return chunked_attention(terms.query, terms.key, v, relative=terms.relative, bias_fn=terms.bias_fn,
                                 block_q=block_q, block_k=block_k)
      from rpr.attention.reference import shaw_attention_reference
      rel = terms.relative
      return shaw_attention_reference(q, k, v, rel.key_table, rel.value_table, rel.max_distance)
    return scheme.apply(params, q, k, v, method=body)

  def loss(params, q, k, v):
    return jnp.sum(attention(params, q, k, v) * g)

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
  return step, (params, q, k, v)


def memory_estimate(compiled) -> dict:
  m = compiled.memory_analysis()
  out = {key: int(getattr(m, f"{key}_size_in_bytes")) for key in ("temp", "argument", "output", "alias")}
  out["peak"] = out["temp"] + out["argument"] + out["output"]
  return out


def run_length(configs, length: int, args, batch: int) -> dict:
  """Compiles every configuration at ``length``, then times the runnable ones in interleaved rounds."""
  results, runnable = {}, {}
  for config in configs:
    entry = {"name": config[0], "implementation": config[3], "length": length, "batch": batch}
    try:
      step, step_args = make_step(config, length, batch, args.heads, args.head_dim, args.max_distance,
                                  args.block_q, args.block_k)
      t0 = time.perf_counter()
      compiled = step.lower(*step_args).compile()
      entry["compile_s"] = time.perf_counter() - t0
      entry["memory"] = memory_estimate(compiled)
    except Exception as e:  # a configuration that cannot be built is reported, not fatal
      entry["status"] = f"error: {type(e).__name__}: {e}"[:300]
      results[label(config)] = entry
      continue
    peak_gb = entry["memory"]["peak"] / GB
    if peak_gb > args.memory_budget_gb:
      entry["status"] = f"skipped (est. {peak_gb:.1f} GB)"
    else:
      entry["status"] = "ok"
      runnable[label(config)] = (compiled, step_args)
    results[label(config)] = entry
    print(f"  L={length} {label(config):24s} est. {peak_gb:7.3f} GB  {entry['status']}", flush=True)

  wall = {k: [] for k in runnable}
  cpu = {k: [] for k in runnable}
  inner = {}
  for key, (compiled, step_args) in runnable.items():  # warm-up; calls per sample so that a sample lasts
    for _ in range(max(args.warmup, 1)):               # >= --min_sample_s (short calls are noisy alone)
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(*step_args))
      once = time.perf_counter() - t0
    inner[key] = max(1, int(np.ceil(args.min_sample_s / max(once, 1e-6))))
    results[key]["calls_per_sample"] = inner[key]
  repeats = args.repeats
  if length > 1024:  # fewer rounds where one call takes seconds to minutes
    repeats = max(args.min_repeats, min(args.repeats, round(args.repeats * (1024 / length) ** 2)))
  order_rng = np.random.default_rng(length)
  for _ in range(repeats):
    # A fresh random order each round: no configuration always follows the same
    # one (e.g. the materialising baseline, whose freed gigabytes the next call
    # would fault back in).
    for key in order_rng.permutation(list(runnable)):
      compiled, step_args = runnable[key]
      w0, c0 = time.perf_counter(), time.process_time()
      for _ in range(inner[key]):
        jax.block_until_ready(compiled(*step_args))
      wall[key].append((time.perf_counter() - w0) / inner[key])
      cpu[key].append((time.process_time() - c0) / inner[key])
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


def add_ratios(results: dict, reference: str, field: str) -> None:
  """Per-round time ratios (median) and memory ratio of each entry to ``reference``."""
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


def child_rss(argv) -> None:
  """``--_child name implementation length batch``: prints JSON with the RSS growth of one call."""
  name, implementation, length, batch = argv[0], argv[1], int(argv[2]), int(argv[3])
  config = next(c for c in CONFIGS if c[0] == name and c[3] == implementation)
  args = parse_args(argv[4:])
  step, step_args = make_step(config, length, batch, args.heads, args.head_dim, args.max_distance, args.block_q,
                              args.block_k)
  compiled = step.lower(*step_args).compile()
  jax.block_until_ready(step_args)
  with open("/proc/self/clear_refs", "w") as f:  # reset the high-water mark (Linux): measure the call only
    f.write("5")
  before = _rss_kb("VmRSS")
  jax.block_until_ready(compiled(*step_args))
  print(json.dumps({"rss_before_kb": before, "rss_peak_kb": _rss_kb("VmHWM"),
                    "rss_growth_bytes": (_rss_kb("VmHWM") - before) * 1024}))


def rss_check(configs, length: int, batch: int, args, forwarded) -> dict:
  out = {}
  for config in configs:
    cmd = [sys.executable, "-m", "experiments.bench_attention", "--_child", config[0], config[3], str(length),
           str(batch)] + forwarded
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    try:
      out[label(config)] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
      out[label(config)] = {"error": proc.stderr[-300:]}
    print(f"  rss L={length} {label(config):24s} {out[label(config)]}", flush=True)
  return out


# ----------------------------------------------------------------------------
# Hook: the base Transformer's training step, relative vs absolute positions.


def bench_model_step(args) -> dict:
  """Time of one base-model training step with Shaw positions over the same step with sinusoidal ones.

  Needs :mod:`rpr.model` and :mod:`rpr.train` (another part of the project);
  skipped, and reported as such, when they are missing or their API differs.
  """
  if importlib.util.find_spec("rpr.model") is None or importlib.util.find_spec("rpr.train") is None:
    return {"status": "skipped: rpr.model / rpr.train not available"}
  try:
    import optax

    from rpr import model as model_lib
    from rpr import train as train_lib

    rng = np.random.default_rng(0)
    batch = {"inputs": jnp.asarray(rng.integers(3, 1000, (args.model_batch, args.model_length)), jnp.int32),
             "targets": jnp.asarray(rng.integers(3, 1000, (args.model_batch, args.model_length)), jnp.int32)}
    steps, out = {}, {"batch": args.model_batch, "length": args.model_length, "preset": args.model_preset,
                      "implementation": args.model_implementation}
    for position in ("sinusoidal", "shaw"):
      config = model_lib.preset(args.model_preset, position=position,
                                max_length=max(256, args.model_length),
                                attention_implementation=args.model_implementation)
      model = model_lib.Transformer(config)
      tx = optax.adam(1e-4)
      state = train_lib.init_state(jax.random.PRNGKey(0), model, tx, args.model_length, args.model_length)
      step = jax.jit(lambda s, b, model=model, tx=tx: train_lib.train_step(
          s, b, model=model, tx=tx, schedule=lambda i: 1e-4, label_smoothing=0.1))
      compiled = step.lower(state, batch).compile()
      out[f"{position}_memory"] = memory_estimate(compiled)
      steps[position] = (compiled, state)
    times = {p: [] for p in steps}
    for p, (compiled, state) in steps.items():
      jax.block_until_ready(compiled(state, batch))
    order_rng = np.random.default_rng(args.model_length)
    for _ in range(args.model_repeats):
      for p in order_rng.permutation(list(steps)):  # a fresh order each round, as for the attention configs
        compiled, state = steps[p]
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(state, batch))
        times[p].append(time.perf_counter() - t0)
    out.update({f"{p}_wall_s": t for p, t in times.items()})
    ratios = [a / b for a, b in zip(times["shaw"], times["sinusoidal"])]
    out["ratio_wall"] = statistics.median(ratios)
    if len(ratios) >= 2:
      quartiles = statistics.quantiles(ratios, n=4)
      out["ratio_wall_quartiles"] = [quartiles[0], quartiles[2]]
    out["ratio_memory"] = out["shaw_memory"]["peak"] / out["sinusoidal_memory"]["peak"]
    out["status"] = "ok"
    return out
  except Exception as e:
    return {"status": f"error: {type(e).__name__}: {e}"[:300]}


# ----------------------------------------------------------------------------
# Report.


def machine() -> dict:
  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  import flax
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
  return {"cpu": cpu, "cores": os.cpu_count(), "jax": jax.__version__, "jaxlib": jax.lib.__version__,
          "flax": flax.__version__, "python": platform.python_version(), "devices": [str(d) for d in jax.devices()],
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "git_commit": commit.strip(),
          "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 1)}


def fmt_ratio(entry: dict, field: str, clock: str) -> str:
  status = entry.get("status", "")
  if status.startswith("skipped") or status.startswith("error"):
    mem = entry.get(field, {}).get("memory")
    return status if mem is None else f"{status}; mem {mem:.2f}x"
  r = entry.get(field, {})
  t, m = r.get(f"time_{clock}"), r.get("memory")
  if m is None:
    return "-"
  return f"{t:.2f}x / {m:.2f}x" if t is not None else f"- / {m:.3f}x (reference not run)"


def write_report(data: dict, out_dir: str) -> None:
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(data, f, indent=1)
  lengths = sorted(data["lengths"], key=int)
  keys = [label(c) for c in CONFIGS]
  a = data["args"]
  lines = [
      "# Attention cost per position scheme", "",
      f"Forward + backward of `sum(attention(q, k, v) * g)` (gradients for q, k, v and the scheme's parameters), "
      f"batch {a['batch']}, {a['heads']} heads of {a['head_dim']}, Shaw k = {a['max_distance']}, "
      f"self-attention without masks, float32, chunked blocks {a['block_q']} x {a['block_k']}.", "",
      f"Command: `{data['command']}`  ", f"Date: {data['date']}  ",
      "Machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items() if k != "devices") + "  ",
      f"Load average (1 min) at start / end: {data['load_start']} / {data.get('load_end', '-')} "
      "(other processes shared the 2 cores; hence interleaved rounds and per-round ratios).", "",
      "Cells: **time ratio / peak-memory ratio** to plain dense attention at the same length. Time = median over "
      f"{a['repeats']} rounds ({a['min_repeats']} above L=1024), each timing every config once in a fresh "
      "random order, of (this config's wall time / plain dense's wall time in the same round); a sample repeats "
      f"short calls to last >= {a['min_sample_s']} s; all after warm-up. Peak memory = XLA's compiled estimate `memory_analysis()`: temp + argument + output bytes. "
      "'skipped (est. N GB)': the estimate exceeded the memory budget, so it was compiled but not run.", "",
  ]

  def table(field: str, clock: str, title: str, note: str):
    lines.extend([f"## {title}", "", note, "", "| scheme / implementation | " + " | ".join(f"L={n}" for n in lengths) + " |",
                  "| --- |" + " --- |" * len(lengths)])
    for key in keys:
      cells = [fmt_ratio(data["lengths"][n].get(key, {}), field, clock) for n in lengths]
      lines.append(f"| {key} ({DESCRIPTIONS[key.split('/')[0]]}) | " + " | ".join(cells) + " |")
    lines.append("")

  if lengths:  # a model-step-only run (--lengths "") has no attention tables
    table("vs_plain_dense", "wall", "Ratios to plain dense attention (wall time)", "")
    table("vs_plain_dense", "cpu", "Ratios to plain dense attention (process CPU time)",
          "CPU time of this process (all XLA threads): less sensitive to other processes than wall time.")
    table("vs_plain_same_impl", "wall", "Ratios to plain attention of the same implementation (wall time)",
          "Chunked rows divided by plain chunked: the intrinsic cost of each scheme inside the chunked kernel.")

    lines.extend(["## Absolute numbers", "", "| scheme / implementation | " +
                  " | ".join(f"L={n}" for n in lengths) + " |", "| --- |" + " --- |" * len(lengths)])
    for key in keys:
      cells = []
      for n in lengths:
        e = data["lengths"][n].get(key, {})
        mem = e.get("memory", {}).get("peak")
        t = e.get("wall_median_s")
        if t:
          cells.append(f"{t * 1e3:.0f} ms, {mem / GB:.3f} GB")
        else:
          cells.append(e.get("status", "-"))
      lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append("")

  if data.get("long"):
    lg = data["long"]
    lines.extend([f"## Long sequences: L = {lg['length']}, batch {lg['batch']}", "",
                  "| scheme / implementation | status | wall time (median) | peak memory (est.) |",
                  "| --- | --- | --- | --- |"])
    for key, e in lg["results"].items():
      t = e.get("wall_median_s")
      mem = e.get("memory", {}).get("peak")
      lines.append(f"| {key} | {e.get('status')} | {f'{t:.1f} s' if t else '-'} | "
                   f"{f'{mem / GB:.2f} GB' if mem else '-'} |")
    lines.append("")

  if data.get("rss"):
    lines.extend(["## Cross-check: resident memory of one call in a fresh process", "",
                  "Growth of the resident set (VmHWM after the call minus VmRSS before it; inputs and executable "
                  "already resident) against XLA's temp + output estimate.", "",
                  "| length | scheme / implementation | RSS growth | XLA temp + output |", "| --- | --- | --- | --- |"])
    for n, per in data["rss"].items():
      for key, r in per.items():
        est = data["lengths"].get(n, {}).get(key, {}).get("memory", {})
        est_b = est.get("temp", 0) + est.get("output", 0)
        growth = r.get("rss_growth_bytes")
        lines.append(f"| {n} | {key} | {f'{growth / GB:.3f} GB' if growth is not None else r} | {est_b / GB:.3f} GB |")
    lines.append("")

  lines.extend(["## Targets", ""] + [f"- {t}" for t in data.get("targets", [])] + [""])
  model = data.get("model_step")
  lines.extend(["## Base Transformer training step, Shaw vs sinusoidal (hook)", "",
                "```", json.dumps(model, indent=1) if model else "not run (--model_step off)", "```", ""])
  notes = os.path.join(out_dir, "notes.md")
  if os.path.exists(notes):
    with open(notes) as f:
      lines.extend([f.read().strip(), ""])
  with open(os.path.join(out_dir, "README.md"), "w") as f:
    f.write("\n".join(lines))


def check_targets(data: dict) -> list[str]:
  """The issue's targets, evaluated on the measured numbers."""
  out = []
  for impl in ("dense", "chunked"):
    for n in ("512", "1024", "2048"):
      e = data["lengths"].get(n, {}).get(f"shaw/{impl}")
      if not e or "vs_plain_dense" not in e:
        continue
      r = e["vs_plain_dense"]
      t, m = r.get("time_wall"), r.get("memory")
      ok = t is not None and m is not None and t <= 1.15 and m <= 1.15
      out.append(f"Shaw a^K + a^V ({impl}) at L={n}: time {t:.2f}x, memory {m:.2f}x of plain dense "
                 f"-> {'met' if ok else 'NOT met'} (target <= 1.15x both)")
  if data.get("long"):
    for key, e in data["long"]["results"].items():
      if e["implementation"] == "chunked":
        out.append(f"{key} at L={data['long']['length']}: {e.get('status')}"
                   + (f", {e['wall_median_s']:.1f} s, est. {e['memory']['peak'] / GB:.2f} GB" if e.get("wall_median_s")
                      else ""))
  model = data.get("model_step") or {}
  if model.get("status") == "ok":
    r = model["ratio_wall"]
    spread = model.get("ratio_wall_quartiles")
    spread = f" (quartiles {spread[0]:.3f}-{spread[1]:.3f})" if spread else ""
    out.append(f"base training step, Shaw / sinusoidal, batch {model['batch']} x {model['length']} tokens, "
               f"{model.get('implementation', 'dense')} attention: "
               f"{r:.3f}x{spread} -> {'met' if r <= 1.05 else 'NOT met'} (target <= 1.05x)")
  n = "4096"
  for scheme in ("plain", "shaw"):
    c = data["lengths"].get(n, {}).get(f"{scheme}/chunked", {}).get("memory", {}).get("peak")
    d = data["lengths"].get(n, {}).get(f"{scheme}/dense", {}).get("memory", {}).get("peak")
    if c and d:
      out.append(f"{scheme} chunked / dense peak memory at L={n}: {c / GB:.3f} / {d / GB:.3f} GB = {c / d:.3f} "
                 f"-> {'met' if c <= d / 4 else 'NOT met'} (target <= 1/4)")
  return out


# ----------------------------------------------------------------------------
# Main.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="smoke run: tiny shapes, two lengths, two rounds")
  p.add_argument("--lengths", default="128,256,512,1024,2048,4096")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--max_distance", type=int, default=16, help="Shaw's clipping distance k")
  p.add_argument("--block_q", type=int, default=128)
  p.add_argument("--block_k", type=int, default=128)
  p.add_argument("--repeats", type=int, default=9, help="timed interleaved rounds per length")
  p.add_argument("--min_sample_s", type=float, default=0.3, help="repeat short calls within one timed sample")
  p.add_argument("--min_repeats", type=int, default=3, help="rounds at lengths > 1024 (scaled down from --repeats)")
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--memory_budget_gb", type=float, default=14.0, help="run only configs whose estimate is below")
  p.add_argument("--long_length", type=int, default=16384, help="chunked self-attention length (batch 1); 0: off")
  p.add_argument("--long_repeats", type=int, default=2)
  p.add_argument("--rss_lengths", default="", help="lengths for the fresh-process RSS cross-check, e.g. 512,1024")
  p.add_argument("--model_step", action="store_true", help="also time the base Transformer's training step")
  p.add_argument("--model_preset", default="base")
  p.add_argument("--model_batch", type=int, default=8)
  p.add_argument("--model_length", type=int, default=64)
  p.add_argument("--model_repeats", type=int, default=5)
  p.add_argument("--model_implementation", default="dense", choices=["dense", "chunked"],
                 help="attention_implementation of every attention layer, on both sides of the model-step ratio")
  p.add_argument("--out", default=None)
  p.add_argument("--report_only", action="store_true",
                 help="re-render README.md from --out's results.json (e.g. after editing notes.md)")
  args = p.parse_args(argv)
  if args.quick:
    args.lengths, args.batch, args.heads, args.head_dim = "64,128", 2, 2, 16
    args.repeats, args.long_length, args.long_repeats, args.model_repeats = 2, 1024, 1, 1
    args.min_sample_s = 0.05
    args.model_preset, args.model_batch, args.model_length = "tiny", 2, 16
  if args.out is None:
    args.out = os.path.join(ROOT, "experiments", "results", "bench", "quick" if args.quick else "")
  return args


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if argv and argv[0] == "--_child":
    return child_rss(argv[1:])
  args = parse_args(argv)
  if args.report_only:
    with open(os.path.join(args.out, "results.json")) as f:
      data = json.load(f)
    data["targets"] = check_targets(data)
    write_report(data, args.out)
    return
  data = {"command": "python -m experiments.bench_attention " + shlex.join(argv), "args": vars(args),
          "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
          "load_start": round(os.getloadavg()[0], 2), "lengths": {}}
  print(json.dumps(data["machine"]), flush=True)
  for n in [int(x) for x in args.lengths.split(",") if x]:
    print(f"length {n}", flush=True)
    data["lengths"][str(n)] = run_length(CONFIGS, n, args, args.batch)
    write_report(data, args.out)  # partial results survive an interrupted run
  if args.long_length:
    print(f"long: length {args.long_length}, batch 1", flush=True)
    saved = args.repeats
    args.repeats = args.long_repeats
    data["long"] = {"length": args.long_length, "batch": 1,
                    "results": run_length(LONG_CONFIGS, args.long_length, args, 1)}
    args.repeats = saved
  if args.rss_lengths:
    forwarded = [f"--heads={args.heads}", f"--head_dim={args.head_dim}", f"--max_distance={args.max_distance}",
                 f"--block_q={args.block_q}", f"--block_k={args.block_k}"]
    rss_configs = [c for c in CONFIGS if c[0] in ("plain", "shaw") and c[3] in ("dense", "chunked")]
    data["rss"] = {n: rss_check(rss_configs, int(n), args.batch, args, forwarded)
                   for n in args.rss_lengths.split(",") if n}
  if args.model_step:
    print("model step", flush=True)
    data["model_step"] = bench_model_step(args)
  data["load_end"] = round(os.getloadavg()[0], 2)
  data["targets"] = check_targets(data)
  write_report(data, args.out)
  print("\n".join(data["targets"]))
  print(f"wrote {args.out}/results.json and README.md")


if __name__ == "__main__":
  main()
