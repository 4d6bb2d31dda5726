"""Attention cost per position scheme: forward + backward time and peak memory, as ratios to plain attention.

    python -m experiments bench attention                 # full run
    python -m experiments bench attention --quick         # smoke run: tiny shapes, two lengths
    python -m experiments bench attention --report_only --out DIR   # README.md again from DIR/results.json

What is measured and how: :mod:`experiments.bench.attention`; each flag is a field of its ``Settings``, declared
there with its help (``--helpshort``). Writes ``results.json`` and ``README.md`` to ``--out`` after each length, so
partial results survive an interruption.

``README.md`` is rendered from the recorded data alone (:func:`write`, its targets judged by
:func:`check_targets`), so a committed ``results.json`` re-renders its README with ``--report_only``;
``notes.md`` beside it, if present, is appended as the reading.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os

from absl import app
from absl import flags

from experiments import machine
from experiments import render
from experiments import settings as settings_lib
from experiments.bench import attention

TABLE_COLUMN = "scheme / implementation"


def fmt_ratio(entry: dict, field: str, clock: str) -> str:
  """``time / memory`` ratio cell of ``entry[field]``; the status where the configuration did not run."""
  status = entry.get("status", "")
  if status.startswith("skipped") or status.startswith("error"):
    mem = entry.get(field, {}).get("memory")
    return status if mem is None else f"{status}; mem {mem:.2f}x"
  r = entry.get(field, {})
  t, m = r.get(f"time_{clock}"), r.get("memory")
  if m is None:
    return "-"
  return f"{t:.2f}x / {m:.2f}x" if t is not None else f"- / {m:.3f}x (reference not run)"


def _header(data: dict) -> list[str]:
  a = data["args"]
  return [
      "# Attention cost per position scheme", "",
      f"Forward + backward of `sum(attention(q, k, v) * g)` (gradients for q, k, v and the scheme's parameters), "
      f"{attention.shape(a)}, self-attention without masks, float32, "
      f"chunked blocks {a['block_q']} x {a['block_k']}.", "",
      f"Command: `{data['command']}`  ", f"Date: {data['date']}  ",
      "Machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items() if k != "devices") + "  ",
      f"Load average (1 min) at start / end: {data['load_start']} / {data.get('load_end', '-')} "
      "(other processes shared the 2 cores; hence interleaved rounds and per-round ratios).", "",
      "Cells: **time ratio / peak-memory ratio** to plain dense attention at the same length. Time = median over "
      f"{a['repeats']} rounds ({a['min_repeats']} above L=1024), each timing every config once in a fresh "
      "random order, of (this config's wall time / plain dense's wall time in the same round); a sample repeats "
      f"short calls to last >= {a['min_sample_s']} s; all after warm-up. Peak memory = XLA's compiled estimate "
      f"`memory_analysis()`: {machine.PEAK} bytes. "
      "'skipped (est. N GB)': the estimate exceeded the memory budget, so it was compiled but not run.", "",
  ]


def _length_tables(data: dict, lengths: list[str]) -> list[str]:
  """The ratio tables (wall, CPU, same implementation) and the absolute numbers, a column per length."""
  header = [TABLE_COLUMN] + [f"L={n}" for n in lengths]
  keys = [attention.label(c) for c in attention.CONFIGS]
  lines = []
  for field, clock, title, note in (
      ("vs_plain_dense", "wall", "Ratios to plain dense attention (wall time)", ""),
      ("vs_plain_dense", "cpu", "Ratios to plain dense attention (process CPU time)",
       "CPU time of this process (all XLA threads): less sensitive to other processes than wall time."),
      ("vs_plain_same_impl", "wall", "Ratios to plain attention of the same implementation (wall time)",
       "Chunked rows divided by plain chunked: the intrinsic cost of each scheme inside the chunked kernel.")):
    rows = [[f"{key} ({attention.DESCRIPTIONS[key.split('/')[0]]})"]
            + [fmt_ratio(data["lengths"][n].get(key, {}), field, clock) for n in lengths] for key in keys]
    lines += [f"## {title}", "", note, "", render.markdown_table(header, rows), ""]
  rows = []
  for key in keys:
    cells = [key]
    for n in lengths:
      e = data["lengths"][n].get(key, {})
      t, mem = e.get("wall_median_s"), e.get("memory", {}).get("peak")
      cells.append(f"{t * 1e3:.0f} ms, {mem / machine.GB:.3f} GB" if t else e.get("status", "-"))
    rows.append(cells)
  return lines + ["## Absolute numbers", "", render.markdown_table(header, rows), ""]


def _long_and_rss(data: dict) -> list[str]:
  lines = []
  if data.get("long"):
    lg = data["long"]
    rows = [[key, e.get("status"), f"{e['wall_median_s']:.1f} s" if e.get("wall_median_s") else "-",
             f"{e['memory']['peak'] / machine.GB:.2f} GB" if e.get("memory", {}).get("peak") else "-"]
            for key, e in lg["results"].items()]
    lines += [f"## Long sequences: L = {lg['length']}, batch {lg['batch']}", "",
              render.markdown_table([TABLE_COLUMN, "status", "wall time (median)", "peak memory (est.)"], rows), ""]
  if data.get("rss"):
    rows = []
    for n, per in data["rss"].items():
      for key, r in per.items():
        est = data["lengths"].get(n, {}).get(key, {}).get("memory", {})
        growth = r.get("rss_growth_bytes")
        rows.append([n, key, f"{growth / machine.GB:.3f} GB" if growth is not None else r,
                     f"{(est.get('temp', 0) + est.get('output', 0)) / machine.GB:.3f} GB"])
    lines += ["## Cross-check: resident memory of one call in a fresh process", "",
              "Growth of the resident set (VmHWM after the call minus VmRSS before it; inputs and executable "
              "already resident) against XLA's temp + output estimate.", "",
              render.markdown_table(["length", TABLE_COLUMN, "RSS growth", "XLA temp + output"], rows), ""]
  return lines


def write(data: dict, out_dir: str) -> None:
  """Writes ``results.json`` (``data``) and ``README.md`` (with ``notes.md`` of ``out_dir`` appended) to ``out_dir``."""
  lengths = sorted(data["lengths"], key=int)
  lines = _header(data)
  if lengths:  # a model-step-only run (--lengths '') has no attention tables
    lines += _length_tables(data, lengths)
  lines += _long_and_rss(data)
  lines += ["## Targets", ""] + [f"- {t}" for t in data.get("targets", [])] + [""]
  model = data.get("model_step")
  lines += ["## Base Transformer training step, Shaw vs sinusoidal (hook)", "",
            "```", json.dumps(model, indent=1) if model else "not run (--model_step off)", "```", ""]
  notes = os.path.join(out_dir, "notes.md")
  if os.path.exists(notes):
    with open(notes) as f:
      lines += [f.read().strip(), ""]
  render.write_report(out_dir, data, "\n".join(lines))


def check_targets(data: dict) -> list[str]:
  """The targets, judged on the measured numbers: Shaw within 1.15x of plain dense in time and memory at L =
  512-2048, the long chunked runs, the model step within 1.05x, and chunked memory <= 1/4 of dense at L = 4096."""
  out = []
  for impl in ("dense", "chunked"):
    for n in ("512", "1024", "2048"):
      e = data["lengths"].get(n, {}).get(f"shaw/{impl}")
      if not e or "vs_plain_dense" not in e:
        continue
      t, m = e["vs_plain_dense"].get("time_wall"), e["vs_plain_dense"].get("memory")
      ok = t is not None and m is not None and t <= 1.15 and m <= 1.15
      out.append(f"Shaw a^K + a^V ({impl}) at L={n}: time {t:.2f}x, memory {m:.2f}x of plain dense "
                 f"-> {'met' if ok else 'NOT met'} (target <= 1.15x both)")
  if data.get("long"):
    for key, e in data["long"]["results"].items():
      if e["implementation"] == "chunked":
        out.append(f"{key} at L={data['long']['length']}: {e.get('status')}"
                   + (f", {e['wall_median_s']:.1f} s, est. {e['memory']['peak'] / machine.GB:.2f} GB"
                      if e.get("wall_median_s") else ""))
  model = data.get("model_step") or {}
  if model.get("status") == "ok":
    r, spread = model["ratio_wall"], model.get("ratio_wall_quartiles")
    spread = f" (quartiles {spread[0]:.3f}-{spread[1]:.3f})" if spread else ""
    out.append(f"base training step, Shaw / sinusoidal, batch {model['batch']} x {model['length']} tokens, "
               f"{model.get('implementation', 'dense')} attention: "
               f"{r:.3f}x{spread} -> {'met' if r <= 1.05 else 'NOT met'} (target <= 1.05x)")
  for scheme in ("plain", "shaw"):
    c = data["lengths"].get("4096", {}).get(f"{scheme}/chunked", {}).get("memory", {}).get("peak")
    d = data["lengths"].get("4096", {}).get(f"{scheme}/dense", {}).get("memory", {}).get("peak")
    if c and d:
      out.append(f"{scheme} chunked / dense peak memory at L=4096: {c / machine.GB:.3f} / {d / machine.GB:.3f} GB = "
                 f"{c / d:.3f} -> {'met' if c <= d / 4 else 'NOT met'} (target <= 1/4)")
  return out


# ----------------------------------------------------------------------------
# The command.


FLAGS = flags.FLAGS


def run(s: attention.Settings, out: str, command: str) -> dict:
  """Measures every length, the long run, the RSS check and the model step as ``s`` asks; writes the report."""
  date = datetime.datetime.now().isoformat(timespec="seconds")
  data = {"command": command, "args": dataclasses.asdict(s), "date": date,
          "machine": machine.machine(), "load_start": round(os.getloadavg()[0], 2), "lengths": {}}
  print(json.dumps(data["machine"]), flush=True)
  for n in s.lengths:
    print(f"length {n}", flush=True)
    data["lengths"][str(n)] = attention.run_length(attention.CONFIGS, n, s, s.batch, s.repeats)
    write(data, out)  # partial results survive an interrupted run
  if s.long_length:
    print(f"long: length {s.long_length}, batch 1", flush=True)
    data["long"] = {"length": s.long_length, "batch": 1,
                    "results": attention.run_length(attention.LONG_CONFIGS, s.long_length, s, 1, s.long_repeats)}
  if s.rss_lengths:
    data["rss"] = {str(n): attention.rss_check(attention.RSS_CONFIGS, n, s.batch, s) for n in s.rss_lengths}
  if s.model_step:
    print("model step", flush=True)
    data["model_step"] = attention.model_step(s)
  data["load_end"] = round(os.getloadavg()[0], 2)
  data["targets"] = check_targets(data)
  write(data, out)
  return data


def define_flags() -> None:
  """The ``bench attention`` verb's flags: a flag per Settings field, ``--out``, ``--report_only`` and the internal
  ``--rss_child``."""
  settings_lib.define(attention.Settings)
  flags.DEFINE_string("out", None, "Output directory (default experiments/results/bench, or bench/quick with --quick).")
  flags.DEFINE_bool("report_only", False, "Re-render README.md from --out's results.json (e.g. after editing "
                    "notes.md).")
  flags.DEFINE_string("rss_child", None, "Internal: 'name,implementation,length,batch': print the RSS growth of one "
                      "call of that configuration (run by --rss_lengths in a fresh process).")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  s = settings_lib.parse(attention.Settings)
  if s.quick:
    s = dataclasses.replace(s, **attention.QUICK)
  if FLAGS.rss_child:
    name, implementation, length, batch = FLAGS.rss_child.split(",")
    print(json.dumps(attention.child_rss(name, implementation, int(length), int(batch), s)))
    return
  out = FLAGS.out or os.path.join(machine.ROOT, "experiments", "results", "bench", "quick" if s.quick else "")
  if FLAGS.report_only:
    with open(os.path.join(out, "results.json")) as f:
      data = json.load(f)
    data["targets"] = check_targets(data)
    write(data, out)
    return
  data = run(s, out, machine.command())
  print("\n".join(data["targets"]))
  print(f"wrote {out}/results.json and README.md")
