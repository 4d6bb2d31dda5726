"""The records of a run's ``metrics.jsonl``: reading, rewinding, setting aside, de-duplicating after a restart.

One JSON object per line, ``{"step": s, "<metric>": value, ...}``, written by
:class:`rpr.writers.JsonlWriter`. Plain Python: reading records loads no
metric writer (nor TensorFlow, which the TensorBoard writer brings).

A last line cut short (a kill or a full disk mid-write) is not a record: it
is skipped with one warning. Any other line that is not a record is
:class:`Damaged`; a record file that cannot be written is :class:`Unwritable`
(each a user error: one line naming the file and the remedy).
"""

from __future__ import annotations

import gzip
import json
import os
import time

from absl import logging

_warned: set = set()  # (path, line) of the cut lines warned of: each once per process


class Damaged(ValueError):
  """A line of ``metrics.jsonl`` that is not a record (and not a last line cut short)."""


class Unwritable(RuntimeError):
  """A record file of the workdir that could not be written (disk full, file too large, read-only)."""


def unwritable(path: str, e: OSError) -> Unwritable:
  cause = f"[Errno {e.errno}] {e.strerror}" if e.errno else str(e)
  return Unwritable(f"could not write {path}: {cause}; the run stopped, what was written before is intact: free space "
                    "(or make it writable), then run the same command to resume")


def replace_lines(path: str, lines: list[str], compressed: bool = False) -> None:
  """``path`` holds ``lines``, replaced atomically (a kill leaves the old file or the new one); :class:`Unwritable`
  if it cannot be written, the old file left as it was. ``compressed``: gzip, with no time stamp (the same lines
  give the same bytes)."""
  tmp = path + ".tmp"
  try:
    if compressed:
      with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write("".join(lines).encode("utf-8"))
    else:
      with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:  # bytes kept as they were read
        f.writelines(lines)
    os.replace(tmp, path)
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise unwritable(path, e) from None


def read_jsonl(path: str) -> list[dict]:
  """The records of a ``metrics.jsonl`` file (for tests and reports)."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _parse(path: str) -> tuple[list[dict], int]:
  """The records of ``path`` and its count of non-empty lines; a last line cut short (no newline at its end) is
  skipped with a warning, any other line that is not a record raises :class:`Damaged`, naming it."""
  if not os.path.exists(path):
    return [], 0
  with open(path, "rb") as f:
    lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
  records = []
  for n, line in lines:
    try:
      records.append(_record(line))
    except ValueError as e:
      if (n, line) != lines[-1] or line.endswith(b"\n"):
        raise Damaged(f"{path}, line {n}: {e}; allowed: one JSON record with its step per line: fix or delete that "
                      f"line (or move {os.path.basename(path)} away to start its records over)") from None
      if (path, n) not in _warned:
        _warned.add((path, n))
        logging.warning("%s, line %d: cut short (%s), most likely by a kill or a full disk while it was written: "
                        "skipped, the records before it are intact.", path, n, e)
  return records, len(lines)


def _record(line: bytes) -> dict:
  """The record of one line of ``metrics.jsonl``; ValueError saying why it is not one."""
  try:
    text = line.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"bytes that are not UTF-8 (at column {e.start + 1})") from None
  try:
    record = json.loads(text)
  except ValueError as e:
    raise ValueError(f"not JSON ({e})") from None
  if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
    raise ValueError(f"not a record with an integer step: {text.strip()[:80]!r}")
  return record


def plateau_step(records: list[dict]) -> int | None:
  """The step where a plateau rule stopped the run (the record holding ``plateau/reached``), or None."""
  return next((int(r["step"]) for r in records if "plateau/reached" in r), None)


def end_step(records: list[dict], num_train_steps: int) -> int:
  """The run's last step: where its plateau rule stopped it, else ``num_train_steps``."""
  stopped = plateau_step(records)
  return num_train_steps if stopped is None else min(stopped, num_train_steps)


def last_step(path: str) -> tuple[int, bool]:
  """The last step ``path`` records (0 for none) and whether a plateau rule stopped the run there."""
  records, _ = _parse(path)
  return max((r["step"] for r in records), default=0), plateau_step(records) is not None


def rewind_jsonl(path: str, step: int) -> tuple[list[dict], int]:
  """Drops the records of ``path`` past ``step`` (a resumed run's restored step): ``(kept records, dropped)``.

  A run killed after its last checkpoint logged steps it will train again;
  without this they would appear twice. The file is replaced atomically.
  """
  records, lines = _parse(path)
  kept = [r for r in records if r["step"] <= step]
  if len(kept) < lines:
    replace_lines(path, [json.dumps(r, sort_keys=True) + "\n" for r in kept])
  return kept, lines - len(kept)


def set_aside(path: str) -> str | None:
  """Renames ``path`` to ``<stem>.orphaned-<UTC time>.jsonl`` beside it if it records any step past 0, and
  returns the new path (else None).

  For a run that starts from step 0 because no checkpoint is left to resume
  from (a kill before the first save, checkpoints deleted): the records of
  the run before are kept where no run writes, instead of being rewound away.
  """
  if last_step(path)[0] <= 0:
    return None
  stem = path[:-len(".jsonl")] if path.endswith(".jsonl") else path
  stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
  new = next(n for n in (f"{stem}.orphaned-{stamp}{f'-{i}' if i else ''}.jsonl" for i in range(1 << 20))
             if not os.path.exists(n))  # never over an earlier one
  os.replace(path, new)
  return new


def continued(path: str, step: int) -> list[dict]:
  """The records a run restored at ``step`` goes on from (process 0; ``[]`` on the others).

  Records past ``step`` are dropped (they are trained again); a run with no checkpoint to resume from
  (``step`` 0) starts afresh, and the records of the run before it are set aside, not rewound.
  """
  import jax

  if jax.process_index() != 0:
    return []
  aside = set_aside(path) if step == 0 else None
  if aside:
    logging.warning("No checkpoint to resume from: training starts at step 0, and the records of the run "
                    "before are kept in %s.", aside)
  kept, dropped = rewind_jsonl(path, step)
  if dropped:
    logging.info("Dropped %d record(s) past step %d from metrics.jsonl: they are trained again.", dropped, step)
  return kept


def dedupe(records: list[dict]) -> list[dict]:
  """The records a run that resumed after a kill means: each step's metrics once, the later run's.

  A file that was not rewound at a restart (:func:`rewind_jsonl`) may hold a
  resumed run's records after those of the run it replaced. A record whose
  step is below the previous one's, or that repeats a metric of its step,
  starts a restart: the records at and past its step are dropped first.
  """
  kept: list[dict] = []
  for r in records:
    step = r["step"]
    restart = kept and (step < kept[-1]["step"] or any(
        k["step"] == step and (set(k) & set(r)) - {"step"} for k in kept))
    if restart:
      kept = [k for k in kept if k["step"] < step]
    kept.append(r)
  return kept
