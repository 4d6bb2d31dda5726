"""The arithmetic experiment's report columns and sections: ceilings, checks, attention maps.

Seed 002's claim is that a model which cannot see the input order cannot
do "12+1". A report of arithmetic runs holds every group to the ceiling its
scheme allows (``ReportSpec.bound``, ``--bound``), through what this module
registers with ``experiments.columns``:

* the column ``ceiling``: which ceiling a group's config is bound by
  (:func:`blind_view`: ``bag`` for no position information in the encoder,
  ``none``, Shaw with k = 0 or with neither a^K nor a^V; ``reversal`` for
  symmetric ALiBi, which sees distance but not direction; or none: the scheme
  sees the order), with the ceiling's value computed exactly from the data
  (:func:`bounds`, cached as ``bounds.json``) and drawn on the plot;
* the section ``checks``: every run of a bound group under its ceiling, and
  with ``target`` (``--target``) every run of the other groups at least there;
* the section ``bounds``: the bounds' three forms and what they mean;
* the section ``attention`` (``--attention``): the encoder attention of
  "21+211" and "12+1" for the lowest-seed run of each group, and how far the
  rows of the two "1"s of "12+1" differ (exactly 0 without position information).

The attention maps (:func:`encoder_attention`, :func:`row_difference`,
:func:`plot`) are every layer and head of a trained run's encoder, as in
seed 002. Run the sweeps with ``python -m experiments sweep arithmetic`` (or
``arithmetic_full``); the command of their report is the sweep's.
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional, Sequence

import numpy as np

from experiments import columns
from experiments import engine
from experiments import render
from experiments import runs as runs_lib

VIEWS = ("bag", "reversal")
TEXTS = ("21+211", "12+1")
ONES = (0, 3)  # "12+1": the tens-place "1" and the units-place "1"


def blind_view(config: dict) -> Optional[str]:
  """The ceiling a run is bound by (``bag``, ``reversal``) or None, from its flat config (``runs.flatten``)."""
  position = config.get("position")
  if position == "none":
    return "bag"
  if position == "shaw" and (config.get("max_distance") == 0
                             or not (config.get("use_keys", True) or config.get("use_values", True))):
    return "bag"  # one relative vector for every offset, or none at all: the encoder is permutation-equivariant
  if position == "alibi":
    return "reversal"
  return None


def bounds(config_name: str, path: Optional[str], views: Sequence[str] = VIEWS) -> dict[str, float]:
  """``rpr.data.bounds.arithmetic_bounds`` (tens of seconds on the full set), cached as JSON at ``path``."""
  from rpr.data import bounds as bounds_lib

  if path and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      cached = json.load(f)
    if cached.get("config") == config_name and all(f"{v}_all" in cached["bounds"] for v in views):
      return cached["bounds"]
  result = bounds_lib.arithmetic_bounds(config_name, views)
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"config": config_name, "bounds": result}, f, indent=2, sort_keys=True)
  return result


def data_set_of(runs: Sequence[runs_lib.RunRecord]) -> str:
  """The one arithmetic data set (config name) all ``runs`` share.

  Raises:
    ValueError: if the runs are of another data set, or of several.
  """
  names = {(r.config.get("dataset"), r.config.get("arithmetic_config")) for r in runs}
  if len(names) != 1 or next(iter(names))[0] != "arithmetic":
    raise ValueError(f"--bound needs runs of one arithmetic data set, got (dataset, config) {sorted(names)}")
  return next(iter(names))[1]


def report_bounds(report: columns.Report) -> dict[str, float]:
  """The bounds of the report's data set for ``spec.bound``, computed once per report (``<out>/bounds.json``)."""
  if "bounds" not in report.cache:
    views = report.spec.bound
    if set(views) - set(VIEWS):
      raise ValueError(f"bound={list(views)!r}; allowed: {list(VIEWS)}")
    report.cache["bounds"] = bounds(data_set_of(report.runs), os.path.join(report.out, "bounds.json"), views)
  return report.cache["bounds"]


def _bound_lines(report: columns.Report) -> list[tuple[str, float]]:
  b = report_bounds(report)
  return [(f"{v} bound, whole set ({b[v + '_all']:.4f})", b[v + "_all"]) for v in report.spec.bound]


def _ceiling_text(view: Optional[str], report: columns.Report) -> str:
  b = report_bounds(report)
  return f"{view}: {b[view + '_all']:.4f} / {b[view + '_test']:.4f}" if view else "sees the order"


@columns.column("ceiling", "ceiling (whole set / test oracle)", order=80, text=_ceiling_text, record="view",
                shown=lambda report: bool(report.spec.bound), lines=_bound_lines, reads=("bound",))
def ceiling(group: runs_lib.Group, report: columns.Report) -> Optional[str]:
  """The view of ``spec.bound`` that bounds the group (None: the group sees the order)."""
  report_bounds(report)  # a report of other data fails here, before any cell
  view = blind_view(group.config)
  return view if view in report.spec.bound else None


def checks(groups: Sequence[runs_lib.Group], bound: dict[str, float],
           target: Optional[float]) -> list[tuple[str, bool]]:
  """Per group: every run under its ceiling (whole set and test-split oracle), or every run at least ``target``."""
  out = []
  for g in groups:
    values, view = g.values, g.cells.get("ceiling")
    if view and f"{view}_all" in bound:
      for kind in ("all", "test"):
        out.append((f"{g.label}: every run <= {view} bound ({kind}) {bound[f'{view}_{kind}']:.4f}",
                    max(values) <= bound[f"{view}_{kind}"]))
    elif not view and target is not None:
      out.append((f"{g.label}: every run >= {target:.4f}", min(values) >= target))
  return out


@columns.section("checks", order=10, shown=lambda report: bool(report.spec.bound) or report.spec.target is not None,
                 reads=("target",))
def checks_section(report: columns.Report) -> list[str]:
  """PASS or FAIL per claim of :func:`checks`."""
  found = checks(report.groups, report_bounds(report) if report.spec.bound else {}, report.spec.target)
  if not found:
    return []
  return ["Checks:", ""] + [f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in found] + [""]


BOUND_TEXT = """\
### What a model that cannot see the order can reach

The bag-of-characters bound. An encoder without position information (no
absolute encoding, no relative term, no causal mask) is permutation-equivariant:
every layer treats all positions alike, so permuting the input characters
permutes the encoder states and changes nothing else. The decoder reads the
encoder only through cross-attention (here without positions), and softmax
attention over a set of (key, value) pairs does not depend on their order. So
the whole model, however large and however trained, is a function of the
multiset of input characters: "12+1", "21+1" and "1+12" get the same answer.
Its exact match is at most, summed over groups of inputs with the same
multiset, the count of the group's most frequent answer, over N. Shaw's k = 0
clips every offset to one vector and is bound by it too.

Symmetric ALiBi (bias -m|i - j|) sees distances but not directions: with pads
masked, reversing the input reverses the encoder states, and cross-attention
sees the same set, so it cannot tell "12+1" from "1+21". Its ceiling is the
reversal bound (grouping an input with its reverse).

Computed exactly from `{name}` ({n:,} examples):

| bound | bag of characters | reversal (symmetric ALiBi) | what it is |
| --- | --- | --- | --- |
| whole data set | {bag_all} | {reversal_all} | best accuracy of any such function over all examples; the expected test accuracy of a uniformly drawn held-out set (the Bayes rate) |
| fitted on train, scored on test | {bag_fitted} | {reversal_fitted} | the most frequent train answer per group (a group absent from train scores 0); not a ceiling: a model can generalise to groups it never saw |
| best per group on the test split | {bag_test} | {reversal_test} | a hard ceiling for this test split, but loose: most test groups hold one example |

The ceilings are not predictions: a real model may confuse more inputs than they allow.
"""


def bounds_text(name: str, bound: dict[str, float]) -> str:
  """The bounds' section: what they are, and their values for the data set ``name`` (``n/a`` where not computed)."""
  from rpr.data import arithmetic as data

  cells = {k: f"{100 * bound[k]:.2f}%" if k in bound else "n/a"
           for k in (f"{v}_{kind}" for v in VIEWS for kind in ("all", "fitted", "test"))}
  return BOUND_TEXT.format(name=name, n=data.config_by_name(name).num_examples, **cells)


@columns.section("bounds", order=20, shown=lambda report: bool(report.spec.bound))
def bounds_section(report: columns.Report) -> list[str]:
  return [bounds_text(data_set_of(report.runs), report_bounds(report)), ""]


@columns.section("attention", order=30, shown=lambda report: report.spec.attention, reads=("attention",))
def attention_section(report: columns.Report) -> list[str]:
  """Per group the attention figure of its lowest-seed run and the "12+1" row difference (recorded in runs.json)."""
  import ml_collections

  rows = []
  for g in report.groups:
    first = min(g.run_values(), key=lambda run: run["seed"])
    config = ml_collections.ConfigDict(next(r.raw_config for r in g.runs if r.workdir == first["workdir"]))
    params = engine.load_params(first["workdir"])
    maps = {t: encoder_attention(config, params, t) for t in TEXTS}
    diff = row_difference(maps["12+1"], *ONES)
    figure = "attention_" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", g.label) + ".png"
    plot(maps, f"{g.label}, seed {first['seed']}: encoder self-attention\n"
                        f'"12+1": rows 0 and 3 (the two "1"s) differ by at most {diff:.3g}',
                        os.path.join(report.out, figure))
    g.record["row_difference_12+1"] = diff
    rows.append([g.label, first["seed"], f"{diff:.3g}", f"[{figure}]({figure})"])
  return ["## Attention maps", "",
          'Encoder self-attention, every layer and head, for "21+211" and "12+1" (rows: queries, columns: '
          'keys), of the lowest-seed run of each group. Beside each: the max abs difference, over every layer '
          'and head, between the rows of the two "1"s of "12+1" (indices 0 and 3). Without position '
          "information it is exactly zero: equal characters get equal states.", "",
          render.markdown_table(['variant', 'seed', 'max abs row difference, "12+1" rows 0 and 3', 'figure'], rows),
          ""]


# Attention maps: every layer and head of the encoder, for a given input. Without position information the encoder
# is permutation-equivariant, so two equal characters get equal states and exactly equal rows in every layer and head.


def encoder_attention(config, params, text: str) -> np.ndarray:
  """Encoder self-attention weights ``[layers, heads, len(text), len(text)]`` for one input."""
  import jax.numpy as jnp

  from rpr.data import arithmetic as data
  from rpr.data.task import CharVocab

  vocab = CharVocab(data.VOCAB_CHARS)
  model = engine.model(config, vocab.size)
  length = data.config_by_name(config.arithmetic_config).max_input_length
  ids = np.zeros((1, max(length, len(text))), np.int32)  # right-padded with PAD (masked), as in training
  ids[0, :len(text)] = vocab.encode(text)
  _, state = model.apply({"params": params}, jnp.asarray(ids), method=type(model).encode, mutable=["intermediates"])
  enc = state["intermediates"]["encoder"]
  layers = sorted((k for k in enc if k.startswith("layer_")), key=lambda k: int(k.split("_")[1]))
  weights = [np.asarray(enc[k]["self_attention"]["attention_weights"][0])[0] for k in layers]  # [h, q, k]
  return np.stack(weights)[:, :, :len(text), :len(text)]


def row_difference(weights: np.ndarray, i: int, j: int) -> float:
  """Max abs difference between query rows ``i`` and ``j`` over every layer and head of ``[l, h, q, k]``."""
  return float(np.max(np.abs(weights[:, :, i, :] - weights[:, :, j, :])))


def plot(maps: dict[str, np.ndarray], title: str, path: str) -> None:
  """One figure: a row per (input, layer), a column per head; query on y, key on x."""
  plt = render.pyplot()
  rows = [(text, layer) for text, w in maps.items() for layer in range(w.shape[0])]
  heads = next(iter(maps.values())).shape[1]
  fig, axes = plt.subplots(len(rows), heads, figsize=(2.1 * heads, 2.1 * len(rows)), squeeze=False)
  for r, (text, layer) in enumerate(rows):
    for h in range(heads):
      ax = axes[r, h]
      ax.imshow(maps[text][layer, h], vmin=0.0, vmax=1.0, cmap="viridis")
      ax.set_xticks(range(len(text)), list(text))
      ax.set_yticks(range(len(text)), list(text))
      ax.tick_params(length=0, labelsize=8)
      ax.set_title(f'"{text}" layer {layer} head {h}', fontsize=7)
  fig.suptitle(title, fontsize=9)
  render.save(fig, path, dpi=90)

