"""One config trained once per position scheme, side by side with the accuracy a position-blind model can reach.

``compare_positions(config, workdir, schemes)`` is what ``python run.py``
does without flags: it trains the config once per scheme, each in
``workdir/<scheme>`` (resumable, and a finished run is not redone), then
prints every scheme's test exact match beside the bag-of-characters bound of
:mod:`rpr.data.bounds` (arithmetic data only). ``experiments/arithmetic.py``
builds the full sweep (all schemes, several seeds, report, attention maps)
from the same pieces.

Scheme names are those of :data:`rpr.attention.positions.SCHEMES`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional, Sequence

from absl import logging

from rpr.attention import positions

def scheme_names() -> list[str]:
  return sorted(positions.SCHEMES)


def with_scheme(config, scheme: str):
  """A copy of ``config`` whose encoder and decoder self-attention use ``scheme``."""
  if scheme not in scheme_names():
    raise ValueError(f"unknown scheme {scheme!r}; allowed: {scheme_names()}")
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.model.position = scheme
  return c


def train_run(config, workdir: str) -> dict:
  """Trains ``config`` in ``workdir`` unless it finished (:func:`experiments.sweep.finished`); returns its record.

  The record: ``metrics`` (final metrics of :func:`rpr.train.train_and_evaluate`)
  and ``seconds`` (wall time of the call: data loading, compilation, training
  and the final evaluation), kept in ``workdir/result.json``. A resumed run's
  seconds cover the last call only.
  """
  from experiments import sweep
  from rpr import train  # JAX, TFDS: imported when a run starts

  path = os.path.join(workdir, "result.json")
  if sweep.finished(workdir, config) and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    logging.info("%s already finished; not training again.", workdir)
    return record
  start = time.time()
  metrics = train.train_and_evaluate(config, workdir)
  record = {"metrics": metrics, "seconds": time.time() - start}
  if not metrics.get("stopped_by_signal"):
    with open(path, "w", encoding="utf-8") as f:
      json.dump(record, f, indent=2, sort_keys=True)
  return record


def cached_bounds(config_name: str, path: Optional[str], views: Sequence[str] = ("bag",)) -> dict[str, float]:
  """``rpr.data.bounds.arithmetic_bounds`` (tens of seconds on the full set), cached as JSON at ``path``."""
  from rpr.data import bounds

  if path and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      cached = json.load(f)
    if cached.get("config") == config_name and all(f"{v}_all" in cached["bounds"] for v in views):
      return cached["bounds"]
  result = bounds.arithmetic_bounds(config_name, views)
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"config": config_name, "bounds": result}, f, indent=2, sort_keys=True)
  return result


def compare_positions(config, workdir: str, schemes: Sequence[str]) -> dict:
  """Trains ``config`` once per scheme of ``schemes`` and prints the comparison.

  Returns ``{"runs": {scheme: record}, "bounds": {...}}``.
  """
  runs = {}
  for scheme in schemes:
    logging.info("Training with position scheme %r.", scheme)
    runs[scheme] = train_run(with_scheme(config, scheme), os.path.join(workdir, scheme))
  bound = {}
  if config.dataset == "arithmetic":
    bound = cached_bounds(config.arithmetic_config, os.path.join(workdir, "bounds.json"))
  split = config.eval_splits[0]
  lines = [f"{'scheme':<20} {split + '/exact_match':>18} {'seconds':>8}"]
  for scheme, record in runs.items():
    lines.append(f"{scheme:<20} {record['metrics'].get(split + '/exact_match', float('nan')):>18.4f} "
                 f"{record['seconds']:>8.0f}")
  if bound:
    lines += [
        f"Bag-of-characters bound (best exact match of any model that sees no input order), "
        f"{config.arithmetic_config}:",
        f"  {bound['bag_all']:.4f} over the whole data set (the expected test accuracy of the best such model),",
        f"  {bound['bag_fitted']:.4f} for the most frequent train answer per multiset, scored on test (not a "
        "ceiling: a model can generalise to multisets it never saw),",
        f"  {bound['bag_test']:.4f} as an oracle on the test split itself (loose: most test groups are singletons).",
    ]
  print("\n".join(lines), flush=True)
  return {"runs": runs, "bounds": bound}
