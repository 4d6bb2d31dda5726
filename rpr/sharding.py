"""Data parallelism: a 1-D device mesh and global host batches split over it.

Every process holds the same global batch (``train_batch(step)`` is pure)
and places only the rows of its own devices; parameters are replicated.
"""

from __future__ import annotations

import jax
import numpy as np
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


def pad_rows(batch: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Appends all-PAD rows so the batch size is a multiple of ``multiple``; they have weight 0 everywhere."""
  short = -len(batch["inputs"]) % multiple
  if not short:
    return batch
  return {k: np.pad(v, ((0, short),) + ((0, 0),) * (v.ndim - 1)) for k, v in batch.items()}
