"""Peak memory of a whole training step against sequence length: dense vs chunked attention.

For each position scheme, attention implementation (``dense``, ``chunked``)
and length L, one training step (:func:`rpr.train.train_step`, Adam) of the
encoder-decoder Transformer on ``batch`` rows of L source and L target tokens
is jitted, lowered and compiled, but never run: the state and batch are
``jax.ShapeDtypeStruct`` s from ``jax.eval_shape``, so nothing of size L is
allocated. The number reported is XLA's estimate of the executable's peak
memory from ``compiled.memory_analysis()`` (see :func:`peak_bytes`).

The issue's target: with chunked attention the model holds no O(q k) tensor,
so its step's peak grows about linearly: ``peak(2L) / peak(L) <= 2.3``.
Dense attention holds ``[batch, heads, L, L]`` weights per layer and should
grow about 4x.

    python -m experiments.bench_memory --lengths 4096,8192 --out experiments/results/bench/model_memory

Writes ``results.json`` and ``README.md`` (with ``notes.md`` of ``--out``
appended as the reading, if present) to ``--out``. Every compiled step's
optimised HLO is also searched for arrays with two axes of length L, i.e.
O(q k) tensors (:func:`hlo_arrays`; counted, with their shapes and source
lines), and the largest arrays of each chunked step are recorded: what is
left that grows with L, and from which line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 1e9
IMPLEMENTATIONS = ("dense", "chunked")
TARGET_RATIO = 2.3  # the issue: chunked peak(2L) / peak(L) <= 2.3


# ----------------------------------------------------------------------------
# One measurement.


def model_config(args, position: str, implementation: str, length: int):
  from rpr import model as model_lib

  options = {"max_distance": args.max_distance} if position == "shaw" else {}
  return model_lib.ModelConfig(
      vocab_size=args.vocab_size, d_model=args.d_model, num_heads=args.num_heads, d_ff=args.d_ff,
      num_encoder_layers=args.encoder_layers, num_decoder_layers=args.decoder_layers,
      dropout_rate=args.dropout_rate, position=position, position_options=options,
      max_length=max(length, 1), attention_implementation=implementation).validate()


def peak_bytes(compiled) -> dict:
  """XLA's memory estimate of ``compiled``, and ``peak`` = temp + argument + output - alias.

  jaxlib 0.10.2's ``CompiledMemoryStats`` has ``argument_size_in_bytes`` (the
  inputs: state and batch), ``output_size_in_bytes`` (new state and
  metrics), ``alias_size_in_bytes`` (outputs written into donated inputs,
  counted in both of the former, so subtracted once), ``temp_size_in_bytes``
  (XLA's buffer assignment: the one block holding every intermediate,
  activations kept for the backward pass included, with buffers whose
  lifetimes do not overlap sharing bytes), the ``host_*`` counterparts (0 on
  CPU) and ``generated_code_size_in_bytes``. Its ``peak_memory_in_bytes`` is
  also recorded but not used: on XLA:CPU it leaves out the temp block (a
  jitted ``exp(x @ x.T)`` with 4 MB of temps reports only its 0.26 MB of
  arguments), so it would hide exactly the O(L^2) tensors this benchmark looks
  for.
  """
  m = compiled.memory_analysis()
  out = {key: int(getattr(m, f"{key}_size_in_bytes")) for key in ("temp", "argument", "output", "alias",
                                                                   "generated_code")}
  out["xla_peak_memory_in_bytes"] = int(getattr(m, "peak_memory_in_bytes", -1))
  out["peak"] = out["temp"] + out["argument"] + out["output"] - out["alias"]
  return out


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
                "u32": 4, "f64": 8, "s64": 8, "u64": 8}
# "%name = f32[1,4,8192,8192]{3,2,1,0} opcode(...), ..., metadata={op_name="..." stack_frame_id=N}"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\](?:\{[^}]*\})?\s+([\w\-]+)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_FUSION_CALL = re.compile(r"\bfusion\(.*\bcalls=%?([\w.\-]+)")


def _stack_frames(hlo_text: str) -> dict[int, str]:
  """``stack_frame_id -> "file:line"`` of the innermost frame in this repository (``rpr/``, ``experiments/``)."""
  files, locations, frames = {}, {}, {}
  section = None
  for line in hlo_text.splitlines():
    s = line.strip()
    if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = s
      continue
    if not s or s.startswith("%") or s.startswith("ENTRY") or s.startswith("HloModule"):
      if s.startswith("%") or s.startswith("ENTRY"):
        break
      continue
    if section == "FileNames":
      i, name = s.split(" ", 1)
      files[int(i)] = name.strip('"')
    elif section == "FileLocations":
      i = int(s.split(" ", 1)[0])
      locations[i] = (int(re.search(r"file_name_id=(\d+)", s).group(1)), int(re.search(r"\bline=(\d+)", s).group(1)))
    elif section == "StackFrames":
      i = int(s.split(" ", 1)[0])
      frames[i] = (int(re.search(r"file_location_id=(\d+)", s).group(1)),
                   int(re.search(r"parent_frame_id=(\d+)", s).group(1)))

  def ours(path: str) -> bool:
    rel = os.path.relpath(path, ROOT)
    return not rel.startswith("..") and rel.split(os.sep)[0] in ("rpr", "experiments", "tests")

  out = {}
  for i in frames:
    j, seen = i, set()
    while j in frames and j not in seen:  # innermost first, then the callers
      seen.add(j)
      loc, parent = frames[j]
      file_id, line_no = locations.get(loc, (None, None))
      path = files.get(file_id, "")
      if path and ours(path):
        out[i] = f"{os.path.relpath(path, ROOT)}:{line_no}"
        break
      j = parent
  return out


def hlo_arrays(hlo_text: str) -> list[dict]:
  """The arrays an optimised HLO module materialises, biggest first.

  Every array-valued instruction outside fusion bodies (a fusion's inner
  instructions make no buffer of their own; tuples are skipped), one row per
  distinct (shape, op, source). Not live-buffer accounting, but an O(L^2)
  tensor shows up here with its shape, op and the repository line
  (``source``, innermost ``rpr/``, ``experiments/`` or ``tests/`` frame, when
  XLA kept one) that made it.
  """
  fused = set(_FUSION_CALL.findall(hlo_text))
  frames = _stack_frames(hlo_text)
  found, computation = {}, None
  for line in hlo_text.splitlines():
    c = _COMPUTATION.match(line)
    if c:
      computation = c.group(1)
      continue
    m = _INSTRUCTION.match(line)
    if not m or computation in fused or m.group(2) not in _DTYPE_BYTES:
      continue
    dims = [int(d) for d in m.group(3).split(",") if d]
    elements = int(np.prod(dims, dtype=np.int64))
    op, frame = _OP_NAME.search(line), _FRAME.search(line)
    entry = {"bytes": elements * _DTYPE_BYTES[m.group(2)], "elements": elements, "dims": dims,
             "shape": f"{m.group(2)}[{m.group(3)}]", "opcode": m.group(4), "name": m.group(1),
             "op_name": op.group(1) if op else "", "source": frames.get(int(frame.group(1)), "") if frame else ""}
    k = (entry["shape"], entry["op_name"], entry["source"])  # one row per distinct tensor, not per copy
    if k not in found:
      found[k] = entry
  return sorted(found.values(), key=lambda e: -e["bytes"])


def largest_arrays(hlo_text: str, top: int = 5) -> list[dict]:
  """The ``top`` largest arrays of :func:`hlo_arrays`."""
  return hlo_arrays(hlo_text)[:top]


def measure(args, position: str, implementation: str, length: int, top: int = 0) -> dict:
  """Compiles (without running) one training step at ``length`` and returns XLA's memory estimate."""
  import optax

  from rpr import model as model_lib
  from rpr import train as train_lib

  config = model_config(args, position, implementation, length)
  model = model_lib.build(config)  # --encoder_layers 0: the decoder-only language model, no inputs
  tx = optax.adam(1e-3)
  source = length if config.num_encoder_layers else 0
  state = jax.eval_shape(lambda rng: train_lib.init_state(rng, model, tx, source, length),
                         jax.ShapeDtypeStruct((2,), jnp.uint32))
  batch = {"inputs": jax.ShapeDtypeStruct((args.batch, source), jnp.int32),
           "targets": jax.ShapeDtypeStruct((args.batch, length), jnp.int32)}

  def step(state, batch):
    return train_lib.train_step(state, batch, model=model, tx=tx, schedule=lambda i: 1e-3,
                                label_smoothing=args.label_smoothing)

  t0 = time.perf_counter()
  lowered = jax.jit(step, donate_argnums=0).lower(state, batch)  # donated as in rpr.train
  # LLVM's optimisation level only changes the machine code; the HLO passes and the buffer assignment
  # behind memory_analysis() are the same (identical estimates checked at L = 256 and 8192).
  compiled = lowered.compile({"xla_backend_optimization_level": 0} if args.fast_compile else None)
  entry = {"position": position, "implementation": implementation, "length": length, "batch": args.batch,
           "compile_s": round(time.perf_counter() - t0, 2), "memory": peak_bytes(compiled),
           "params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(state.params)))}
  arrays = hlo_arrays(compiled.as_text())
  # An O(q k) tensor has two axes of length L (L + the chunk padding at most): [b, h, q, k] and its relatives.
  # (A vocabulary or d_ff of the same size as L would be miscounted; the defaults keep clear of that.)
  block = chunk_block()
  quadratic = [a for a in arrays if sum(length <= d < length + block for d in a["dims"]) >= 2]
  entry["quadratic_arrays"] = {"count": len(quadratic), "largest": quadratic[:3]}
  if top:
    entry["largest_arrays"] = arrays[:top]
  return entry


# ----------------------------------------------------------------------------
# Ratios, targets, report.


def key(position: str, implementation: str, length: int) -> str:
  return f"{position}/{implementation}/{length}"


def add_ratios(data: dict) -> None:
  """Growth ``peak(2L) / peak(L)`` per scheme and implementation, and ``chunked / dense`` per length."""
  res = data["results"]
  growth, versus = [], []
  for position in data["positions"]:
    for impl in IMPLEMENTATIONS:
      for n in data["lengths"]:
        a, b = res.get(key(position, impl, n)), res.get(key(position, impl, 2 * n))
        if a and b and "memory" in a and "memory" in b:
          growth.append({"position": position, "implementation": impl, "from": n, "to": 2 * n,
                         "ratio": b["memory"]["peak"] / a["memory"]["peak"]})
    for n in data["lengths"]:
      c, d = res.get(key(position, "chunked", n)), res.get(key(position, "dense", n))
      if c and d and "memory" in c and "memory" in d:
        versus.append({"position": position, "length": n, "ratio": c["memory"]["peak"] / d["memory"]["peak"]})
  data["growth"], data["chunked_vs_dense"] = growth, versus


def chunk_block() -> int:
  """The chunked layers' block size: ``chunked_attention``'s default ``block_q`` (the model passes none)."""
  import inspect

  from rpr.attention.chunked import chunked_attention

  params = inspect.signature(chunked_attention).parameters
  return max(params["block_q"].default, params["block_k"].default)


def check_targets(data: dict) -> list[dict]:
  """The issue's target on every measured doubling of the chunked model: ``peak(2L) / peak(L) <= 2.3``.

  Doublings from L below the chunk block are listed but not judged: there a
  block is the whole L x L square, so the chunked path is quadratic by design.
  """
  block = data.get("chunk_block", 0)
  out = []
  for g in data["growth"]:
    if g["implementation"] == "chunked":
      judged = g["from"] >= block
      out.append({**g, "target": TARGET_RATIO, "judged": judged, "pass": g["ratio"] <= TARGET_RATIO})
  return out


def verdict(targets: list[dict]) -> str:
  judged = [t for t in targets if t.get("judged", True)]
  if not judged:
    return "NOT EVALUATED (no chunked length pair L, 2L with L >= the chunk block measured)"
  return "PASS" if all(t["pass"] for t in judged) else "FAIL"


def quadratic_line(data: dict) -> str:
  """How many dense and chunked steps hold an array with two L-long axes (an O(q k) tensor).

  Chunked steps count only above the chunk block: up to it a block is the whole L x L square.
  """
  block = data.get("chunk_block", 0)
  parts = []
  for impl in IMPLEMENTATIONS:
    entries = [e for e in data["results"].values() if e["implementation"] == impl and "quadratic_arrays" in e
               and (impl == "dense" or e["length"] > block)]
    if entries:
      holding = sum(e["quadratic_arrays"]["count"] > 0 for e in entries)
      parts.append(f"{impl}: {holding} of {len(entries)} compiled steps"
                   + (f" with L > {block} (the chunk block)" if impl == "chunked" else "") + " hold one")
  return "O(q k) tensors (arrays with two axes of length L) in the compiled steps: " + "; ".join(parts) + "."


def target_line(t: dict) -> str:
  mark = ("PASS" if t["pass"] else "FAIL") if t.get("judged", True) else "not judged (L below the chunk block)"
  return f"{t['position']} chunked, L {t['from']} -> {t['to']}: {t['ratio']:.3f} -> {mark}"


def table_lines(data: dict) -> list[str]:
  res = data["results"]
  lines = ["| position | implementation | L | peak (GB) | temp (GB) | args + out - alias (GB) | peak(L) / peak(L/2) "
           "| chunked / dense | [.., L, L] arrays | compile (s) |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  growth = {(g["position"], g["implementation"], g["to"]): g["ratio"] for g in data["growth"]}
  versus = {(v["position"], v["length"]): v["ratio"] for v in data["chunked_vs_dense"]}
  for position in data["positions"]:
    for impl in IMPLEMENTATIONS:
      for n in data["lengths"]:
        e = res.get(key(position, impl, n))
        if e is None:
          continue
        if "memory" not in e:
          lines.append(f"| {position} | {impl} | {n} | {e.get('status', '-')} | | | | | | |")
          continue
        m = e["memory"]
        g = growth.get((position, impl, n))
        v = versus.get((position, n)) if impl == "chunked" else None
        lines.append(f"| {position} | {impl} | {n} | {m['peak'] / GB:.4f} | {m['temp'] / GB:.4f} | "
                     f"{(m['argument'] + m['output'] - m['alias']) / GB:.4f} | {'-' if g is None else f'{g:.3f}'} | "
                     f"{'-' if v is None else f'{v:.4f}'} | {e.get('quadratic_arrays', {}).get('count', '-')} | "
                     f"{e['compile_s']:.1f} |")
  return lines


def machine() -> dict:
  """bench_attention's machine record, plus the backend and XLA flags this estimate depends on."""
  from experiments import bench_attention

  return {**bench_attention.machine(), "backend": jax.default_backend(), "xla_flags": os.environ.get("XLA_FLAGS", "")}


def write_report(data: dict, out_dir: str) -> None:
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(data, f, indent=1)
  a = data["args"]
  targets = data.get("targets", [])
  lines = [
      "# Peak memory of a training step: dense vs chunked attention", "",
      f"One `rpr.train.train_step` (Adam, label smoothing {a['label_smoothing']}, dropout {a['dropout_rate']}) of "
      f"the encoder-decoder Transformer: d_model {a['d_model']}, {a['num_heads']} heads, "
      f"{a['encoder_layers']}+{a['decoder_layers']} layers, d_ff {a['d_ff']}, vocabulary {a['vocab_size']}, "
      f"batch {a['batch']}, source and target both L tokens, float32, Shaw k = {a['max_distance']}. "
      "Jitted with the state donated (as `rpr.train` does), lowered on `jax.ShapeDtypeStruct` s and compiled; "
      "never run.", "",
      f"Command: `{data['command']}`  ", f"Date: {data['date']}  ",
      "Machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items()), "",
      "Peak = XLA's estimate from `compiled.memory_analysis()`: `temp_size_in_bytes` (every intermediate, "
      "activations kept for the backward pass included, after XLA's buffer sharing) + `argument_size_in_bytes` "
      "(state and batch) + `output_size_in_bytes` (new state, metrics) - `alias_size_in_bytes` (outputs written "
      "into the donated state, counted in both). `peak_memory_in_bytes` is recorded in results.json but not "
      "used: on XLA:CPU it leaves the temp block out. '[.., L, L] arrays': distinct arrays of the optimised HLO "
      "(outside fusion bodies) with two axes of length L, i.e. O(q k) tensors; examples with their source lines "
      "are in results.json (`quadratic_arrays`).", "",
      "## Results", ""] + table_lines(data) + [""]
  lines += ["## Target", "",
            f"Chunked attention: peak(2L) / peak(L) <= {TARGET_RATIO} on every measured doubling from L >= "
            f"{data.get('chunk_block', 0)} (the chunk block) -> "
            f"**{verdict(targets)}**", ""]
  if targets:
    lines += [f"- {target_line(t)}" for t in targets] + [""]
  lines.append(quadratic_line(data))
  dense = [g for g in data["growth"] if g["implementation"] == "dense"]
  if dense:
    lines += ["", "For comparison, dense: " + "; ".join(
        f"{g['position']} L {g['from']} -> {g['to']}: {g['ratio']:.3f}" for g in dense)]
  lines.append("")
  biggest = [(k, e) for k, e in data["results"].items() if e.get("largest_arrays")]
  if biggest:
    lines += ["## Largest arrays in the compiled chunked steps", "",
              "The largest array-valued HLO instructions (by shape; not live-buffer accounting) at the longest "
              "length of each scheme: an O(L^2) tensor would be listed here with the line that made it.", ""]
    for k, e in biggest:
      if e["length"] != max(int(x) for x in data["lengths"] if key(e["position"], "chunked", x) in data["results"]):
        continue
      lines += [f"`{k}`:", "", "| bytes | shape | opcode | op_name | source |", "| ---: | --- | --- | --- | --- |"]
      for r in e["largest_arrays"]:
        op_name = r["op_name"] if len(r["op_name"]) <= 90 else "..." + r["op_name"][-87:]
        lines.append(f"| {r['bytes']:,} | {r['shape']} | {r['opcode']} | `{op_name}` | {r['source']} |")
      lines.append("")
  notes = os.path.join(out_dir, "notes.md")
  if os.path.exists(notes):
    with open(notes) as f:
      lines += ["## Reading", "", f.read().strip(), ""]
  with open(os.path.join(out_dir, "README.md"), "w") as f:
    f.write("\n".join(lines))


# ----------------------------------------------------------------------------
# Main.


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--lengths", default="4096,8192", help="comma-separated source = target lengths")
  p.add_argument("--positions", default="shaw", help="comma-separated position schemes, e.g. shaw,t5,none")
  p.add_argument("--implementations", default="dense,chunked")
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--d_model", type=int, default=64)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--encoder_layers", type=int, default=1, help="0: the decoder-only language model")
  p.add_argument("--decoder_layers", type=int, default=1)
  p.add_argument("--d_ff", type=int, default=128)
  p.add_argument("--vocab_size", type=int, default=1000)
  p.add_argument("--max_distance", type=int, default=16, help="Shaw's clipping distance k")
  p.add_argument("--dropout_rate", type=float, default=0.1)
  p.add_argument("--label_smoothing", type=float, default=0.1)
  p.add_argument("--skip_dense_above", type=int, default=0,
                 help="do not compile dense steps longer than this (0: compile all)")
  p.add_argument("--fast_compile", action="store_true",
                 help="compile with xla_backend_optimization_level 0 (about half the compile time, same estimate)")
  p.add_argument("--top_arrays", type=int, default=6, help="largest HLO arrays recorded per chunked step")
  p.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "bench", "model_memory"))
  p.add_argument("--report_only", action="store_true", help="re-render README.md from --out's results.json")
  args = p.parse_args(argv)
  for impl in args.implementations.split(","):
    if impl not in IMPLEMENTATIONS:
      p.error(f"--implementations: {impl!r} is not one of {IMPLEMENTATIONS}")
  return args


def run(args, command: str) -> dict:
  """Measures every configuration, writing the report after each (partial results survive an interruption)."""
  lengths = sorted(int(x) for x in args.lengths.split(",") if x)
  positions = [x for x in args.positions.split(",") if x]
  data = {"command": command, "args": vars(args), "date": datetime.datetime.now().isoformat(timespec="seconds"),
          "machine": machine(), "chunk_block": chunk_block(), "positions": positions, "lengths": lengths,
          "results": {}}
  for position in positions:
    for impl in args.implementations.split(","):
      for n in lengths:
        if impl == "dense" and args.skip_dense_above and n > args.skip_dense_above:
          data["results"][key(position, impl, n)] = {"position": position, "implementation": impl, "length": n,
                                                     "status": f"skipped (--skip_dense_above {args.skip_dense_above})"}
          continue
        entry = measure(args, position, impl, n, top=args.top_arrays if impl == "chunked" else 0)
        data["results"][key(position, impl, n)] = entry
        print(f"  {key(position, impl, n):24s} peak {entry['memory']['peak'] / GB:8.4f} GB  "
              f"(temp {entry['memory']['temp'] / GB:.4f})  compile {entry['compile_s']:.1f} s", flush=True)
        add_ratios(data)
        data["targets"] = check_targets(data)
        write_report(data, args.out)
  return data


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  if args.report_only:
    with open(os.path.join(args.out, "results.json")) as f:
      data = json.load(f)
    write_report(data, args.out)
    return data
  print(json.dumps(machine()), flush=True)
  data = run(args, "python -m experiments.bench_memory " + shlex.join(argv))
  print("\n".join(table_lines(data)))
  for t in data["targets"]:
    print(target_line(t))
  print(f"target (chunked peak(2L) / peak(L) <= {TARGET_RATIO}): {verdict(data['targets'])}")
  print(quadratic_line(data))
  print(f"wrote {args.out}/results.json and README.md")
  return data


if __name__ == "__main__":
  main()
