"""Checkpoints of the training state in ``workdir/checkpoints`` with an orbax ``CheckpointManager``.

One item per step: the whole :class:`rpr.train.TrainState` pytree (step,
params, optimizer state, rng) saved with ``StandardSave``. Restoring takes an
abstract state (``jax.ShapeDtypeStruct`` leaves carrying their shardings), so
arrays come back already placed on the mesh, on any number of devices.
Saves are asynchronous: the device-to-host copy happens before ``save``
returns, the file writing overlaps training; ``close`` waits for it.

Each saved step directory holds a ``SHA256SUMS`` file (:mod:`rpr.checksums`) in ``sha256sum``'s
format (``cd checkpoints/<step> && sha256sum -c SHA256SUMS`` checks it by
hand), written by a background thread once orbax has finalised the save;
only then is the save logged as done. A failed save raises
:class:`SaveError`, naming the last step that was saved.

Nothing restores unverified: a step whose ``SHA256SUMS`` is missing, lists
nothing, does not list every file of the step, or differs from a file is
passed over, unless ``allow_unverified`` (``run.py --restore_unverified``)
restores a step without checksums (never one that differs). A restored state must be finite.
Restoring the newest state falls back step by step: each step that does
not restore is reported in one warning; once an older step restores, the
newer bad ones are moved to ``checkpoints/corrupt/<step>`` (never deleted),
so that the run can save those steps again and orbax's clean-up of old
steps never sees them. If no step restores, nothing is moved and
:class:`CheckpointError` says so. An entry of ``checkpoints/`` named like a
step that is not an orbax checkpoint (no ``_CHECKPOINT_METADATA``) is moved
to ``checkpoints/corrupt/`` with one warning when the run starts, so that
neither the fall-back nor orbax's clean-up counts it.
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging as pylogging
import os
import re
import sys
import traceback
import warnings
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from rpr import failures
from rpr.checksums import Unverified, verify, write_checksums

CORRUPT = "corrupt"  # subdirectory of the checkpoints that did not restore


class CheckpointError(RuntimeError):
  """No checkpoint restores; each was reported and is left where it was."""


class SaveError(CheckpointError):
  """A checkpoint could not be saved; the message names the last one that was."""


METADATA = "_CHECKPOINT_METADATA"  # orbax writes it into every finalised step directory


class _OrbaxLogFilter(pylogging.Filter):
  """Drops orbax's per-save INFO lines and its errors (also asyncio's of orbax's writes), and the tracebacks of its
  warnings: an error of orbax's is a save that failed, which the run reports in one line (:class:`SaveError`)."""

  def filter(self, record):
    if "/orbax/" not in record.pathname:  # asyncio's "... exception was never retrieved" of orbax's writes, and
      if record.name != "asyncio":  # tensorstore's of a failed save (its text names the save's temporary folder)
        return True
      where = record.getMessage() + "".join(
          f.filename for f in traceback.extract_tb(record.exc_info[2] if record.exc_info else None))
      return "/orbax/" not in where and ".orbax-checkpoint-tmp" not in where
    if not pylogging.WARNING <= record.levelno < pylogging.ERROR:
      return False
    record.exc_info, record.exc_text = None, None
    return True


def _unraisable(hook):
  """``sys.unraisablehook`` without tensorstore's "Event loop is closed" tracebacks: the callbacks of the writes
  still in flight when a save failed, after orbax closed their event loop (that save's error is reported)."""

  def quiet(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"):
      hook(unraisable)

  quiet.rpr_quiet = True
  return quiet


def quiet_orbax_logs() -> None:
  """Installs the filter on absl's log handler and the quiet ``sys.unraisablehook`` (once); ignores the warnings of
  orbax's writes that a failed save left unawaited."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _OrbaxLogFilter) for f in handler.filters):
    handler.addFilter(_OrbaxLogFilter())
  if not getattr(sys.unraisablehook, "rpr_quiet", False):
    sys.unraisablehook = _unraisable(sys.unraisablehook)
  warnings.filterwarnings("ignore", r"coroutine 'async_serialize_from_host\.", RuntimeWarning)  # those writes


def _check_writable(directory: str) -> None:
  """:class:`SaveError` before any training if ``directory`` cannot take a checkpoint (orbax would fail late)."""
  probe = os.path.join(directory, ".rpr_write_probe")
  try:
    os.makedirs(directory, exist_ok=True)
    os.makedirs(probe, exist_ok=True)
    os.rmdir(probe)
  except OSError as e:
    raise SaveError(f"the checkpoints directory {directory} is not writable ({e.strerror or e}); allowed: a "
                    "directory this user can write, so that the run can save what it trains") from None


def set_aside_strays(directory: str) -> list[str]:
  """Moves the entries of ``directory`` named like a step that are not orbax checkpoints to ``corrupt/``."""
  moved = []
  if not os.path.isdir(directory):
    return moved
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if name.isdigit() and not os.path.isfile(os.path.join(path, METADATA)):
      target = _free(os.path.join(directory, CORRUPT, name))
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.rename(path, target)
      logging.warning("%s is not a checkpoint (no %s): skipped, moved to %s.", path, METADATA, target)
      moved.append(target)
  return moved


def _free(target: str) -> str:
  """``target``, or ``target.1``, ``target.2``, ... whichever does not exist yet."""
  path, n = target, 0
  while os.path.exists(path):
    n += 1
    path = f"{target}.{n}"
  return path


def agreed(local: list[bool], steps: list[int]) -> list[bool]:
  """Per step, whether every process found it verified (``local``: this process's view, in ``steps``' order).

  One process: ``local`` itself. Several: the flags of all processes, gathered;
  they must list the same steps (one shared checkpoint directory).
  """
  if jax.process_count() == 1:
    return list(local)
  from jax.experimental import multihost_utils

  seen = multihost_utils.process_allgather(np.array([len(steps), *steps[:1]], np.int64))
  if not (seen == seen[0]).all():
    raise CheckpointError(f"the processes see different checkpoints (count, newest step per process: "
                          f"{seen.tolist()}); they must share one checkpoint directory")
  return [bool(v) for v in multihost_utils.process_allgather(np.array(local, np.int32)).all(axis=0)]


def _all_finite(tree) -> bool:
  return all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree_util.tree_leaves(tree)
             if np.issubdtype(np.asarray(x).dtype, np.inexact))


class Checkpoints:
  """Periodic saves every ``every`` steps (and forced ones), the last ``keep`` kept."""

  def __init__(self, directory: str, every: int, keep: int, allow_unverified: bool = False):
    self.every = every
    self.directory = os.path.abspath(directory)
    self.allow_unverified = allow_unverified
    if jax.process_index() == 0:
      _check_writable(self.directory)
      set_aside_strays(self.directory)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("rpr_checkpoint_strays_set_aside")
    options = ocp.CheckpointManagerOptions(preservation_policy=ocp.checkpoint_managers.LatestN(keep), create=True,
                                           enable_async_checkpointing=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    self._checksummer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint_sha256")
    self._pending: Optional[concurrent.futures.Future] = None  # the last save, finalised and checksummed
    self.last_saved: Optional[int] = self.manager.latest_step()  # the newest step known to be saved
    self._saving: Optional[int] = None  # the step of the save in flight
    self.failed = False  # a save failed, and its SaveError was raised
    for tmp in ocp.path.step.all_temporary_paths(self.directory):
      path = tmp.get()
      logging.warning("Checkpoint of step %d in %s is an unfinished save (the run was stopped while writing it): "
                      "ignored, left on disk.", ocp.path.step.step_from_checkpoint_name(path.name), path)

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> Any:
    """The state saved at ``step`` (default: the newest that restores), shaped and sharded like ``abstract_state``.

    With several processes, a step is restored only if every process verified
    it (:func:`agreed`): all of them fall back to the same step when one sees
    a damaged file that the others do not.
    """
    if step is not None:
      return self._restore(step, abstract_state)
    steps = sorted(self.manager.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    checks = [self._check(s) for s in steps]
    unverified, bad = [], {}
    for step, error, ok in zip(steps, checks, agreed([e is None for e in checks], steps)):
      try:
        if error is not None:
          raise error
        if not ok:
          raise ValueError("another process found it damaged")
        state = self._load(step, abstract_state)
      except Exception as e:  # damage shows as orbax, tensorstore, OS or checksum errors
        message = (str(e).strip().splitlines() or [""])[0]
        if isinstance(e, Unverified):
          unverified.append(step)
          bad[step] = f"unverified: {message} (--restore_unverified restores it)"
        else:
          bad[step] = f"{type(e).__name__}: {message}"
        continue
      if bad:
        self._move_aside(bad, step)
      return state
    for step, message in bad.items():
      logging.warning("Checkpoint of step %d in %s does not restore: %s.", step, self.path(step), message)
    hint = (f"; steps {', '.join(map(str, unverified))} have no complete checksums: --restore_unverified restores "
            "them if you trust them" if unverified else "")
    raise CheckpointError(f"no checkpoint in {self.directory} restores (steps {', '.join(map(str, steps))}; see the "
                          f"warnings above){hint}; all are left as they were: move the directory away to start over")

  def _check(self, step: int) -> Optional[Exception]:
    """None if the files of ``step`` verify (or it is unverified and that is allowed), else the error."""
    try:
      verify(self.path(step))
    except Unverified as e:
      if not self.allow_unverified:
        return e
      logging.warning("Checkpoint of step %d in %s is unverified (%s): restoring it, as --restore_unverified "
                      "asks.", step, self.path(step), e)
    except (OSError, ValueError) as e:
      return e
    return None

  def _load(self, step: int, abstract_state: Any) -> Any:
    state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
    if not _all_finite(state):
      raise ValueError("it holds non-finite values (NaN or inf)")
    return state

  def _restore(self, step: int, abstract_state: Any) -> Any:
    error = self._check(step)
    if error is not None:
      raise error
    return self._load(step, abstract_state)

  def average_params(self, abstract_state: Any, steps) -> Any:
    """The arithmetic mean of the ``params`` of the checkpoints of ``steps`` (each verified), in float32 sums."""
    total = None
    for step in steps:
      params = self._restore(step, abstract_state).params
      total = params if total is None else jax.tree_util.tree_map(lambda a, b: a + b, total, params)
    return jax.tree_util.tree_map(lambda a: (a / len(steps)).astype(a.dtype), total)

  def _move_aside(self, bad: dict[int, str], restored: int) -> None:
    """Moves the ``bad`` steps (step -> why) to ``corrupt/``, so they are neither saved over nor garbage-collected."""
    for step, why in bad.items():
      target = _free(os.path.join(self.directory, CORRUPT, str(step)))
      if jax.process_index() == 0:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(self.path(step), target)
      logging.warning("Checkpoint of step %d in %s does not restore: %s; moved to %s, resuming from step %d.",
                      step, self.path(step), why, target, restored)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("rpr_checkpoints_moved_aside")
    self.manager.reload()

  def due(self, step: int) -> bool:
    return step > 0 and step % self.every == 0

  def save(self, step: int, state: Any, force: bool = False) -> bool:
    """Saves ``state`` as ``step`` if due (or ``force``) and not saved yet; True if it started the save.

    The save finishes in the background (logged when its checksums are
    written); :class:`SaveError` if this one or the one before failed.
    """
    if not (force or self.due(step)) or step in self.manager.all_steps():
      return False
    self._wait()
    try:
      saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
    except Exception as e:  # pylint: disable=broad-except
      self.failed = True
      raise self._save_error(step, e) from e
    if saved:
      self._saving = step
      if jax.process_index() == 0:
        self._pending = self._checksummer.submit(self._checksum, step)
    return saved

  def _save_error(self, step: int, e: Exception) -> SaveError:
    last = "none" if self.last_saved is None else f"step {self.last_saved}"
    return SaveError(f"could not save the checkpoint of step {step} in {self.directory}: {_cause(e)}; the run "
                     f"stopped, its last saved checkpoint is {last}: free space (or remove the cause), then run the "
                     f"same command to {'start again' if self.last_saved is None else 'resume from it'}")

  def _checksum(self, step: int) -> None:
    try:
      self.manager.wait_until_finished()  # orbax has renamed the temporary directory to the step's
      write_checksums(self.path(step))
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(step, e) from e
    self.last_saved = step
    logging.info("Saved the checkpoint of step %d.", step)

  def _wait(self) -> None:
    """Waits for the last save and its checksums; :class:`SaveError` if either failed."""
    if self._pending is not None:
      pending, self._pending = self._pending, None
      self.failed = pending.exception() is not None  # its SaveError, raised next
      pending.result()
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      self.failed = True
      raise self._save_error(self._saving, e) from e

  def wait(self) -> None:
    """Returns once every save has finished and is checksummed (:class:`SaveError` if one failed)."""
    self._wait()

  def close(self) -> None:
    """Waits for the last save (:class:`SaveError` if it failed) and closes; no error closing hides an earlier one."""
    try:
      if not self.failed:  # else it was reported when raised; orbax raises it again as it closes, which is no news
        self._wait()
    finally:
      failures.clean_up(self._checksummer.shutdown, self.manager.close, quiet=self.failed)


def _cause(e: Exception) -> str:
  """A failed save's cause in a few words: ``[Errno 28] No space left on device`` (also in tensorstore's message)."""
  code = e.errno if isinstance(e, OSError) else None
  found = re.search(r"os_error_code='?(\d+)", str(e))
  code = int(found.group(1)) if code is None and found else code
  if code in errno.errorcode:
    return f"[Errno {code}] {os.strerror(code)}"
  return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
