"""A setting declared once: its default, type and range beside the dataclass field, and the one check that reads them.

``n: int = setting(64, int, lo=1, hi=2**20)`` is a dataclass field whose
metadata says what a value must be; :func:`check` holds every field of a
dataclass instance to its declaration and raises ``ValueError`` naming the
key, the value and what is allowed (``config.batch_size = 0 is not allowed;
allowed: an int >= 1 and <= 1048576``). A rule between fields (``min_length
<= max_length``) is the section's own ``check`` method, called after these.
Nothing here knows a run: :mod:`rpr.config`, :mod:`rpr.model` and the data
sets' sections (:mod:`rpr.data.sections`) declare their fields with it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Iterable, Optional

_META = "rpr_setting"  # the metadata key of a declared field


@dataclasses.dataclass(frozen=True)
class Spec:
  """What a field's value must be: ``kind`` (int, float, bool, str, or ``tuple`` of ``item``) in ``[lo, hi]``."""
  kind: type
  lo: Optional[float] = None
  hi: Optional[float] = None
  lo_open: bool = False  # lo itself is refused (a learning rate > 0)
  hi_open: bool = False  # hi itself is refused (label smoothing < 1)
  finite: bool = True  # float: inf is refused (grad_clip_norm allows it: no clipping)
  choices: Optional[tuple] = None
  optional: bool = False  # None is allowed
  item: Optional[type] = None  # tuple: the type of each item
  increasing: bool = False  # tuple of ints: strictly increasing
  why: str = ""  # said after the range, e.g. " (None: the data set's default)"


def setting(default: Any, kind: type, **spec) -> Any:
  """A dataclass field with ``default`` whose value :func:`check` holds to ``Spec(kind, **spec)``."""
  return dataclasses.field(default=default, metadata={_META: Spec(kind, **spec)})


def spec(field: dataclasses.Field) -> Optional[Spec]:
  return field.metadata.get(_META)


def _real(v) -> Optional[float]:
  """``v`` as a float, or None if it is not a real number (bools are not); ``10**400`` is inf."""
  if isinstance(v, bool) or not isinstance(v, numbers.Real):
    return None
  try:
    return float(v)
  except OverflowError:
    return math.inf if v > 0 else -math.inf


def allowed(s: Spec) -> str:
  """What ``s`` allows, in the words of an error message."""
  if s.choices is not None:
    text = repr(list(s.choices))
  elif s.kind is bool:
    text = "True or False"
  elif s.kind is tuple:
    name = {str: "names", int: "ints"}.get(s.item, "values")
    text = f"a tuple of {'increasing ' if s.increasing else ''}{name}" + (f" >= {s.lo}" if s.lo is not None else "")
  elif s.kind is str:
    text = "a str"
  else:
    noun = "an int" if s.kind is int else "a number"
    text = noun + (f" {'>' if s.lo_open else '>='} {s.lo}" if s.lo is not None else "")
    if s.hi is not None:
      text += f" and {'<' if s.hi_open else '<='} {s.hi}"
    elif s.kind is float and s.finite:
      text += " and finite"
  return text + (" or None" if s.optional else "") + s.why


def ok(s: Spec, v) -> bool:
  """Whether ``v`` is a value ``s`` allows."""
  if v is None:
    return s.optional
  if s.choices is not None:
    return isinstance(v, str) and v in s.choices
  if s.kind is bool:
    return isinstance(v, bool)
  if s.kind is str:
    return isinstance(v, str)
  if s.kind is tuple:
    items = Spec(s.item, lo=s.lo)
    return (isinstance(v, (tuple, list)) and all(ok(items, x) for x in v)
            and (not s.increasing or list(v) == sorted(set(v))))
  f = _real(v)
  if f is None or math.isnan(f) or (s.kind is int and not isinstance(v, numbers.Integral)):
    return False
  if s.lo is not None and (f <= s.lo if s.lo_open else f < s.lo):
    return False
  if s.hi is not None and (f >= s.hi if s.hi_open else f > s.hi):
    return False
  return math.isfinite(f) or not s.finite


def refuse(key: str, value, allowed_text: str) -> None:
  """The one error of a bad setting: ``config.<key> = <value> is not allowed; allowed: ...``."""
  raise ValueError(f"config.{key} = {value!r} is not allowed; allowed: {allowed_text}")


def check(section, prefix: str = "", skip: Iterable[str] = ()) -> None:
  """Holds every declared field of the dataclass ``section`` to its :class:`Spec`; then ``section.check()``.

  ``prefix`` names the section in errors (``model.``).
  """
  for field in dataclasses.fields(section):
    s = spec(field)
    if s is not None and field.name not in skip and not ok(s, getattr(section, field.name)):
      refuse(prefix + field.name, getattr(section, field.name), allowed(s))
  if hasattr(section, "check"):
    section.check()


def names(cls) -> tuple[str, ...]:
  """The declared fields of the dataclass ``cls``: the keys it reads."""
  return tuple(f.name for f in dataclasses.fields(cls) if spec(f) is not None)
