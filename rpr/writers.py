"""Metric writers of a run: JSON lines in ``workdir/metrics.jsonl`` and TensorBoard events in the workdir.

Both are clu ``MetricWriter``s behind one ``MultiWriter``; only process 0
writes files (the other hosts of a multi-host run write nothing).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import numpy as np
from clu.metric_writers import interface
from clu.metric_writers import multi_writer


def _plain(value: Any) -> Any:
  """A JSON value: numbers as float/int, non-finite floats as the strings "nan"/"inf"/"-inf"."""
  value = np.asarray(value).item() if hasattr(value, "shape") or isinstance(value, np.generic) else value
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class JsonlWriter(interface.MetricWriter):
  """One JSON object per ``write_scalars`` call: ``{"step": s, "<name>": value, ...}``.

  Appends, so a resumed run continues the file; scalars only (other kinds are ignored).
  """

  def __init__(self, path: str):
    self.path = path
    self._file = open(path, "a", encoding="utf-8")

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    record = {"step": int(step), **{k: _plain(v) for k, v in scalars.items()}}
    self._file.write(json.dumps(record, sort_keys=True) + "\n")
    self._file.flush()

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
    self._file.flush()

  def close(self):
    self._file.close()


def create(workdir: str, process_index: int = 0) -> interface.MetricWriter:
  """JSON lines + TensorBoard in ``workdir`` on process 0; a writer that drops everything elsewhere."""
  writers: list[interface.MetricWriter] = []
  if process_index == 0:
    from clu.metric_writers import summary_writer  # imports TensorFlow: only when a run starts

    writers = [JsonlWriter(os.path.join(workdir, "metrics.jsonl")), summary_writer.SummaryWriter(workdir)]
  return multi_writer.MultiWriter(writers)


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
