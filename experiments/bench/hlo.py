"""The arrays an optimised HLO module materialises, with the repository line that made each.

:func:`hlo_arrays` reads the text of ``compiled.as_text()``: every
array-valued instruction outside fusion bodies, its shape, bytes, op name and
source line (the innermost frame in ``rpr/``, ``experiments/`` or ``tests/``,
when XLA kept one). Not live-buffer accounting, but an O(L^2) tensor shows up
here with the line that made it.
"""

from __future__ import annotations

import os
import re

import numpy as np

from experiments import machine

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
                "u32": 4, "f64": 8, "s64": 8, "u64": 8}
# "%name = f32[1,4,8192,8192]{3,2,1,0} opcode(...), ..., metadata={op_name="..." stack_frame_id=N}"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\](?:\{[^}]*\})?\s+([\w\-]+)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_FUSION_CALL = re.compile(r"\bfusion\(.*\bcalls=%?([\w.\-]+)")


def _stack_frames(hlo_text: str) -> dict[int, str]:
  """``stack_frame_id -> "file:line"`` of the innermost frame in this repository (``rpr/``, ``experiments/``)."""
  files, locations, frames = {}, {}, {}
  section = None
  for line in hlo_text.splitlines():
    s = line.strip()
    if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = s
      continue
    if not s or s.startswith("%") or s.startswith("ENTRY") or s.startswith("HloModule"):
      if s.startswith("%") or s.startswith("ENTRY"):
        break
      continue
    if section == "FileNames":
      i, name = s.split(" ", 1)
      files[int(i)] = name.strip('"')
    elif section == "FileLocations":
      i = int(s.split(" ", 1)[0])
      locations[i] = (int(re.search(r"file_name_id=(\d+)", s).group(1)), int(re.search(r"\bline=(\d+)", s).group(1)))
    elif section == "StackFrames":
      i = int(s.split(" ", 1)[0])
      frames[i] = (int(re.search(r"file_location_id=(\d+)", s).group(1)),
                   int(re.search(r"parent_frame_id=(\d+)", s).group(1)))

  def ours(path: str) -> bool:
    rel = os.path.relpath(path, machine.ROOT)
    return not rel.startswith("..") and rel.split(os.sep)[0] in ("rpr", "experiments", "tests")

  out = {}
  for i in frames:
    j, seen = i, set()
    while j in frames and j not in seen:  # innermost first, then the callers
      seen.add(j)
      loc, parent = frames[j]
      file_id, line_no = locations.get(loc, (None, None))
      path = files.get(file_id, "")
      if path and ours(path):
        out[i] = f"{os.path.relpath(path, machine.ROOT)}:{line_no}"
        break
      j = parent
  return out


def hlo_arrays(hlo_text: str) -> list[dict]:
  """The arrays an optimised HLO module materialises, biggest first.

  Every array-valued instruction outside fusion bodies (a fusion's inner
  instructions make no buffer of their own; tuples are skipped), one row per
  distinct (shape, op, source). Not live-buffer accounting, but an O(L^2)
  tensor shows up here with its shape, op and the repository line
  (``source``, innermost ``rpr/``, ``experiments/`` or ``tests/`` frame, when
  XLA kept one) that made it.
  """
  fused = set(_FUSION_CALL.findall(hlo_text))
  frames = _stack_frames(hlo_text)
  found, computation = {}, None
  for line in hlo_text.splitlines():
    c = _COMPUTATION.match(line)
    if c:
      computation = c.group(1)
      continue
    m = _INSTRUCTION.match(line)
    if not m or computation in fused or m.group(2) not in _DTYPE_BYTES:
      continue
    dims = [int(d) for d in m.group(3).split(",") if d]
    elements = int(np.prod(dims, dtype=np.int64))
    op, frame = _OP_NAME.search(line), _FRAME.search(line)
    entry = {"bytes": elements * _DTYPE_BYTES[m.group(2)], "elements": elements, "dims": dims,
             "shape": f"{m.group(2)}[{m.group(3)}]", "opcode": m.group(4), "name": m.group(1),
             "op_name": op.group(1) if op else "", "source": frames.get(int(frame.group(1)), "") if frame else ""}
    k = (entry["shape"], entry["op_name"], entry["source"])  # one row per distinct tensor, not per copy
    if k not in found:
      found[k] = entry
  return sorted(found.values(), key=lambda e: -e["bytes"])


def largest_arrays(hlo_text: str, top: int = 5) -> list[dict]:
  """The ``top`` largest arrays of :func:`hlo_arrays`."""
  return hlo_arrays(hlo_text)[:top]
