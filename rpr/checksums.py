"""A directory's ``SHA256SUMS`` in ``sha256sum``'s format: written once a checkpoint step is final, checked before
it restores (:mod:`rpr.checkpoint`). ``cd checkpoints/<step> && sha256sum -c SHA256SUMS`` checks one by hand."""

from __future__ import annotations

import hashlib
import os

CHECKSUMS = "SHA256SUMS"


class Unverified(ValueError):
  """A step's checksums are missing or do not cover every file of the step."""


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


def verify(directory: str) -> None:
  """Checks ``directory`` against its ``SHA256SUMS``: :class:`Unverified` if it has none, or one that lists
  nothing or not every file; ValueError naming a file that differs or is missing."""
  path = os.path.join(directory, CHECKSUMS)
  if not os.path.exists(path):
    raise Unverified(f"it has no {CHECKSUMS} (saved before checksums, or killed before writing them)")
  with open(path, encoding="utf-8") as f:
    recorded = [line.rstrip("\n").split("  ", 1) for line in f if line.strip()]
  if not recorded or any(len(r) != 2 for r in recorded):
    raise Unverified(f"its {CHECKSUMS} {'lists no file' if not recorded else 'is not in sha256sum format'}")
  actual = checksums(directory)
  for h, name in recorded:
    if name not in actual:
      raise ValueError(f"{name} is missing")
    if actual[name] != h:
      raise ValueError(f"{name} differs from its SHA-256 in {CHECKSUMS}")
  unlisted = sorted(set(actual) - {name for _, name in recorded})
  if unlisted:
    raise Unverified(f"its {CHECKSUMS} does not list {', '.join(unlisted[:3])}" + (" ..." if len(unlisted) > 3 else ""))
