"""A command's settings as one frozen dataclass, and the absl flags derived from it.

Each field is one flag of the same name, its default the field's, its help
the field's ``metadata["help"]``: a knob is declared once. Booleans,
integers, floats and strings (or None) are flags of their kind; a
``tuple[int, ...]`` or ``tuple[str, ...]`` field is a comma-separated list
(``--lengths 128,256``; ``--lengths ''`` is empty). Library code takes the
dataclass; only the command line reads flags.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from absl import flags

T = TypeVar("T")
_ITEMS = {"tuple[int, ...]": int, "tuple[str, ...]": str}  # list fields, by annotation, and their item type
_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}


def knob(default: Any, help: str) -> Any:  # pylint: disable=redefined-builtin
  """A settings field with its flag's help."""
  return dataclasses.field(default=default, metadata={"help": help})


def define(cls: type, fv: flags.FlagValues = flags.FLAGS) -> None:
  """Defines a flag per field of the dataclass ``cls``."""
  for f in dataclasses.fields(cls):
    helptext = f.metadata.get("help", f.name)
    if f.type in _ITEMS:
      flags.DEFINE_list(f.name, [str(v) for v in f.default], helptext, flag_values=fv)
    else:  # by the default's own type (a bool is not taken for an int); a string or None otherwise
      _DEFINE.get(type(f.default), flags.DEFINE_string)(f.name, f.default, helptext, flag_values=fv)


def parse(cls: type[T], fv: flags.FlagValues = flags.FLAGS) -> T:
  """The ``cls`` the parsed flags describe."""
  values = {}
  for f in dataclasses.fields(cls):
    value = fv[f.name].value
    values[f.name] = tuple(_ITEMS[f.type](v) for v in value) if f.type in _ITEMS else value
  return cls(**values)
