"""Clipped relative positions as two linear maps over the logits (Shaw et al. 2018).

With relative distance ``rel[i, j] = j - (i + offset)`` and clipping distance
``k``, every query row ``i`` sorts its keys into ``2k + 1`` buckets
``clip(rel, -k, k) + k``, one per row of Shaw's tables. Shaw's two terms are the
two linear maps between a ``[..., q, 2k+1]`` tensor and a ``[..., q, k_len]`` tensor:

* ``expand(x)[i, j] = x[i, clip(rel[i, j]) + k]`` puts ``q_i . w^K_r`` on the
  logits (the a^K term);
* ``reduce(p)[i, r] = sum_{j in bucket r} p[i, j]`` collects the attention
  weights of each bucket, so that ``sum_j alpha_ij w^V_{clip(j-i)}`` becomes
  ``reduce(alpha) @ w^V`` (the a^V term).

They are each other's transpose, so each one's gradient is the other: no
scatter and no ``[q, k_len, head_dim]`` tensor is ever formed, and the extra
work is O(q k head_dim) for the small tables plus elementwise passes over the
logits. Where the compiler does not fuse those passes into the softmax, the
dense path holds about one logits-sized buffer per map; :mod:`rpr.attention.chunked`
avoids that by adding the out-of-band buckets as per-row constants and calling
these maps only on the blocks that the band crosses.

k is no argument of its own: :class:`Relative` reads it from the tables' ``2k + 1``
rows, the maps from the width of their bucket side (``reduce``'s is its output: ``rows``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention.masks import relative_distance

Array = jax.Array


def bucket_ids(q_len: int, k_len: int, rows: int, offset=0) -> Array:
  """``[q_len, k_len]`` bucket index ``clip(j - i - offset, -k, k) + k`` in ``[0, 2k]``, for ``rows = 2k + 1``."""
  k = rows // 2
  return jnp.clip(relative_distance(q_len, k_len, offset), -k, k) + k


def float0_like(x):
  return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


# Both maps are written so that no index array and no masked copy is
# materialised: a gather from the flattened operand needs only one coordinate,
# computed from iotas where it is used (``jnp.take_along_axis`` would take an
# explicit ``[..., q, k_len, ndim]`` int32 index tensor), and the masked row
# sums are one variadic reduce, which fuses with its masks into one pass over ``p``.

INT32_LIMIT = 2 ** 31 - 1


def _row_gather(x: Array, cols: Array) -> Array:
  """``out[..., i, t] = x[..., i, cols[i, t]]`` for ``cols`` ``[rows, n]`` int32 in ``[0, x.shape[-1])``.

  One gather from ``x`` flattened, at ``row * width + cols``, with the row
  number built from iotas: the index is computed elementwise where it is used.
  """
  width = x.shape[-1]
  shape = x.shape[:-1] + cols.shape[-1:]
  if x.size >= INT32_LIMIT or np.prod(shape[:-1]) * width >= INT32_LIMIT:
    # The flat index would overflow int32: fall back to the per-axis gather.
    return jnp.take_along_axis(x, jnp.broadcast_to(cols, shape), axis=-1, mode="clip")
  row = jnp.zeros(shape, jnp.int32)
  for axis in range(len(shape) - 1):
    row = row * shape[axis] + jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  index = row * width + jnp.broadcast_to(cols, shape)
  dims = jax.lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
  return jax.lax.gather(x.reshape(-1), index[..., None], dims, slice_sizes=(1,),
                        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def bucket_expand(x: Array, k_len: int, offset) -> Array:
  """:func:`expand` without its custom gradient (for kernels that write their own backward pass)."""
  q_len, rows = x.shape[-2:]
  return _row_gather(x, bucket_ids(q_len, k_len, rows, offset))


def _masked_row_sums(p: Array, *conditions: Array) -> tuple:
  """``sum_j where(c[i, j], p[..., i, j], 0)`` for each ``[q, k]`` condition, in one fused pass."""
  acc = jnp.promote_types(p.dtype, jnp.float32)
  zero = jnp.zeros((), acc)
  operands = tuple(jnp.where(c, p.astype(acc), zero) for c in conditions)
  sums = jax.lax.reduce(operands, (zero,) * len(operands),
                        lambda a, b: tuple(x + y for x, y in zip(a, b)), (p.ndim - 1,))
  return tuple(s.astype(p.dtype) for s in sums)


def bucket_reduce(p: Array, rows: int, offset) -> Array:
  """:func:`reduce` without its custom gradient (for kernels that write their own backward pass)."""
  k = rows // 2
  if k == 0:
    return jnp.sum(p, axis=-1, keepdims=True, dtype=jnp.promote_types(p.dtype, jnp.float32)).astype(p.dtype)
  q_len, k_len = p.shape[-2:]
  rel = relative_distance(q_len, k_len, offset)
  left, right = _masked_row_sums(p, rel <= -k, rel >= k)
  # Interior buckets hold one key each: key j = i + offset + r for r in (-k, k).
  r = jnp.arange(-k + 1, k, dtype=jnp.int32)
  j = jnp.arange(q_len, dtype=jnp.int32)[:, None] + jnp.asarray(offset, jnp.int32) + r
  valid = (j >= 0) & (j < k_len)
  inner = jnp.where(valid, _row_gather(p, jnp.clip(j, 0, k_len - 1)), 0).astype(p.dtype)
  return jnp.concatenate([left[..., None], inner, right[..., None]], axis=-1)


def expand(x: Array, k_len: int, offset=0) -> Array:
  """``[..., q, 2k+1] -> [..., q, k_len]``: ``out[i, j] = x[i, clip(j - i - offset, k) + k]``."""
  return _expand(x, k_len, x.shape[-1], offset)


# The width 2k+1 rides along as a static argument: the backward pass gets only the [..., q, k_len] cotangent.
@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _expand(x: Array, k_len: int, rows: int, offset) -> Array:
  return bucket_expand(x, k_len, offset)


def _expand_fwd(x, k_len, rows, offset):
  return bucket_expand(x, k_len, offset), offset


def _expand_bwd(k_len, rows, offset, g):
  return bucket_reduce(g, rows, offset), float0_like(offset)


_expand.defvjp(_expand_fwd, _expand_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def reduce(p: Array, rows: int, offset=0) -> Array:
  """``[..., q, k_len] -> [..., q, rows]``: sum of ``p[i, j]`` over the keys in each of the ``rows = 2k+1`` buckets."""
  return bucket_reduce(p, rows, offset)


def _reduce_fwd(p, rows, offset):
  return bucket_reduce(p, rows, offset), (offset, p.shape[-1])


def _reduce_bwd(rows, res, g):
  offset, k_len = res
  return bucket_expand(g, k_len, offset), float0_like(offset)


reduce.defvjp(_reduce_fwd, _reduce_bwd)


def expand_ids(x: Array, ids: Array) -> Array:
  """Explicit relation ids (trees, graphs): ``out[..., i, j] = x[..., i, ids[..., i, j]]``.

  ``ids`` is ``[q, k]`` or ``[batch, q, k]`` with values in ``[0, x.shape[-1])``.
  """
  if ids.ndim == 3:  # [b, q, k] -> [b, 1, q, k] against x [b, h, q, R]
    ids = ids[:, None]
  ids = jnp.broadcast_to(ids, x.shape[:-2] + ids.shape[-2:])
  return jnp.take_along_axis(x, ids, axis=-1, mode="clip")


def reduce_ids(p: Array, ids: Array, num_relations: int) -> Array:
  """Transpose of :func:`expand_ids`: ``out[..., i, r] = sum_{j: ids[i, j] = r} p[..., i, j]``."""
  if ids.ndim == 3:
    ids = ids[:, None]
  one_hot = jax.nn.one_hot(ids, num_relations, dtype=p.dtype)
  return jnp.einsum("...qk,...qkr->...qr", p, one_hot)


# ----------------------------------------------------------------------------
# Shaw's two terms for one attention call.


@dataclasses.dataclass(frozen=True)
class Relative:
  """Shaw et al. (2018) relative terms for one attention call.

  Attributes:
    key_table: a^K table ``[2k+1, head_dim]`` (shared across heads) or
      ``[heads, 2k+1, head_dim]`` (per head), or None to switch a^K off. Its
      ``2k+1`` rows give the clipping distance k (:attr:`max_distance`):
      relative ids are ``clip(j - i - offset, -k, k) + k``.
    value_table: a^V table, same layouts and rows, or None.
    offset: position of query 0 relative to key 0 (a decoder step at ``t`` has ``offset=t``).
    ids: explicit relation ids ``[q, k]`` or ``[batch, q, k]`` in ``[0, num_relations)``
      (trees, graphs); when given, ``offset`` is ignored, the tables have
      ``num_relations`` rows, and nothing is clipped.
  """

  key_table: Optional[Array] = None
  value_table: Optional[Array] = None
  offset: object = 0
  ids: Optional[Array] = None

  @property
  def num_relations(self) -> int:
    """Rows of the tables (``2k+1`` without ``ids``); 1 without tables."""
    for t in (self.key_table, self.value_table):
      if t is not None:
        return t.shape[-2]
    return 1

  @property
  def max_distance(self) -> int:
    """Shaw's clipping distance k, read from the tables' ``2k+1`` rows (0 without tables: no terms to clip)."""
    return self.num_relations // 2

  @property
  def static_offset(self) -> Optional[int]:
    """``offset`` when it is a Python or NumPy int, known when tracing (training); None when traced (decoding)."""
    o = self.offset
    return int(o) if isinstance(o, (int, np.integer)) and not isinstance(o, bool) else None

  def check(self, num_heads: int, head_dim: int) -> None:
    """Raises ``ValueError`` for tables of the wrong layout, or of different (or, without ``ids``, even) rows."""
    want = None  # the rows of the first table, which the other must have
    for name, t in (("key_table", self.key_table), ("value_table", self.value_table)):
      if t is None:
        continue
      rows = t.shape[-2] if t.ndim in (2, 3) else None
      if want is None and rows is not None and (rows % 2 or self.ids is not None):
        want = rows
      if rows is None or rows != want:
        r, why = ((want, " (the rows of key_table)") if want is not None else
                  ("R", "") if self.ids is not None else ("2k+1", " (an odd count: it gives the clipping distance k)"))
        raise ValueError(f"Relative.{name} has shape {tuple(t.shape)}; allowed: [{r}, {head_dim}] or "
                         f"[{num_heads}, {r}, {head_dim}]{why}")
      if t.shape[-1] != head_dim:
        raise ValueError(f"Relative.{name} head_dim is {t.shape[-1]}, but the heads have head_dim {head_dim}")
      if t.ndim == 3 and t.shape[0] != num_heads:
        raise ValueError(f"Relative.{name} has {t.shape[0]} head tables, but attention has {num_heads} heads")

  def within(self, q_length: int, k_length: int) -> "Relative":
    """The same terms with the tables cut to the distances these lengths can reach.

    With a static ``offset``, ``j - i - offset`` lies in ``[-(q-1) - offset,
    k-1 - offset]``; if that is inside ``[-k', k']`` for some ``k' < k``, no
    distance is clipped at ``k'`` either, and rows ``k-k' .. k+k'`` of each
    table are all that is ever read. Shaw's k = 64 or 256 on sentences of a few
    dozen tokens would otherwise multiply queries by hundreds of unused rows.
    Exact (the gradient of the cut rows is zero, as it is uncut); a traced
    offset (cached decoding) or explicit ids leave the terms as they are.
    """
    offset = self.static_offset
    if self.ids is not None or offset is None:
      return self
    k = self.max_distance
    reach = max(q_length - 1 + offset, k_length - 1 - offset, 0)
    if reach >= k:
      return self
    cut = lambda t: None if t is None else t[..., k - reach:k + reach + 1, :]
    return dataclasses.replace(self, key_table=cut(self.key_table), value_table=cut(self.value_table))

  def expand(self, x: Array, k_length: int) -> Array:
    """``[b, h, q, R] -> [b, h, q, k]``."""
    if self.ids is not None:
      return expand_ids(x, self.ids)
    return expand(x, k_length, self.offset)

  def reduce(self, p: Array) -> Array:
    """``[b, h, q, k] -> [b, h, q, R]``."""
    if self.ids is not None:
      return reduce_ids(p, self.ids, self.num_relations)
    return reduce(p, self.num_relations, self.offset)
