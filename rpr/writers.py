"""Metric writers of a run: JSON lines in ``workdir/metrics.jsonl`` and TensorBoard events in the workdir.

Only process 0 writes files (the other hosts of a multi-host run write nothing). The TensorBoard events are
clu's ``SummaryWriter``, which imports TensorFlow (seconds of start-up), so clu is imported only when a
run asks for events (``config.tensorboard``); ``metrics.jsonl`` alone needs neither.

A write that fails (disk full, file too large, read-only) raises :class:`rpr.records.Unwritable`, naming the
file: a user error, one line. ``metrics.jsonl`` is appended whole lines at a time; a line that could not be
written whole is cut off again, so the records before it stay readable.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import numpy as np

from rpr import records

# Before clu imports TensorFlow: its INFO lines (the oneDNN notice) stay out of a run's log; warnings and errors
# still show. A value the user set is kept.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def _plain(value: Any) -> Any:
  """A JSON value: numbers as float/int, non-finite floats as the strings "nan"/"inf"/"-inf"."""
  value = np.asarray(value).item() if hasattr(value, "shape") or isinstance(value, np.generic) else value
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class Silent:
  """A metric writer that drops everything: clu's ``MetricWriter`` methods (``tests/test_writers.py``)."""

  def write_scalars(self, step, scalars):
    pass

  def write_summaries(self, step, values, metadata=None):
    pass

  def write_images(self, step, images):
    pass

  def write_videos(self, step, videos):
    pass

  def write_audios(self, step, audios, *, sample_rate):
    pass

  def write_texts(self, step, texts):
    pass

  def write_histograms(self, step, arrays, num_buckets=None):
    pass

  def write_hparams(self, hparams):
    pass

  def flush(self):
    pass

  def close(self):
    pass


class JsonlWriter(Silent):
  """One JSON object per ``write_scalars`` call: ``{"step": s, "<name>": value, ...}``.

  Appends, so a resumed run continues the file; scalars only (other kinds are dropped). It has clu's
  ``MetricWriter`` methods without subclassing it, so that writing it does not import clu (see above).
  """

  def __init__(self, path: str):
    self.path = path
    try:
      self._file = open(path, "ab", buffering=0)  # unbuffered: each line is written, or not, by write_scalars
    except OSError as e:
      raise records.unwritable(path, e) from None

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    record = {"step": int(step), **{k: _plain(v) for k, v in scalars.items()}}
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    end = os.fstat(self._file.fileno()).st_size
    try:
      written = 0
      while written < len(line):
        written += self._file.write(line[written:])
    except OSError as e:
      try:
        os.ftruncate(self._file.fileno(), end)  # no half line (the reader would skip it as cut short, if last)
      except OSError:
        pass
      raise records.unwritable(self.path, e) from None

  def close(self):
    self._file.close()


class _Events:
  """clu's TensorBoard ``SummaryWriter`` in ``workdir``, each method's errors (TensorFlow's, also on flushing or
  closing) :class:`rpr.records.Unwritable`, naming the events file and the cause."""

  def __init__(self, workdir: str):
    from clu.metric_writers import summary_writer  # imports TensorFlow

    self.workdir = workdir
    self._writer = self._call(summary_writer.SummaryWriter, workdir)

  def __getattr__(self, name: str):  # clu's MetricWriter methods
    if name.startswith("_"):
      raise AttributeError(name)
    method = getattr(self._writer, name)
    return lambda *args, **kwargs: self._call(method, *args, **kwargs)

  def _call(self, method, *args, **kwargs):
    try:
      return method(*args, **kwargs)
    except Exception as e:  # TensorFlow's OpError (OutOfRangeError: file too large, ...) or an OSError
      if not isinstance(e, OSError) and not any(c.__name__ == "OpError" for c in type(e).__mro__):
        raise
      cause = (str(e).split("}}")[-1].strip().splitlines() or [type(e).__name__])[0]  # no "{{function_node ...}}"
      raise records.Unwritable(f"could not write the TensorBoard events in {self.workdir}: {cause}; the run "
                               "stopped: free space (or make it writable), then run the same command to resume, or "
                               "set config.tensorboard = False") from None


def create(workdir: str, process_index: int = 0, tensorboard: bool = True):
  """On process 0, ``metrics.jsonl`` and with ``tensorboard`` TensorBoard events in ``workdir`` (clu's
  ``MultiWriter`` of both); on the other processes a writer that drops everything."""
  if process_index != 0:
    return Silent()
  jsonl = JsonlWriter(os.path.join(workdir, "metrics.jsonl"))
  if not tensorboard:
    return jsonl
  from clu.metric_writers import multi_writer

  return multi_writer.MultiWriter([jsonl, _Events(workdir)])


def hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """A run config flat by dotted key, each value a bool, int, float or str: TensorBoard's HParams values."""
  out: dict[str, Any] = {}
  for key, value in config.items():
    if isinstance(value, Mapping):
      out.update(hparams(value, f"{prefix}{key}."))
    elif isinstance(value, (bool, int, float, str)) and not (isinstance(value, float) and not math.isfinite(value)):
      out[prefix + key] = value
    else:
      out[prefix + key] = str(value)  # tuples, None, inf: shown as text
  return out
