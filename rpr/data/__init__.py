"""Data sets by name: ``get_task(config)`` builds the :class:`~rpr.data.task.Task` named ``config.dataset``.

A registered factory takes the run's config and returns a Task; it reads its
own config keys (documented where it is registered) and should import heavy
dependencies (TFDS, ...) inside itself, so that naming and validating data sets
stays cheap. ``splits`` lists the evaluation splits a data set knows, so a
config asking for another one fails before any work starts.

Registered: ``copy`` and ``reverse`` (synthetic digit strings, in memory; see
:mod:`rpr.data.synthetic`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from rpr.data.task import Task


@dataclasses.dataclass(frozen=True)
class Entry:
  factory: Callable[..., Task]  # config -> Task
  splits: Optional[tuple[str, ...]] = None  # evaluation splits; None: not declared (not checked)


REGISTRY: dict[str, Entry] = {}


def register(name: str, factory: Callable[..., Task], splits: Optional[tuple[str, ...]] = None) -> None:
  if name in REGISTRY:
    raise ValueError(f"data set {name!r} is already registered")
  REGISTRY[name] = Entry(factory, tuple(splits) if splits is not None else None)


def names() -> list[str]:
  return sorted(REGISTRY)


def entry(name) -> Entry:
  """The registry entry of ``name``, or an error naming ``config.dataset`` and the allowed names."""
  if not name or name not in REGISTRY:
    raise ValueError(f"config.dataset: unknown data set {name!r}; allowed: {names()}")
  return REGISTRY[name]


def get_task(config) -> Task:
  """The Task named ``config.dataset``, built from ``config``."""
  return entry(config.get("dataset")).factory(config)


def _synthetic(kind: str):
  def factory(config):
    from rpr.data import synthetic
    return synthetic.from_config(kind, config)
  return factory


for _kind in ("copy", "reverse"):
  register(_kind, _synthetic(_kind), splits=("valid", "long"))
