"""Which keys each query may attend to: one structure for the dense and the chunked implementations.

A :class:`Mask` describes the mask by its parts instead of holding a
``[batch, heads, q_length, k_length]`` array: key validity (padding),
causality and a local window, all relative to the query positions
``q_offset + i`` (keys sit at ``0 .. k_length-1``). The dense implementation
materialises it (:meth:`Mask.dense`); the chunked one evaluates it per block
(skipping the key blocks that causality or the window rules out for a whole
query block), so its memory stays linear in the lengths and a window's time
is O(length x window).
Any other pattern (trees, graphs) goes in ``Mask.array``, which both
implementations accept at the cost of its own O(q k) bytes.

A query row that the mask leaves without any key attends to nothing: its
output is zero and it passes no gradient, in both implementations.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def check_offset(offset, name: str = "q_offset"):
  """``offset`` as given if it is an integer position (int or an integer-dtype array, traced or not); else an error.

  A float would be truncated by the int32 cast below (1.5 -> 1) and a bool
  read as 0 or 1: both are rejected, naming ``name``.
  """
  if isinstance(offset, (bool, np.bool_)) or not (
      isinstance(offset, (int, np.integer)) or jnp.issubdtype(getattr(offset, "dtype", float), jnp.integer)):
    raise TypeError(f"{name} must be an integer position (an int or an integer array), got {offset!r}")
  return offset


def relative_distance(q_len: int, k_len: int, offset=0) -> Array:
  """``[q_len, k_len]`` int32 matrix ``j - (i + offset)``: key position minus query position."""
  i = jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 0)
  j = jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 1)
  return j - (i + jnp.asarray(check_offset(offset, "offset"), jnp.int32))


def check_window(window) -> Optional[int]:
  if window is None:
    return None
  if isinstance(window, (bool, np.bool_)) or not isinstance(window, (int, np.integer)) or window < 0:
    raise ValueError(f"window must be None or an int >= 0, got {window!r}")
  return int(window)


def check_array(mask: Optional[Array], shape: tuple, name: str = "mask") -> None:
  """``mask`` must broadcast to ``shape`` = [batch, heads, q_length, k_length]."""
  if mask is None:
    return
  ok = mask.ndim == 4 and all(m in (1, s) for m, s in zip(mask.shape, shape))
  if not ok:
    raise ValueError(
        f"{name} has shape {tuple(mask.shape)}; it must broadcast to [batch, heads, q_length, k_length] = {shape}"
        " (each dim equal or 1)")


def check_boolean(mask, name: str) -> None:
  """``mask`` must be None or a boolean array (True = may attend): a float or int mask is refused, not read.

  A 0 / -1e9 additive mask read as booleans would be inverted (0 -> False).
  """
  dtype = getattr(mask, "dtype", None) if mask is not None else np.dtype(bool)
  if dtype is None:
    dtype = np.asarray(mask).dtype
  if dtype != np.dtype(bool):
    raise TypeError(f"{name} has dtype {dtype}; allowed: a boolean array, True = may attend. Convert an additive "
                    "mask m (0 = attend, a large negative value = masked) with m == 0, and a 0/1 mask with m != 0")


@dataclasses.dataclass(frozen=True)
class Mask:
  """The keys query ``i`` (at position ``q_offset + i``) may attend to: all of the parts that are set.

  Attributes:
    key_valid: ``[batch, k_length]`` (or ``[1, k_length]``) booleans, False for padding keys.
    causal: only keys ``j <= q_offset + i`` (decoder self-attention, cached decoding).
    window: only keys ``|j - (q_offset + i)| <= window`` (restricted attention).
    array: any other boolean mask, broadcastable to ``[batch, heads, q_length, k_length]``.
  """

  key_valid: Optional[Array] = None
  causal: bool = False
  window: Optional[int] = None
  array: Optional[Array] = None

  def __post_init__(self):
    check_boolean(self.key_valid, "Mask.key_valid")
    check_boolean(self.array, "mask" if self.key_valid is None and not self.causal and self.window is None
                  else "Mask.array")

  def check(self, batch: int, heads: int, q_length: int, k_length: int) -> None:
    check_window(self.window)
    if self.key_valid is not None and (self.key_valid.ndim != 2 or self.key_valid.shape[0] not in (1, batch)
                                       or self.key_valid.shape[1] != k_length):
      raise ValueError(f"Mask.key_valid has shape {tuple(self.key_valid.shape)}; allowed: [batch, k_length] = "
                       f"{(batch, k_length)} (or [1, k_length])")
    check_array(self.array, (batch, heads, q_length, k_length), "Mask.array")

  def dense(self, q_length: int, k_length: int, q_offset=0) -> Optional[Array]:
    """The mask as a boolean ``[batch | 1, heads | 1, q_length, k_length]`` array, or None if it allows all."""
    parts = []
    if self.key_valid is not None:
      parts.append(self.key_valid.astype(bool)[:, None, None, :])
    if self.causal or self.window is not None:
      d = relative_distance(q_length, k_length, q_offset)
      parts += [rule[None, None] for rule in position_rules(d, self.causal, self.window)]
    if self.array is not None:
      parts.append(self.array.astype(bool))
    return combine(*parts)


def position_rules(d: Array, causal: bool, window: Optional[int]) -> list[Array]:
  """The causal and window rules on distances ``d = j - (q_offset + i)``: causal keeps ``d <= 0``, a window
  ``|d| <= window``. The one place they are written; the dense mask and the chunked kernel's tiles use it."""
  rules = []
  if causal:
    rules.append(d <= 0)
  if window is not None:
    rules.append(jnp.abs(d) <= window)
  return rules


def combine(*masks: Optional[Array]) -> Optional[Array]:
  """The logical and of the given boolean arrays (None ones skipped); None if none is given."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = out & m
  return out


def causal_mask(q_length: int, k_length: int, offset=0) -> Array:
  """``[1, 1, q, k]``: query ``i`` (at position ``i + offset``) sees keys ``j <= i + offset``."""
  return Mask(causal=True).dense(q_length, k_length, offset)


def padding_mask(q_valid: Optional[Array], k_valid: Array) -> Array:
  """``[batch, 1, q, k]`` from ``[batch, q]`` / ``[batch, k]`` booleans (``q_valid`` may be None)."""
  m = k_valid[:, None, None, :]
  if q_valid is not None:
    m = m & q_valid[:, None, :, None]
  return m


def window_mask(q_length: int, k_length: int, window: int, offset=0, causal: bool = False) -> Array:
  """``[1, 1, q, k]``: keys within ``window`` positions of the query (restricted attention)."""
  return Mask(causal=causal, window=check_window(window)).dense(q_length, k_length, offset)
