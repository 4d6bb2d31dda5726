"""The position-scheme registry: :class:`Scheme` (also the scheme ``none``), :class:`Terms`, and the functions
that find, check and build a scheme by name (:func:`make`). Each scheme lives in a file of its own beside this one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention.relative import Relative

Array = jax.Array
BiasFn = Callable[[Array, Array], Array]  # (q_positions [q], k_positions [k]) -> [heads | 1, q, k]


@dataclasses.dataclass(frozen=True)
class Terms:
  """What a scheme contributes to one attention call."""

  query: Array
  key: Array
  bias_fn: Optional[BiasFn] = None
  relative: Optional[Relative] = None

  def bias(self, q_length: int, k_length: int, q_offset=0) -> Optional[Array]:
    """Dense ``[1, h, q, k]`` bias, or None."""
    if self.bias_fn is None:
      return None
    q_pos = arange_from(q_length, q_offset)
    return self.bias_fn(q_pos, jnp.arange(k_length))[None]


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """The options of a scheme that has none."""

  def check(self, head_dim: Optional[int] = None) -> None:
    """Raises ``ValueError`` (or ``TypeError``) naming a bad value and what is allowed."""


class Scheme(nn.Module):
  """Base of every scheme, and the scheme ``none`` (no position information).

  Attributes (set by the layer or the model):
    num_heads, head_dim: of the attention it serves.
    causal: causal self-attention (T5's one-sided buckets).
    max_length: longest position (learned tables).
    options: the scheme's ``Options`` (None: their defaults).
  """

  num_heads: int = 1
  head_dim: int = 1
  causal: bool = False
  max_length: int = 512
  options: Any = None

  Options: ClassVar[type] = NoOptions
  # One module for a whole stack (T5 shares its bias across layers) or one per layer (Shaw's tables).
  shared_across_layers: ClassVar[bool] = False
  scheme_name: ClassVar[str] = "none"

  def __post_init__(self):
    if self.options is None:
      object.__setattr__(self, "options", type(self).Options())
    super().__post_init__()

  def embed(self, x: Array, offset=0) -> Array:
    return x

  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    return Terms(query, key)

  @classmethod
  def acts_in_attention(cls) -> bool:
    return cls.terms is not Scheme.terms

  @classmethod
  def note(cls, options, max_length: int, where: str) -> Optional[str]:
    """What valid ``options`` may not do as they seem to with sequences up to ``max_length``, naming them by
    ``where``; None (the default): nothing to say."""
    return None


SCHEMES: dict[str, type] = {}


def register(name: str):
  """Class decorator: the scheme is known as ``name`` from now on."""
  def deco(cls):
    if name in SCHEMES:
      raise ValueError(f"position scheme {name!r} is already registered")
    SCHEMES[name] = cls
    cls.scheme_name = name
    return cls
  return deco


def get(name: str) -> type:
  if not isinstance(name, str) or name not in SCHEMES:
    raise ValueError(f"unknown position scheme {name!r}; allowed: {sorted(SCHEMES)}")
  return SCHEMES[name]


def defaults(name: str) -> dict[str, Any]:
  """The options ``name`` declares, with their defaults (``{}`` for a scheme without options)."""
  return dataclasses.asdict(get(name).Options())


def parse_options(name: str, values=None, head_dim: Optional[int] = None):
  """The typed, checked ``Options`` of scheme ``name`` from a mapping of its fields (or its ``Options``).

  Fields left out keep their defaults. An unknown field, a value of the
  wrong type or out of range raises ``ValueError`` naming it and what is
  allowed; ``head_dim`` adds the checks that depend on it (RoPE's even width).
  """
  cls = get(name).Options
  if isinstance(values, cls):
    options = values
  elif dataclasses.is_dataclass(values):
    raise ValueError(f"options {values!r} are not {name}'s; allowed: {name}'s Options, or a mapping of its fields")
  else:
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
      if key not in fields:
        raise ValueError(f"{name} has no option {key!r}; allowed: {sorted(fields) or 'none'}")
      _check_type(name, key, value, type(fields[key].default))
    options = cls(**values)
  try:
    options.check(head_dim)
  except TypeError as e:
    raise ValueError(str(e)) from None
  return options


def _check_type(scheme: str, key: str, value, want: type) -> None:
  if want is float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  elif want is int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  else:
    ok = isinstance(value, want)
  if not ok:
    raise ValueError(f"{scheme} option {key} = {value!r} is not allowed; allowed: a {want.__name__}")


def make(scheme: str, num_heads: int, head_dim: int, *, options=None, causal: bool = False, max_length: int = 512,
         **linen_kwargs) -> Scheme:
  """The module of scheme ``scheme`` with ``options`` (its ``Options``, a mapping of them, or None for defaults).

  ``linen_kwargs``: ``name``, ``parent`` of the module.
  """
  options = parse_options(scheme, options, head_dim)
  return get(scheme)(num_heads=num_heads, head_dim=head_dim, causal=causal, max_length=max_length, options=options,
                     **linen_kwargs)


register("none")(Scheme)


def arange_from(length: int, offset) -> Array:
  """Positions ``offset .. offset + length - 1``."""
  return jnp.arange(length) + jnp.asarray(offset, jnp.int32)
