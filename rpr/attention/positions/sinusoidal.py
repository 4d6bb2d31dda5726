"""Absolute sinusoidal encodings (Vaswani et al. 2017), added to the token embeddings."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rpr.attention.positions.base import Scheme, arange_from, register

Array = jax.Array


def sinusoid(positions: Array, features: int, dtype=jnp.float32) -> Array:
  """Vaswani et al.: ``PE(p, 2i) = sin(p / 10000^(2i/d))``, ``PE(p, 2i+1) = cos(...)``; ``[..., features]``."""
  half = features // 2
  # At least float32 (bfloat16 angles are useless), float64 when asked for.
  ct = jnp.promote_types(dtype, jnp.float32)
  inv = 1.0 / (10000.0 ** (2.0 * jnp.arange(half, dtype=ct) / features))
  angles = positions.astype(ct)[..., None] * inv
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(positions.shape + (2 * half,))
  if features % 2:
    pe = jnp.concatenate([pe, jnp.zeros(positions.shape + (1,))], axis=-1)
  return pe.astype(dtype)


def add_sinusoid(x: Array, offset) -> Array:
  """``x [b, L, d]`` plus the sinusoids of positions ``offset .. offset + L - 1``."""
  return x + sinusoid(arange_from(x.shape[1], offset), x.shape[-1], x.dtype)[None]


@register("sinusoidal")
class Sinusoidal(Scheme):
  """Absolute sinusoidal encoding added to the embeddings."""

  def embed(self, x: Array, offset=0) -> Array:
    return add_sinusoid(x, offset)
