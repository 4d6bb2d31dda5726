"""Checkpoints of the training state in ``workdir/checkpoints`` with an orbax ``CheckpointManager``.

One item per step: the whole :class:`rpr.train.TrainState` pytree (step,
params, optimizer state, rng) saved with ``StandardSave``. Restoring takes an
abstract state (``jax.ShapeDtypeStruct`` leaves carrying their shardings), so
arrays come back already placed on the mesh, on any number of devices.
Saves are asynchronous: the device-to-host copy happens before ``save``
returns, the file writing overlaps training; ``close`` waits for it.

Each saved step directory holds a ``SHA256SUMS`` file in ``sha256sum``'s
format (``cd checkpoints/<step> && sha256sum -c SHA256SUMS`` checks it by
hand), written by a background thread once orbax has finalised the save.
A restore verifies it first; a step without one (saved before checksums
existed, or killed between finalising and checksumming) restores with a
warning. Restoring the newest state falls back step by step: each step
that does not restore is reported in one warning; once an older step
restores, the newer bad ones are moved to ``checkpoints/corrupt/<step>``
(never deleted), so that the run can save those steps again and orbax's
clean-up of old steps never sees them. If no step restores, nothing is
moved and :class:`CheckpointError` says so.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from absl import logging

CHECKSUMS = "SHA256SUMS"
CORRUPT = "corrupt"  # subdirectory of the checkpoints that did not restore


class CheckpointError(RuntimeError):
  """No checkpoint restores; each was reported and is left where it was."""


def checksums(directory: str) -> dict[str, str]:
  """SHA-256 (hex) of every file under ``directory`` but ``SHA256SUMS``, by path relative to ``directory``."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      h = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          h.update(block)
      out[os.path.relpath(path, directory)] = h.hexdigest()
  out.pop(CHECKSUMS, None)
  return out


def write_checksums(directory: str) -> None:
  lines = [f"{h}  {name}\n" for name, h in sorted(checksums(directory).items())]
  tmp = os.path.join(directory, CHECKSUMS + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(lines)
  os.replace(tmp, os.path.join(directory, CHECKSUMS))  # a killed write leaves no partial SHA256SUMS


def verify(directory: str) -> bool:
  """True if ``directory`` matches its ``SHA256SUMS``, False if it has none; ValueError naming a file that differs."""
  path = os.path.join(directory, CHECKSUMS)
  if not os.path.exists(path):
    return False
  with open(path, encoding="utf-8") as f:
    recorded = [line.rstrip("\n").split("  ", 1) for line in f]
  actual = checksums(directory)
  for h, name in recorded:
    if name not in actual:
      raise ValueError(f"{name} is missing")
    if actual[name] != h:
      raise ValueError(f"{name} differs from its SHA-256 in {CHECKSUMS}")
  return True


class Checkpoints:
  """Periodic saves every ``every`` steps (and forced ones), the last ``keep`` kept."""

  def __init__(self, directory: str, every: int, keep: int):
    self.every = every
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(preservation_policy=ocp.checkpoint_managers.LatestN(keep), create=True,
                                           enable_async_checkpointing=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    self._checksummer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint_sha256")
    self._pending: Optional[concurrent.futures.Future] = None  # the last save, finalised and checksummed
    for tmp in ocp.path.step.all_temporary_paths(self.directory):
      path = tmp.get()
      logging.warning("Checkpoint of step %d in %s is an unfinished save (the run was stopped while writing it): "
                      "ignored, left on disk.", ocp.path.step.step_from_checkpoint_name(path.name), path)

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> Any:
    """The state saved at ``step`` (default: the newest that restores), shaped and sharded like ``abstract_state``."""
    if step is not None:
      return self._restore(step, abstract_state)
    steps = sorted(self.manager.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    for i, step in enumerate(steps):
      try:
        state = self._restore(step, abstract_state)
      except Exception as e:  # damage shows as orbax, tensorstore, OS or checksum errors
        message = (str(e).strip().splitlines() or [""])[0]
        logging.warning("Checkpoint of step %d in %s does not restore: %s: %s", step, self.path(step),
                        type(e).__name__, message)
        continue
      if i:
        self._move_aside(steps[:i], step)
      return state
    raise CheckpointError(f"no checkpoint in {self.directory} restores (steps {', '.join(map(str, steps))}; see the "
                          "warnings above); all are left as they were: move the directory away to start over")

  def _restore(self, step: int, abstract_state: Any) -> Any:
    if not verify(self.path(step)):
      logging.warning("Checkpoint of step %d in %s has no %s (saved before checksums, or killed before writing "
                      "them): restoring it unverified.", step, self.path(step), CHECKSUMS)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def _move_aside(self, bad: list[int], restored: int) -> None:
    """Moves the ``bad`` steps to ``corrupt/`` so they are neither saved over nor garbage-collected."""
    if jax.process_index() == 0:
      for step in bad:
        target, n = os.path.join(self.directory, CORRUPT, str(step)), 0
        while os.path.exists(target):
          n += 1
          target = os.path.join(self.directory, CORRUPT, f"{step}.{n}")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(self.path(step), target)
        logging.warning("Moved the checkpoint of step %d, which does not restore, to %s; resuming from step %d.",
                        step, target, restored)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("rpr_checkpoints_moved_aside")
    self.manager.reload()

  def due(self, step: int) -> bool:
    return step > 0 and step % self.every == 0

  def save(self, step: int, state: Any, force: bool = False) -> bool:
    """Saves ``state`` as ``step`` if due (or ``force``) and not saved yet; True if it saved."""
    if not (force or self.due(step)) or step in self.manager.all_steps():
      return False
    self._wait()
    saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
    if saved and jax.process_index() == 0:
      self._pending = self._checksummer.submit(self._checksum, step)
    return saved

  def _checksum(self, step: int) -> None:
    self.manager.wait_until_finished()  # orbax has renamed the temporary directory to the step's
    write_checksums(self.path(step))

  def _wait(self) -> None:
    """Waits for the last save and its checksums; raises what either raised."""
    if self._pending is not None:
      pending, self._pending = self._pending, None
      pending.result()
    self.manager.wait_until_finished()

  def close(self) -> None:
    try:
      self._wait()
    finally:
      self._checksummer.shutdown()
      self.manager.close()
