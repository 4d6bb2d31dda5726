"""Finished runs, read from their workdirs, and grouped: the seeds of one variant form a group.

A run is a workdir holding ``config.json`` and ``metrics.jsonl``, as the
engine writes them. :func:`load_runs` reads every run a set of globs
matches; :func:`group_runs` groups them by their config with the seed left
out; :func:`labels` names each group by the config keys that tell the groups
apart (``k=4``); :func:`summarise` keeps, per group, each run's last value of
one metric (:class:`Group`).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import math
import os
import re
from typing import Any, Optional, Sequence

import numpy as np

from experiments import engine
from rpr.attention import positions

IGNORED_KEYS = ("seed",)  # keys that differ between the runs of one group
SHORT_NAMES = {"position": "pe", "max_distance": "k", "use_keys": "aK", "use_values": "aV",
               "alibi_directional": "directional", "preset": "model"}
_BY_LENGTH_KEY = re.compile(r"^(?P<split>[^/]+)/exact_match_by_length/(?P<n>\d+)$")


@dataclasses.dataclass
class RunRecord:
  """One run: its workdir, its config flat by leaf name (:func:`flatten`), its metric records in order."""
  workdir: str
  config: dict
  records: list[dict]
  raw_config: dict = dataclasses.field(default_factory=dict)  # as in config.json

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

  def train_seconds(self) -> Optional[float]:
    """Seconds of the logged training intervals (each record's steps over its rate); None without rates.

    A rate is steps over the wall time between two log lines, so an interval holds whatever ran in it: the
    steps, and any periodic evaluation, checkpoint save or first-step compilation. Not in it: setup before the
    first step, the final evaluation, and steps dropped at a restart (they are trained again and logged anew).
    """
    seconds, previous = 0.0, 0
    for r in self.records:
      if r.get("train/steps_per_sec"):
        seconds += (r["step"] - previous) / r["train/steps_per_sec"]
        previous = r["step"]
    return seconds if previous else None

  def by_length(self) -> Optional[tuple[int, dict[int, float]]]:
    """(step, {length: exact match}) of the last record with per-length values, merged over splits."""
    for r in reversed(self.records):
      values = {int(m["n"]): float(v) for k, v in r.items() if (m := _BY_LENGTH_KEY.match(k))}
      if values:
        return int(r["step"]), dict(sorted(values.items()))
    return None


def load_runs(patterns: Sequence[str]) -> list[RunRecord]:
  """Every workdir matched by ``patterns`` that holds ``config.json`` and ``metrics.jsonl``, sorted by path with
  its numbers read as numbers (``k=2`` before ``k=16``, ``seed2`` before ``seed10``).

  A step logged twice (a run restarted from an earlier checkpoint) keeps its later record
  (:func:`rpr.records.dedupe`).
  """
  runs = []
  for workdir in sorted({p for pattern in patterns for p in glob.glob(pattern)}, key=natural_key):
    config_path, metrics_path = os.path.join(workdir, "config.json"), os.path.join(workdir, "metrics.jsonl")
    if not (os.path.isfile(config_path) and os.path.isfile(metrics_path)):
      continue
    with open(config_path, encoding="utf-8") as f:
      raw = json.load(f)["config"]
    with open(metrics_path, encoding="utf-8") as f:
      records = engine.dedupe([json.loads(line) for line in f if line.strip()])
    runs.append(RunRecord(workdir, flatten(engine.recorded_config(raw)), records, engine.migrate(raw)))
  return runs


def natural_key(text: str) -> tuple:
  """A sort key that orders the runs of digits in ``text`` by value: ``k=2 < k=16``."""
  return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def flatten(config: dict) -> dict:
  """A run config flat by leaf name: ``model.d_model`` -> ``d_model``, ``model.shaw.max_distance``
  -> ``max_distance``; a model key whose name the top level also has keeps its prefix (``model.max_length``)."""
  out = {k: v for k, v in config.items() if not isinstance(v, dict)}
  for key, value in config.items():
    if isinstance(value, dict):
      for leaf, v in flatten(value).items():
        out[leaf if leaf not in out else f"{key}.{leaf}"] = v
  return out


def canonical(value: Any) -> str:
  """A JSON text that is equal for equal values (keys sorted): what groups and labels compare."""
  return json.dumps(value, sort_keys=True)


def shared_config(run: RunRecord) -> dict:
  """The run's flat config without :data:`IGNORED_KEYS`: what the runs of one group share."""
  return {k: v for k, v in run.config.items() if k not in IGNORED_KEYS}


def group_runs(runs: Sequence[RunRecord]) -> list[tuple[dict, list[RunRecord]]]:
  """Runs grouped by :func:`shared_config`: ``[(shared config, runs)]`` in first-seen order."""
  groups: dict[str, tuple[dict, list[RunRecord]]] = {}
  for run in runs:
    config = shared_config(run)
    groups.setdefault(canonical(config), (config, []))[1].append(run)
  return list(groups.values())


def labels(configs: Sequence[dict]) -> list[str]:
  """Short unique names from the keys whose values differ between ``configs``.

  A group shows the key with the most distinct values (first), every key without a
  single most common value, and any other key where it differs from the most
  common value (``pe=alibi, directional=True`` beside ``pe=alibi``). If that
  does not tell two groups apart, every differing key is shown. An option of a
  position scheme a config does not use is not shown for it (``pe=rope``, not
  ``k=16, pe=rope`` beside Shaw's ``k=16``), unless the groups differ in nothing
  else. One config is ``all runs``.
  """
  if len(configs) < 2:
    return ["all runs"] * len(configs)
  out = _labels(configs, skip_unused=True)  # RoPE's group is pe=rope, not k=16, pe=rope
  return out if all(out) and len(set(out)) == len(out) else _labels(configs, skip_unused=False)


def _labels(configs: Sequence[dict], skip_unused: bool) -> list[str]:
  keys = sorted({k for c in configs for k in c})
  values = {k: [canonical(c.get(k)) for c in configs] for k in keys}
  differing = [k for k in keys if len(set(values[k])) > 1]
  shown = {k: [not (skip_unused and _unused_option(c, k)) for c in configs] for k in differing}
  primary = max(differing, key=lambda k: len(set(values[k])))
  differing.sort(key=lambda k: k != primary)  # the primary key first
  modes = {}
  for k in differing:
    (top, n), *rest = collections.Counter(values[k]).most_common(2) + [(None, 0)]
    modes[k] = top if n > rest[0][1] else None

  def name(i, keys):
    return ", ".join(f"{SHORT_NAMES.get(k, k)}={configs[i].get(k)}" for k in keys if shown[k][i])

  out = [name(i, [k for k in differing if k == primary or modes[k] is None or canonical(c.get(k)) != modes[k]])
         for i, c in enumerate(configs)]
  if len(set(out)) < len(out):
    out = [name(i, differing) for i in range(len(configs))]
  return out


def _unused_option(config: dict, key: str) -> bool:
  """Whether flat ``key`` is an option of a position scheme (``max_distance``, Shaw's) that ``config`` does not
  use: the model reads the options of ``position`` and ``cross_position`` only (the engine's model config)."""
  scheme = _SCHEME_OF_OPTION.get(key)
  return scheme is not None and scheme not in (config.get("position"), config.get("cross_position"))


# Each scheme option's flat name and its scheme: max_distance -> shaw.
_SCHEME_OF_OPTION = {k: name for name in positions.SCHEMES for k in positions.defaults(name)}


def spread(values: Sequence[float]) -> dict[str, float]:
  """n, mean, sample std (ddof 1; nan for one value), min and max."""
  v = np.asarray(values, np.float64)
  return {"n": len(v), "mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else math.nan,
          "min": float(v.min()), "max": float(v.max())}


def series(run: RunRecord, metric: str) -> tuple[list[int], list[float]]:
  """(steps, values) of every record of ``run`` that holds ``metric``, in step order."""
  points = sorted((int(r["step"]), float(r[metric])) for r in run.records if isinstance(r.get(metric), (int, float)))
  return [s for s, _ in points], [v for _, v in points]


def step_range(steps: Sequence[int]) -> str:
  """``"100"`` when every run stopped at one step, else ``"90-100"``."""
  lo, hi = min(steps), max(steps)
  return f"{lo}" if lo == hi else f"{lo}-{hi}"


def capped(run: RunRecord) -> bool:
  """Whether ``run`` has a plateau rule and reached its cap (``num_train_steps``) without the rule stopping it: it
  had not stopped improving, so its last number is not a converged one."""
  cap = run.config.get("num_train_steps")
  return (bool(run.config.get("plateau_metric")) and engine.plateau_step(run.records) is None
          and cap is not None and any(r["step"] >= cap for r in run.records))


@dataclasses.dataclass
class Group:
  """The runs of one variant that hold the metric, ordered by seed, each with its last (step, value) of it.

  ``cells`` holds the group's value of every report column (``experiments.columns``), ``record``
  the values that ``runs.json`` keeps beside the runs.
  """
  label: str
  config: dict
  runs: list[RunRecord]
  points: list[tuple[int, float]]
  cells: dict[str, Any] = dataclasses.field(default_factory=dict)
  record: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def values(self) -> list[float]:
    return [v for _, v in self.points]

  @property
  def capped(self) -> int:
    """How many of the runs reached their cap without meeting their plateau rule (:func:`capped`)."""
    return sum(capped(r) for r in self.runs)

  @property
  def stats(self) -> dict[str, float]:
    """:func:`spread` of the values."""
    return spread(self.values)

  def run_values(self) -> list[dict]:
    """Per run: workdir, seed, step and value (as ``runs.json`` lists them)."""
    return [{"workdir": r.workdir, "seed": r.seed, "step": s, "value": v} for r, (s, v) in zip(self.runs, self.points)]


def summarise(runs: Sequence[RunRecord], metric: str, x: Optional[str] = None) -> list[Group]:
  """The groups of ``runs`` (:func:`group_runs`) with each run's last value of ``metric``.

  Runs without the metric (unfinished) are left out, and groups left empty. Groups are in
  first-seen order, or by the numeric config key ``x``.

  Raises:
    ValueError: if no run holds the metric, or a group's ``x`` is not a number.
  """
  grouped = []
  for config, rs in group_runs(runs):
    held = sorted(((r, p) for r in rs if (p := r.last(metric)) is not None), key=lambda rp: canonical(rp[0].seed))
    if held:
      grouped.append((config, held))
  if not grouped:
    raise ValueError(f"no run holds the metric {metric!r}")
  names = labels([c for c, _ in grouped])
  groups = [Group(name, config, [r for r, _ in held], [p for _, p in held])
            for (config, held), name in zip(grouped, names)]
  if x:
    xs = [g.config.get(x) for g in groups]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs):
      raise ValueError(f"--x {x}: every group needs a numeric config.{x}, got {xs}")
    groups.sort(key=lambda g: g.config[x])
  return groups
