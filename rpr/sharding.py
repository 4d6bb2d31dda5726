"""Data parallelism: a 1-D device mesh and global batches split over it; parameters are replicated.

Training batches: each process builds only the rows of its own devices
(``task.train_batch(step, rows)``, a slice of the one global batch of the
step) and places them (:func:`host_batch`). Evaluation batches: every process
builds the whole batch and places the rows of its own devices
(:func:`shard_batch`).
"""

from __future__ import annotations

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

Array = jax.Array


def make_mesh(devices=None) -> Mesh:
  """1-D mesh named ``"data"`` over ``devices`` (default: every device of every process)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), ("data",))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, Array]:
  """Global host batch -> arrays split over the ``data`` axis.

  Every process holds the same global batch (``train_batch(step)`` is pure)
  and places only the rows of its own devices.
  """
  sharding = NamedSharding(mesh, P("data"))
  return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
          for k, v in batch.items()}


def host_rows(mesh: Mesh, rows: int, devices=None) -> slice:
  """The rows of a ``[rows, ...]`` batch split over ``mesh``'s ``data`` axis that ``devices`` hold (default: this
  process's devices); an error unless they are one contiguous range."""
  index = NamedSharding(mesh, P("data")).devices_indices_map((rows,))
  if devices is None:
    devices = [d for d in index if d.process_index == jax.process_index()]
  spans = sorted(index[d][0].indices(rows)[:2] for d in devices)
  if any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
    raise ValueError(f"the devices {list(devices)} hold rows {spans} of the batch, not one contiguous range")
  return slice(spans[0][0], spans[-1][1])


def host_batch(task, step: int, mesh: Mesh) -> dict[str, Array]:
  """Training batch ``step`` of ``task`` over ``mesh``, padded with all-PAD rows to a multiple of the device
  count: this process builds only the rows of its own devices, and the global batch is the same as
  ``shard_batch(pad_rows(task.train_batch(step), mesh.size), mesh)`` on every process count."""
  real = task.train_rows(step)
  total = -(-real // mesh.size) * mesh.size
  mine = host_rows(mesh, total)
  local = task.train_batch(step, slice(min(mine.start, real), min(mine.stop, real)))
  logging.log_first_n(logging.INFO, "Process %d builds rows %d:%d of %d of training batch %d (its devices' rows).",
                      1, jax.process_index(), mine.start, mine.stop, total, step)
  short = mine.stop - mine.start - len(local["inputs"])  # rows past the real ones: all PAD
  local = {k: np.pad(v, ((0, short),) + ((0, 0),) * (v.ndim - 1)) for k, v in local.items()}
  sharding = NamedSharding(mesh, P("data"))
  return {k: jax.make_array_from_process_local_data(sharding, v, (total, *v.shape[1:])) for k, v in local.items()}


def pad_rows(batch: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Appends all-PAD rows so the batch size is a multiple of ``multiple``; they have weight 0 everywhere."""
  short = -len(batch["inputs"]) % multiple
  if not short:
    return batch
  return {k: np.pad(v, ((0, short),) + ((0, 0),) * (v.ndim - 1)) for k, v in batch.items()}
