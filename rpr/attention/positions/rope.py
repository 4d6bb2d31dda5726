"""Rotary position embedding (Su et al. 2021) on the queries and keys."""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention.positions.base import Scheme, Terms, arange_from, register

Array = jax.Array


def rotate(x: Array, positions: Array, base: float = 10000.0) -> Array:
  """RoPE (Su et al. 2021): rotate feature pairs ``(x_2i, x_2i+1)`` by ``p * base^(-2i/d)``.

  ``x`` is ``[batch, length, heads, head_dim]`` (even head_dim), ``positions`` ``[length]``.
  """
  d = x.shape[-1]
  if d % 2:
    raise ValueError(f"rope needs an even head_dim, got {d}")
  # At least float32 (bfloat16 angles are useless), float64 for float64 inputs.
  ct = jnp.promote_types(x.dtype, jnp.float32)
  inv = base ** (-jnp.arange(0, d, 2, dtype=ct) / d)
  angles = positions.astype(ct)[:, None] * inv  # [l, d/2]
  cos, sin = jnp.cos(angles)[None, :, None], jnp.sin(angles)[None, :, None]
  x1, x2 = x[..., 0::2].astype(ct), x[..., 1::2].astype(ct)
  out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
  return out.reshape(x.shape).astype(x.dtype)


@register("rope")
class RoPE(Scheme):
  """Rotary position embedding on queries and keys: ``q_i . k_j`` depends on ``j - i`` only."""

  @dataclasses.dataclass(frozen=True)
  class Options:
    rope_base: float = 10000.0  # frequency base

    def check(self, head_dim: Optional[int] = None) -> None:
      # inf, or an int no float holds, is not a base
      if not 1 < self.rope_base <= float(np.finfo(np.float64).max):
        raise ValueError(f"rope option rope_base = {self.rope_base!r} is not allowed; allowed: a finite number > 1")
      if head_dim is not None and head_dim % 2:
        raise ValueError(f"rope needs an even head_dim, got {head_dim}")

  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    b = self.options.rope_base
    return Terms(rotate(query, arange_from(query.shape[1], q_offset), b),
                 rotate(key, jnp.arange(key.shape[1]), b))
