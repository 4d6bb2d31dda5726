"""Checkpoints of the training state in ``workdir/checkpoints`` with an orbax ``CheckpointManager``.

One item per step: the whole :class:`rpr.train.TrainState` pytree (step,
params, optimizer state, rng) saved with ``StandardSave``. Restoring takes an
abstract state (``jax.ShapeDtypeStruct`` leaves carrying their shardings), so
arrays come back already placed on the mesh, on any number of devices.
Saves are asynchronous: the device-to-host copy happens before ``save``
returns, the file writing overlaps training; ``close`` waits for it.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import orbax.checkpoint as ocp


class Checkpoints:
  """Periodic saves every ``every`` steps (and forced ones), the last ``keep`` kept."""

  def __init__(self, directory: str, every: int, keep: int):
    self.every = every
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True)
    self.manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> Any:
    """The state saved at ``step`` (default: the latest), shaped and sharded like ``abstract_state``."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.manager.directory}")
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def due(self, step: int) -> bool:
    return step > 0 and step % self.every == 0

  def save(self, step: int, state: Any, force: bool = False) -> bool:
    """Saves ``state`` as ``step`` if due (or ``force``) and not saved yet; True if it saved."""
    if not (force or self.due(step)) or step in self.manager.all_steps():
      return False
    return self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
