"""Every position scheme on seed 002's arithmetic, several seeds each, then the report.

Command (from the repository root)::

  .venv/bin/python -m experiments.arithmetic --root=workdirs/arithmetic

trains ``configs/arithmetic.py`` once per scheme and seed (one workdir per
run, ``<root>/<scheme>/seed<k>``; a finished run is not redone, so an
interrupted sweep resumes), computes the bag-of-characters and reversal
bounds from the data (:mod:`rpr.data.bounds`), draws the encoder attention
maps of the seed-0 models for "21+211" and "12+1", and writes
``report.md``, ``results.json`` and ``attention_<scheme>.png`` to ``--out``
(default ``experiments/results/arithmetic``). Single config keys are
overridden as in run.py, e.g. ``--config.num_train_steps=100``.

Schemes: ``none`` (no position information), ``sinusoidal``, ``learned``,
``shaw``, ``t5``, ``rope``, ``alibi`` (symmetric, as in the ALiBi paper: sees
distance, not direction) and ``alibi_directional``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shlex
import signal
import sys
import time

import numpy as np
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments import compare
from rpr.attention import positions

SCHEMES = tuple(positions.SCHEMES)  # the registry: none, sinusoidal, learned, shaw, t5, rope, alibi, alibi_directional
# What each scheme's encoder can see of the input order, and the bound that follows.
SEES = {"none": "nothing (bag of characters)", "alibi": "distance, not direction (reversal)"}
BOUND_VIEW = {"none": "bag", "alibi": "reversal"}
TEXTS = ("21+211", "12+1")
ONES = (0, 3)  # "12+1": the tens-place "1" and the units-place "1"
TARGET = 0.99

_HERE = os.path.dirname(os.path.abspath(__file__))


def _define_flags() -> dict:
  """The command-line flags, defined only when this module runs as a script.

  Tests import this module beside experiments.sweep, which has flags of the same names.
  """
  return dict(
      config=config_flags.DEFINE_config_file(
          "config", os.path.join(_HERE, os.pardir, "configs", "arithmetic.py"),
          "Config of every run (its pe is replaced)."),
      root=flags.DEFINE_string("root", "workdirs/arithmetic", "One workdir per run: <root>/<scheme>/seed<k>."),
      out=flags.DEFINE_string("out", os.path.join(_HERE, "results", "arithmetic"), "Report, JSON and figures."),
      seeds=flags.DEFINE_integer("seeds", 3, "Seeds per scheme: 0 .. seeds-1."),
      schemes=flags.DEFINE_list("schemes", list(SCHEMES), "Schemes to train."),
      workers=flags.DEFINE_integer("workers", 1, "Train this many runs at once, each in its own single-threaded "
                                   "process (on 2 cores, 2 single-threaded runs beat 1 two-threaded run)."),
      worker=flags.DEFINE_string("worker", "", "Internal: 'i/n' trains runs i, i+n, i+2n, ... and exits."),
      cache=flags.DEFINE_string("compilation_cache", "{root}/jax_cache",
                                "JAX persistent compilation cache ('' for none): the seeds of a scheme compile once."),
      note=flags.DEFINE_string("note", "", "A paragraph printed under the report's title (context of this sweep)."),
  )


SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def run_sweep(config, root: str, schemes, seeds: int, worker: tuple[int, int] = (0, 1)) -> list[dict]:
  """Trains every (seed, scheme), seed-major so a partial sweep already covers every scheme.

  ``worker = (i, n)`` keeps runs i, i+n, ... of that order (one of n parallel workers).
  """
  runs = []
  order = [(seed, scheme) for seed in range(seeds) for scheme in schemes]
  for seed, scheme in order[worker[0]::worker[1]]:
    c = compare.with_scheme(config, scheme)
    c.seed = seed
    logging.info("Run %s seed %d.", scheme, seed)
    workdir = os.path.join(root, scheme, f"seed{seed}")
    record = compare.train_run(c, workdir)
    if record["metrics"].get("stopped_by_signal"):
      raise SystemExit(f"{scheme} seed {seed} stopped by a signal (checkpoint saved); run the same command "
                       "again to resume the sweep")
    # When the run ended: its result.json was written then (kept by a re-run that skips it).
    finished = os.path.getmtime(os.path.join(workdir, "result.json"))
    runs.append({"scheme": scheme, "seed": seed, "finished": finished, **record})
  return runs


def training_span(runs: list[dict]) -> float:
  """Seconds from the start of the earliest run to the end of the latest (their wall clock, however invoked)."""
  return max(r["finished"] for r in runs) - min(r["finished"] - r["seconds"] for r in runs)


def run_workers(n: int) -> None:
  """Runs this command in ``n`` single-threaded worker processes (``--worker=i/n``) and waits for them."""
  import subprocess

  env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD).strip())
  repo = os.path.dirname(_HERE)
  procs = [subprocess.Popen([sys.executable, "-m", "experiments.arithmetic", *sys.argv[1:], f"--worker={i}/{n}"],
                            cwd=repo, env=env) for i in range(n)]
  # SIGTERM to this process stops every worker after its current step (each saves a checkpoint).
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: [p.send_signal(signum) for p in procs])
  try:
    codes = [p.wait() for p in procs]
  finally:
    signal.signal(signal.SIGTERM, previous)
  if any(codes):
    raise RuntimeError(f"worker exit codes {codes}")


def summarise(runs: list[dict], split: str = "test") -> dict[str, dict]:
  """Per scheme: exact match mean, sample std, min, max and per seed; mean seconds per run."""
  out = {}
  for scheme in dict.fromkeys(r["scheme"] for r in runs):
    rs = sorted((r for r in runs if r["scheme"] == scheme), key=lambda r: r["seed"])
    em = np.array([r["metrics"][f"{split}/exact_match"] for r in rs])
    out[scheme] = {
        "exact_match_mean": float(em.mean()), "exact_match_std": float(em.std(ddof=1)) if len(em) > 1 else 0.0,
        "exact_match_min": float(em.min()), "exact_match_max": float(em.max()),
        "exact_match_per_seed": {str(r["seed"]): float(e) for r, e in zip(rs, em)},
        "token_accuracy_mean": float(np.mean([r["metrics"][f"{split}/accuracy"] for r in rs])),
        "seconds_mean": float(np.mean([r["seconds"] for r in rs])), "seeds": len(rs),
    }
  return out


def attention(config, root: str, schemes, out_dir: str) -> dict[str, dict]:
  """Figures of the seed-0 models' encoder attention; the measured row difference of the two "1"s."""
  from experiments import attention_maps

  out = {}
  for scheme in schemes:
    c = compare.with_scheme(config, scheme)
    params = attention_maps.load_params(os.path.join(root, scheme, "seed0"))
    maps = {t: attention_maps.encoder_attention(c, params, t) for t in TEXTS}
    diff = attention_maps.row_difference(maps["12+1"], *ONES)
    figure = f"attention_{scheme}.png"
    attention_maps.plot(maps, f"{scheme}: encoder self-attention (query rows, key columns), seed 0\n"
                        f'"12+1": rows 0 and 3 (the two "1"s) differ by at most {diff:.3g}',
                        os.path.join(out_dir, figure))
    out[scheme] = {"row_difference_12+1": diff, "figure": figure}
  return out


def _pct(x: float) -> str:
  return f"{100 * x:.2f}%"


def check(summary: dict, bounds: dict) -> dict[str, bool]:
  """The claims: order-aware schemes reach the target on every seed; blind ones stay under their bounds."""
  out = {}
  for scheme, s in summary.items():
    view = BOUND_VIEW.get(scheme)
    if view is None:
      out[f"{scheme}: every seed >= {_pct(TARGET)}"] = s["exact_match_min"] >= TARGET
    else:
      for kind in ("all", "test"):
        key = f"{view}_{kind}"
        if key in bounds:
          out[f"{scheme}: every seed <= {view} bound ({kind}) {_pct(bounds[key])}"] = (
              s["exact_match_max"] <= bounds[key])
  return out


BOUND_TEXT = """\
### Bounds: what a model that cannot see the order can reach

The bag-of-characters bound. An encoder without position information (no
absolute encoding, no relative term, no causal mask) is permutation-equivariant:
every layer treats all positions alike (token-wise maps, and attention scores
that depend only on the token states), so permuting the input characters
permutes the encoder states and changes nothing else. The decoder reads the
encoder only through cross-attention (here without positions), and softmax
attention over a set of (key, value) pairs does not depend on their order: it
sees the multiset. So the whole model, however large and however trained, is a
function of the multiset of input characters: "12+1", "21+1" and "1+12" get
the same answer. Its exact match is at most, summed over groups of inputs with
the same multiset, the count of the group's most frequent answer, over N.
Padding changes nothing (pads are masked; their number is a function of the
multiset's size); the decoder's own positions index the output, not the input.
The attention maps below show it directly: without encoding the two "1"s of
"12+1" get identical attention rows, in every layer and head.

Three numbers, all computed exactly from the data ({config}). The first is
the bound a position-blind model is held to in expectation, the last holds for
this test split whatever the model:

| bound | bag of characters | reversal (symmetric ALiBi) | what it is |
| --- | --- | --- | --- |
| whole data set | {bag_all} | {reversal_all} | best accuracy of any such function over all {n:,} examples; the expected test accuracy of a uniformly drawn held-out set, i.e. the Bayes rate |
| fitted on train, scored on test | {bag_fitted} | {reversal_fitted} | what one such predictor scores: per group, the most frequent train answer (a group absent from train scores 0). Not a ceiling: a model can beat it by generalising to groups it never saw |
| best per group on the test split | {bag_test} | {reversal_test} | a hard ceiling for the 10k test examples, but loose: most test groups hold one example, which the oracle always gets right |

What would break the bound: any position information reaching the encoder.
Absolute encodings (sinusoidal, learned); directional relative terms (Shaw's
a^K / a^V with k >= 1, T5's bidirectional buckets, RoPE, directional ALiBi);
a causal mask in the encoder or a decoder-only model (counting predecessors
recovers positions); convolutions or recurrence; or positions in the
encoder-decoder attention. Shaw's k = 0 clips every offset to one vector and
is still bound by it.

Symmetric ALiBi (bias -m|i - j|) sees distances but not directions: with pads
masked, reversing the input reverses the encoder states, and cross-attention
sees the same set, so it cannot tell "12+1" from "1+21". Its ceiling is the
reversal bound (grouping an input with its reverse). The ceilings are not
predictions: a real model may confuse more inputs than they allow.
"""


def write_report(out_dir: str, *, command: str, config, runs: list[dict], bounds: dict, attention_diffs: dict,
                 timings: dict, workers: int = 1, note: str = "", split: str = "test") -> tuple[str, str]:
  """Writes ``report.md`` and ``results.json`` to ``out_dir``; returns their paths.

  ``timings``: seconds, ``training`` (from the start of the first run to the
  end of the last, across invocations) and ``total`` (this invocation, with the
  bounds and the attention figures).
  """
  os.makedirs(out_dir, exist_ok=True)
  summary = summarise(runs, split)
  checks = check(summary, bounds)
  from rpr.data import arithmetic

  data = arithmetic.config_by_name(config.arithmetic_config)
  full = arithmetic.config_by_name(arithmetic.ArithmeticBuilder.DEFAULT_BUILDER_CONFIG_NAME)
  examples_seen = config.num_train_steps * config.batch_size
  m = config.model
  lines = [
      "# Arithmetic (seed 002): position schemes against the bag-of-characters bound", "",
      *([note, ""] if note else []),
      *([f"**Smaller operand range.** This sweep trains and tests on `{data.name}`, operands below "
         f"{data.max_operand}, not on the seed's full set `{full.name}` (operands below {full.max_operand}, "
         f"{full.num_examples:,} examples).", ""] if data.name != full.name else []),
      "Made by:", "", f"    {command}", "",
      f"Data: `{data.name}` ({data.description}); test split {data.test_size:,} examples held out, "
      f"never trained on. Each run sees {examples_seen:,} training examples "
      f"({examples_seen / (data.num_examples - data.test_size):.2f} epochs). "
      f"Exact match is greedy decoding of the whole test split, answer and EOS all right.", "",
      f"Recipe (configs/arithmetic.py): d_model {m.d_model}, {m.num_heads} heads, d_ff {m.d_ff}, "
      f"{m.num_encoder_layers}+{m.num_decoder_layers} layers, "
      f"{'pre' if m.pre_layer_norm else 'post'}-LN, dropout {m.dropout_rate}, "
      f"{config.optimizer} lr {config.learning_rate} ({config.schedule}, warm-up {config.warmup_steps}), "
      f"batch {config.batch_size}, {config.num_train_steps} steps, label smoothing {config.label_smoothing}, "
      f"gradient clip {config.grad_clip_norm}; Shaw k = {m.position_options.max_distance}.", "",
      f"Machine: {os.cpu_count()} CPU cores ({platform.machine()}), shared with other jobs. Sweep wall time: "
      f"{timings['training'] / 60:.1f} min to train and evaluate the {len(runs)} runs, from the start of the "
      f"first to the end of the last ({workers} at a time{', each single-threaded' if workers > 1 else ''}); "
      f"this invocation of the command took {timings['total'] / 60:.1f} min in all (a re-run skips finished "
      "runs and only redraws the figures and the report). Seconds per run (below) include data loading, "
      "compilation, training and the final evaluation of the whole test split.", "",
      f"## Test exact match ({len(runs)} runs)", "",
      "| scheme | encoder sees of the order | exact match, mean ± std | min - max | per seed | token accuracy "
      "| ceiling (whole set / test-split oracle) | seconds per run |",
      "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for scheme, s in summary.items():
    view = BOUND_VIEW.get(scheme)
    ceiling = (f"{view}: {_pct(bounds[view + '_all'])} / {_pct(bounds[view + '_test'])}"
               if view and f"{view}_all" in bounds else "1 (sees the order)")
    per_seed = ", ".join(_pct(v) for v in s["exact_match_per_seed"].values())
    lines.append(f"| {scheme} | {SEES.get(scheme, 'order')} | {_pct(s['exact_match_mean'])} ± "
                 f"{_pct(s['exact_match_std'])} | {_pct(s['exact_match_min'])} - {_pct(s['exact_match_max'])} | "
                 f"{per_seed} | {_pct(s['token_accuracy_mean'])} | {ceiling} | {s['seconds_mean']:.0f} |")
  lines += ["", "Checks:", ""] + [f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in checks.items()] + [""]
  if bounds:
    fmt = {k: _pct(v) for k, v in bounds.items()}
    lines.append(BOUND_TEXT.format(config=f"`{data.name}`", n=data.num_examples, **{
        k: fmt.get(k, "n/a") for k in ("bag_all", "bag_test", "bag_fitted", "reversal_all", "reversal_test",
                                       "reversal_fitted")}))
  if attention_diffs:
    lines += [
        "## Attention maps", "",
        'Encoder self-attention of the seed-0 models, every layer and head, for "21+211" and "12+1" (rows: '
        'queries, columns: keys). Beside each scheme: the measured max abs difference, over every layer and '
        'head, between the attention rows of the two "1"s of "12+1" (the tens-place "1" at index 0 and the '
        "units-place \"1\" at index 3). Without encoding it is exactly zero: equal characters get equal "
        "states, so the model cannot tell the two digits' places apart.", "",
        "| scheme | max abs row difference, \"12+1\" rows 0 and 3 | figure |", "| --- | --- | --- |",
    ]
    for scheme, a in attention_diffs.items():
      lines.append(f"| {scheme} | {a['row_difference_12+1']:.3g} | [{a['figure']}]({a['figure']}) |")
    lines.append("")
  md = os.path.join(out_dir, "report.md")
  with open(md, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  record = {
      "command": command, "config": json.loads(config.to_json_best_effort()), "wall_seconds": timings,
      "workers": workers, "note": note,
      "summary": summary, "checks": checks, "bounds": bounds, "attention": attention_diffs,
      "runs": [{k: r[k] for k in ("scheme", "seed", "seconds", "metrics") if k in r} for r in runs],
  }
  js = os.path.join(out_dir, "results.json")
  with open(js, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2, sort_keys=True)
  return md, js


def main(argv, f: dict):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  start = time.time()
  config, root, out = f["config"].value, f["root"].value, f["out"].value
  unknown = sorted(set(f["schemes"].value) - set(compare.scheme_names()))
  if unknown:
    raise app.UsageError(f"unknown schemes {unknown}; allowed: {compare.scheme_names()}")
  if f["cache"].value:
    import jax

    jax.config.update("jax_compilation_cache_dir", f["cache"].value.format(root=root))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  if f["worker"].value:
    i, n = (int(v) for v in f["worker"].value.split("/"))
    run_sweep(config, root, f["schemes"].value, f["seeds"].value, (i, n))
    return
  if f["workers"].value > 1:
    if config.dataset == "arithmetic":  # generate the data once, before the workers race to
      from rpr.data import arithmetic

      arithmetic.prepare(config.arithmetic_config, os.path.expanduser(config.data_dir))
    run_workers(f["workers"].value)
  runs = run_sweep(config, root, f["schemes"].value, f["seeds"].value)
  timings = {"training": training_span(runs)}
  bounds = compare.cached_bounds(config.arithmetic_config, os.path.join(root, "bounds.json"), ("bag", "reversal"))
  os.makedirs(out, exist_ok=True)
  diffs = attention(config, root, f["schemes"].value, out)
  timings["total"] = time.time() - start
  command = "python -m experiments.arithmetic " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  md, _ = write_report(out, command=command, config=config, runs=runs, bounds=bounds, attention_diffs=diffs,
                       timings=timings, workers=f["workers"].value, note=f["note"].value)
  print(open(md, encoding="utf-8").read())


if __name__ == "__main__":
  app.run(functools.partial(main, f=_define_flags()))
