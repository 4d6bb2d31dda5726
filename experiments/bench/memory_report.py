"""Peak memory of a whole training step against sequence length: dense vs chunked attention.

    python -m experiments bench memory --lengths 4096,8192 --out experiments/results/bench/model_memory
    python -m experiments bench memory --report_only --out DIR     # README.md again from DIR/results.json

What is measured and how: :mod:`experiments.bench.memory` (the flags are its
``Settings``): each step is compiled, never run, and its peak is XLA's
estimate (:func:`experiments.machine.peak_bytes`). Writes ``results.json``
and ``README.md`` (with ``notes.md``
of ``--out`` appended as the reading, if present) to ``--out`` after each
measurement, so partial results survive an interruption.

``README.md`` is rendered from the recorded data alone (:func:`write`), so a committed ``results.json``
re-renders its README with ``--report_only``; ``notes.md`` beside it, if present, is appended as the reading.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import sys

from absl import app
from absl import flags

from experiments import machine
from experiments import render
from experiments import settings as settings_lib
from experiments.bench import memory
from experiments.bench.memory import IMPLEMENTATIONS, key

R = render.RIGHT  # a right-aligned column


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


def results_table(data: dict) -> str:
  """A row per measured (scheme, implementation, L): peak, temp, the rest, growth, chunked / dense, O(q k) arrays."""
  growth = {(g["position"], g["implementation"], g["to"]): g["ratio"] for g in data["growth"]}
  versus = {(v["position"], v["length"]): v["ratio"] for v in data["chunked_vs_dense"]}
  rows = []
  for position in data["positions"]:
    for impl in IMPLEMENTATIONS:
      for n in data["lengths"]:
        e = data["results"].get(key(position, impl, n))
        if e is None:
          continue
        if "memory" not in e:
          rows.append([position, impl, n, e.get("status", "-")] + [""] * 6)
          continue
        m, g = e["memory"], growth.get((position, impl, n))
        v = versus.get((position, n)) if impl == "chunked" else None
        rows.append([position, impl, n, f"{m['peak'] / machine.GB:.4f}", f"{m['temp'] / machine.GB:.4f}",
                     f"{(m['argument'] + m['output'] - m['alias']) / machine.GB:.4f}", "-" if g is None else f"{g:.3f}",
                     "-" if v is None else f"{v:.4f}", e.get("quadratic_arrays", {}).get("count", "-"),
                     f"{e['compile_s']:.1f}"])
  return render.markdown_table(
      ["position", "implementation", "L", "peak (GB)", "temp (GB)", "args + out - alias (GB)", "peak(L) / peak(L/2)",
       "chunked / dense", "[.., L, L] arrays", "compile (s)"], rows, ["---", "---"] + [R] * 8)


def _largest(data: dict) -> list[str]:
  """The largest arrays of each scheme's chunked step at its longest length."""
  biggest = [(k, e) for k, e in data["results"].items() if e.get("largest_arrays")]
  if not biggest:
    return []
  lines = ["## Largest arrays in the compiled chunked steps", "",
           "The largest array-valued HLO instructions (by shape; not live-buffer accounting) at the longest "
           "length of each scheme: an O(L^2) tensor would be listed here with the line that made it.", ""]
  for k, e in biggest:
    if e["length"] != max(int(x) for x in data["lengths"] if key(e["position"], "chunked", x) in data["results"]):
      continue
    rows = [[f"{r['bytes']:,}", r["shape"], r["opcode"],
             f"`{r['op_name'] if len(r['op_name']) <= 90 else '...' + r['op_name'][-87:]}`", r["source"]]
            for r in e["largest_arrays"]]
    lines += [f"`{k}`:", "", render.markdown_table(["bytes", "shape", "opcode", "op_name", "source"], rows,
                                                   [R] + ["---"] * 4), ""]
  return lines


def write(data: dict, out_dir: str) -> None:
  """Writes ``results.json`` (``data``) and ``README.md`` (with ``notes.md`` of ``out_dir`` appended) to ``out_dir``."""
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
      "## Results", "", results_table(data), ""]
  lines += ["## Target", "",
            f"Chunked attention: peak(2L) / peak(L) <= {memory.TARGET_RATIO} on every measured doubling from L >= "
            f"{data.get('chunk_block', 0)} (the chunk block) -> **{memory.verdict(targets)}**", ""]
  if targets:
    lines += [f"- {target_line(t)}" for t in targets] + [""]
  lines.append(quadratic_line(data))
  dense = [g for g in data["growth"] if g["implementation"] == "dense"]
  if dense:
    lines += ["", "For comparison, dense: " + "; ".join(
        f"{g['position']} L {g['from']} -> {g['to']}: {g['ratio']:.3f}" for g in dense)]
  lines += [""] + _largest(data)
  notes = os.path.join(out_dir, "notes.md")
  if os.path.exists(notes):
    with open(notes) as f:
      lines += ["## Reading", "", f.read().strip(), ""]
  with open(os.path.join(out_dir, "README.md"), "w") as f:
    f.write("\n".join(lines))


# ----------------------------------------------------------------------------
# The command.


FLAGS = flags.FLAGS


def run(s: memory.Settings, out: str, command: str) -> dict:
  """Measures every (scheme, implementation, length), writing the report after each; returns the data."""
  date = datetime.datetime.now().isoformat(timespec="seconds")
  data = {"command": command, "args": dataclasses.asdict(s), "date": date,
          "machine": machine.machine(), "chunk_block": memory.chunk_block(), "positions": list(s.positions),
          "lengths": sorted(s.lengths), "results": {}}
  print(json.dumps(data["machine"]), flush=True)
  for position in s.positions:
    for impl in s.implementations:
      for n in data["lengths"]:
        k = memory.key(position, impl, n)
        if impl == "dense" and s.skip_dense_above and n > s.skip_dense_above:
          data["results"][k] = {"position": position, "implementation": impl, "length": n,
                                "status": f"skipped (--skip_dense_above {s.skip_dense_above})"}
          continue
        entry = memory.measure(s, position, impl, n, top=s.top_arrays if impl == "chunked" else 0)
        data["results"][k] = entry
        print(f"  {k:24s} peak {entry['memory']['peak'] / machine.GB:8.4f} GB  "
              f"(temp {entry['memory']['temp'] / machine.GB:.4f})  compile {entry['compile_s']:.1f} s", flush=True)
        memory.add_ratios(data)
        data["targets"] = memory.check_targets(data)
        write(data, out)
  return data


def define_flags() -> None:
  """The ``bench memory`` verb's flags: a flag per Settings field, ``--out`` and ``--report_only``."""
  settings_lib.define(memory.Settings)
  flags.DEFINE_string("out", os.path.join(machine.ROOT, "experiments", "results", "bench", "model_memory"),
                      "Output directory of results.json and README.md.")
  flags.DEFINE_bool("report_only", False, "Re-render README.md from --out's results.json.")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  out = FLAGS.out
  if FLAGS.report_only:
    with open(os.path.join(out, "results.json")) as f:
      write(json.load(f), out)
    return
  try:
    s = settings_lib.parse(memory.Settings)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  data = run(s, out, "python -m experiments " + shlex.join(sys.argv[1:]))
  print(results_table(data))
  for t in data["targets"]:
    print(target_line(t))
  print(f"target (chunked peak(2L) / peak(L) <= {memory.TARGET_RATIO}): {memory.verdict(data['targets'])}")
  print(quadratic_line(data))
  print(f"wrote {out}/results.json and README.md")
