"""Position schemes by name, one signature for all.

A scheme acts at up to two places of a Transformer:

* ``embed(x, offset)`` on the token embeddings ``[batch, length, features]``
  (absolute schemes add their encoding here; the others return ``x``);
* ``attend(query, key, q_offset)`` in every attention layer, on the projected
  ``[batch, length, heads, head_dim]`` queries and keys; it returns
  :class:`Terms`: possibly rotated query and key (RoPE), an additive logits bias
  (T5, ALiBi) and Shaw's relative tables.

Keys always sit at positions ``0 .. k_length-1`` and query ``i`` at
``q_offset + i``, so a decoder step at position ``t`` passes ``q_offset=t``.

Registered names: ``none``, ``sinusoidal``, ``learned``, ``shaw``, ``t5``,
``rope``, ``alibi``. ``get(name)`` returns the class; every class is built as
``cls(config=PositionConfig(...), num_heads=..., head_dim=...)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rpr import relative as rel
from rpr.attention import Relative

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PositionConfig:
  """Hyper-parameters of every scheme (each scheme reads its own)."""

  max_length: int = 512  # learned: table size; sinusoidal: longest position checked
  max_distance: int = 16  # shaw: clipping distance k
  use_keys: bool = True  # shaw: a^K on/off
  use_values: bool = True  # shaw: a^V on/off
  share_heads: bool = False  # shaw: one table for all heads (Shaw's big) vs per head (base)
  num_buckets: int = 32  # t5
  bucket_max_distance: int = 128  # t5
  rope_base: float = 10000.0  # rope
  alibi_directional: bool = False  # alibi: different slopes left and right (bidirectional attention)
  causal: bool = False  # t5 / alibi: set by the layer for causal self-attention

  def validate(self, scheme: str) -> None:
    if scheme == "shaw":
      rel.check_max_distance(self.max_distance)
    if scheme == "learned" and self.max_length < 1:
      raise ValueError(f"position max_length must be >= 1 for 'learned', got {self.max_length}")
    if scheme == "t5":
      if self.num_buckets < 2:
        raise ValueError(f"t5 num_buckets must be >= 2, got {self.num_buckets}")
      if self.bucket_max_distance < self.num_buckets:
        raise ValueError(f"t5 bucket_max_distance ({self.bucket_max_distance}) must be >= num_buckets ({self.num_buckets})")
    if scheme == "rope" and self.rope_base <= 1:
      raise ValueError(f"rope_base must be > 1, got {self.rope_base}")


@dataclasses.dataclass(frozen=True)
class Terms:
  """What a scheme contributes to one attention call."""

  query: Array
  key: Array
  bias_fn: Optional[Callable[[Array, Array], Array]] = None  # (q_pos [q], k_pos [k]) -> [h, q, k]
  relative: Optional[Relative] = None

  def bias(self, q_length: int, k_length: int, q_offset=0) -> Optional[Array]:
    """Dense ``[1, h, q, k]`` bias, or None."""
    if self.bias_fn is None:
      return None
    q_pos = jnp.arange(q_length) + jnp.asarray(q_offset, jnp.int32)
    return self.bias_fn(q_pos, jnp.arange(k_length))[None]


SCHEMES: dict[str, type] = {}


def register(name: str):
  def deco(cls):
    SCHEMES[name] = cls
    cls.scheme_name = name
    return cls
  return deco


def get(name: str) -> type:
  if name not in SCHEMES:
    raise ValueError(f"unknown position scheme {name!r}; allowed: {sorted(SCHEMES)}")
  return SCHEMES[name]


def make(scheme: str, num_heads: int, head_dim: int, config: Optional[PositionConfig] = None, **kw):
  """Builds the scheme named ``scheme`` after validating its config (``kw``: linen ``name``, ``parent``)."""
  cls = get(scheme)
  config = config or PositionConfig()
  config.validate(scheme)
  return cls(config=config, num_heads=num_heads, head_dim=head_dim, **kw)


class Scheme(nn.Module):
  """Base: no position information (``none``)."""

  config: PositionConfig = PositionConfig()
  num_heads: int = 1
  head_dim: int = 1

  def embed(self, x: Array, offset=0) -> Array:
    return x

  def attend(self, query: Array, key: Array, q_offset=0) -> Terms:
    return Terms(query, key)


register("none")(Scheme)


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


def _positions(length: int, offset) -> Array:
  return jnp.arange(length) + jnp.asarray(offset, jnp.int32)


@register("sinusoidal")
class Sinusoidal(Scheme):
  """Absolute sinusoidal encoding added to the embeddings."""

  def embed(self, x: Array, offset=0) -> Array:
    return x + sinusoid(_positions(x.shape[1], offset), x.shape[-1], x.dtype)[None]


@register("learned")
class Learned(Scheme):
  """Absolute learned embedding per position (``max_length`` rows)."""

  @nn.compact
  def embed(self, x: Array, offset=0) -> Array:
    n = self.config.max_length
    if x.shape[1] > n:
      raise ValueError(f"sequence length {x.shape[1]} exceeds the learned table's max_length {n}")
    table = self.param("embedding", nn.initializers.normal(0.02), (n, x.shape[-1]))
    rows = jax.lax.dynamic_slice_in_dim(table, jnp.asarray(offset, jnp.int32), x.shape[1])
    return x + rows.astype(x.dtype)[None]


@register("shaw")
class Shaw(Scheme):
  """Shaw et al. (2018): learned a^K and a^V tables of ``2k+1`` vectors, clipped at ``k``."""

  @nn.compact
  def attend(self, query: Array, key: Array, q_offset=0) -> Terms:
    c = self.config
    k = rel.check_max_distance(c.max_distance)
    shape = (2 * k + 1, self.head_dim) if c.share_heads else (self.num_heads, 2 * k + 1, self.head_dim)
    init = nn.initializers.normal(self.head_dim ** -0.5)
    kt = self.param("key_table", init, shape) if c.use_keys else None
    vt = self.param("value_table", init, shape) if c.use_values else None
    if kt is None and vt is None:
      return Terms(query, key)
    return Terms(query, key, relative=Relative(k, kt, vt, offset=q_offset))


def t5_bucket(relative_position: Array, bidirectional: bool, num_buckets: int, max_distance: int) -> Array:
  """T5's bucket of ``key - query``: exact below ``num_buckets/2`` (per side), log-spaced to ``max_distance``."""
  n = num_buckets
  ret = 0
  rp = relative_position
  if bidirectional:
    n //= 2
    ret = (rp > 0).astype(jnp.int32) * n
    rp = jnp.abs(rp)
  else:
    rp = jnp.maximum(-rp, 0)
  max_exact = n // 2
  is_small = rp < max_exact
  large = max_exact + (
      jnp.log(jnp.maximum(rp, 1).astype(jnp.float32) / max_exact)
      / math.log(max_distance / max_exact) * (n - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, n - 1)
  return ret + jnp.where(is_small, rp, large)


@register("t5")
class T5Bias(Scheme):
  """Raffel et al. (2020): one learned scalar per (bucketed relative distance, head)."""

  @nn.compact
  def attend(self, query: Array, key: Array, q_offset=0) -> Terms:
    c = self.config
    table = self.param("bias", nn.initializers.normal(0.02), (c.num_buckets, self.num_heads))

    def bias_fn(q_pos, k_pos):
      buckets = t5_bucket(k_pos[None, :] - q_pos[:, None], not c.causal, c.num_buckets, c.bucket_max_distance)
      return jnp.transpose(table[buckets], (2, 0, 1))

    return Terms(query, key, bias_fn=bias_fn)


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

  def attend(self, query: Array, key: Array, q_offset=0) -> Terms:
    b = self.config.rope_base
    return Terms(rotate(query, _positions(query.shape[1], q_offset), b),
                 rotate(key, jnp.arange(key.shape[1]), b))


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al. (2022): geometric slopes ``2^(-8 h / H)``, extended for non-powers of two."""
  def pow2(n):
    start = 2 ** (-8 / n)
    return [start ** (i + 1) for i in range(n)]
  p = 2 ** math.floor(math.log2(num_heads))
  slopes = pow2(p)
  if p < num_heads:
    slopes += pow2(2 * p)[0::2][: num_heads - p]
  return np.asarray(slopes, np.float32)


@register("alibi")
class ALiBi(Scheme):
  """ALiBi: bias ``-m_h |j - i|``.

  Unchanged (``alibi_directional=False``) the bias is symmetric, so in
  bidirectional attention it sees distance but not direction. The directional
  variant halves the slope for keys to the right of the query.
  """

  def attend(self, query: Array, key: Array, q_offset=0) -> Terms:
    slopes = jnp.asarray(alibi_slopes(self.num_heads))[:, None, None]
    directional = self.config.alibi_directional

    def bias_fn(q_pos, k_pos):
      d = (k_pos[None, :] - q_pos[:, None]).astype(jnp.float32)
      right = jnp.where(d > 0, 0.5, 1.0) if directional else 1.0
      return -slopes * jnp.abs(d) * right

    return Terms(query, key, bias_fn=bias_fn)
