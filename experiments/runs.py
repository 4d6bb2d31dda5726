"""Finished runs, read from their workdirs: each a ``config.json`` and a ``metrics.jsonl``, as the engine writes them.

:func:`load_runs` reads every run a set of globs matches, its config flat by leaf name (:func:`flatten`) and its
records in step order (:class:`RunRecord`); :func:`series` is one metric of a run against the step.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Any, Optional, Sequence

from experiments import engine
from rpr import records as records_lib


@dataclasses.dataclass
class RunRecord:
  """One run: its workdir, its config flat by leaf name (:func:`flatten`), its metric records in order."""
  workdir: str
  config: dict
  records: list[dict]

  @property
  def seed(self) -> Any:
    return self.config.get("seed")

  def end(self) -> Optional[int]:
    """The run's last step (:func:`rpr.records.end_step`): where its plateau rule stopped it, else
    ``num_train_steps`` (None if the config has neither)."""
    stopped = engine.plateau_step(self.records)
    cap = self.config.get("num_train_steps")
    return stopped if cap is None else engine.end_step(self.records, cap)

  def last(self, metric: str) -> Optional[tuple[int, float]]:
    """(step, value) of the last record holding ``metric`` as a number; None if none does."""
    for r in reversed(self.records):
      if metric in r and isinstance(r[metric], (int, float)):
        return int(r["step"]), float(r[metric])
    return None


def load_runs(patterns: Sequence[str]) -> list[RunRecord]:
  """Every workdir matched by ``patterns`` that holds ``config.json`` and ``metrics.jsonl``, sorted by path with
  its numbers read as numbers (``k=2`` before ``k=16``, ``seed2`` before ``seed10``).

  A step logged twice (a run restarted from an earlier checkpoint) keeps its later record (:func:`records`).
  """
  runs = []
  for workdir in sorted({p for pattern in patterns for p in glob.glob(pattern)}, key=natural_key):
    config_path, metrics_path = os.path.join(workdir, "config.json"), os.path.join(workdir, "metrics.jsonl")
    if not (os.path.isfile(config_path) and os.path.isfile(metrics_path)):
      continue
    with open(config_path, encoding="utf-8") as f:
      raw = json.load(f)["config"]
    runs.append(RunRecord(workdir, flatten(engine.recorded_config(raw)), records(workdir)))
  return runs


def records(workdir: str) -> list[dict]:
  """``workdir``'s metric records as logged (a step logged twice keeps its later record,
  :func:`rpr.records.dedupe`); none before its first."""
  path = os.path.join(workdir, "metrics.jsonl")
  return engine.dedupe(records_lib.read_jsonl(path)) if os.path.exists(path) else []


def natural_key(text: str) -> tuple:
  """A sort key that orders the runs of digits in ``text`` by value: ``k=2 < k=16``."""
  return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def flatten(config: dict) -> dict:
  """A run config flat by leaf name: ``model.d_model`` -> ``d_model``, ``model.shaw.use_keys``
  -> ``use_keys``; a model key whose name the top level also has keeps its prefix (``model.max_length``)."""
  out = {k: v for k, v in config.items() if not isinstance(v, dict)}
  for key, value in config.items():
    if isinstance(value, dict):
      for leaf, v in flatten(value).items():
        out[leaf if leaf not in out else f"{key}.{leaf}"] = v
  return out


def series(run: RunRecord, metric: str) -> tuple[list[int], list[float]]:
  """(steps, values) of every record of ``run`` that holds ``metric``, in step order."""
  points = sorted((int(r["step"]), float(r[metric])) for r in run.records if isinstance(r.get(metric), (int, float)))
  return [s for s, _ in points], [v for _, v in points]
