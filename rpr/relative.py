"""Clipped relative positions as two linear maps over the logits (Shaw et al. 2018).

With relative distance ``rel[i, j] = j - (i + offset)`` and clipping distance
``k``, every query row ``i`` sorts its keys into ``2k + 1`` buckets
``clip(rel, -k, k) + k``. Shaw's two terms are the two linear maps between a
``[..., q, 2k+1]`` tensor and a ``[..., q, k_len]`` tensor:

* ``expand(x)[i, j] = x[i, clip(rel[i, j]) + k]`` puts ``q_i . w^K_r`` on the
  logits (the a^K term);
* ``reduce(p)[i, r] = sum_{j in bucket r} p[i, j]`` collects the attention
  weights of each bucket, so that ``sum_j alpha_ij w^V_{clip(j-i)}`` becomes
  ``reduce(alpha) @ w^V`` (the a^V term).

They are each other's transpose, so each one's gradient is the other: no
scatter and no ``[q, k_len, head_dim]`` tensor is ever formed, and the extra
work is O(q k head_dim) for the small tables plus elementwise passes over the
logits. On XLA's CPU backend those passes are not fused into the softmax (its
library fusion of dot + softmax takes no gathers), so the dense path still pays
about one logits-sized buffer per map; :mod:`rpr.chunked` avoids that by
adding the out-of-band buckets as per-row constants and calling these maps
only on the blocks that the band crosses.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def check_max_distance(max_distance) -> int:
  """Returns ``max_distance`` as an int, or raises naming the bad value."""
  if isinstance(max_distance, bool) or not isinstance(max_distance, (int, np.integer)):
    raise TypeError(f"max_distance (clipping distance k) must be an int >= 0, got {max_distance!r}")
  if max_distance < 0:
    raise ValueError(f"max_distance (clipping distance k) must be >= 0, got {max_distance}")
  return int(max_distance)


def relative_distance(q_len: int, k_len: int, offset=0) -> Array:
  """``[q_len, k_len]`` int32 matrix ``j - (i + offset)``: key position minus query position."""
  i = jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 0)
  j = jax.lax.broadcasted_iota(jnp.int32, (q_len, k_len), 1)
  return j - (i + jnp.asarray(offset, jnp.int32))


def bucket_ids(q_len: int, k_len: int, max_distance: int, offset=0) -> Array:
  """``[q_len, k_len]`` bucket index ``clip(j - i - offset, -k, k) + k`` in ``[0, 2k]``."""
  k = max_distance
  return jnp.clip(relative_distance(q_len, k_len, offset), -k, k) + k


def _float0_like(x):
  return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


# Both maps are written so that XLA fuses them into their neighbours instead
# of materialising index arrays. ``jnp.take_along_axis`` builds its indices as
# an explicit ``[..., q, k_len, ndim]`` int32 tensor (4x the logits for
# [b, h, q, k]); a gather from the flattened operand needs only one
# coordinate, computed from iotas inside the fusion. Masked row sums are one
# variadic reduce, which XLA's CPU backend emits as a single fused pass (a
# plain ``sum(where(...))`` gets split off into a separate library reduction
# that first writes the masked copy to memory).

_INT32_LIMIT = 2 ** 31 - 1


def _row_gather(x: Array, cols: Array) -> Array:
  """``out[..., i, t] = x[..., i, cols[i, t]]`` for ``cols`` ``[rows, n]`` int32 in ``[0, x.shape[-1])``.

  One gather from ``x`` flattened, at ``row * width + cols``, with the row
  number built from iotas: the index is computed elementwise where it is used.
  """
  width = x.shape[-1]
  shape = x.shape[:-1] + cols.shape[-1:]
  if x.size >= _INT32_LIMIT or np.prod(shape[:-1]) * width >= _INT32_LIMIT:
    # The flat index would overflow int32: fall back to the per-axis gather.
    return jnp.take_along_axis(x, jnp.broadcast_to(cols, shape), axis=-1, mode="clip")
  row = jnp.zeros(shape, jnp.int32)
  for axis in range(len(shape) - 1):
    row = row * shape[axis] + jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  index = row * width + jnp.broadcast_to(cols, shape)
  dims = jax.lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
  return jax.lax.gather(x.reshape(-1), index[..., None], dims, slice_sizes=(1,),
                        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def _expand(x: Array, k_len: int, max_distance: int, offset) -> Array:
  q_len = x.shape[-2]
  return _row_gather(x, bucket_ids(q_len, k_len, max_distance, offset))


def _masked_row_sums(p: Array, *conditions: Array) -> tuple:
  """``sum_j where(c[i, j], p[..., i, j], 0)`` for each ``[q, k]`` condition, in one fused pass."""
  acc = jnp.promote_types(p.dtype, jnp.float32)
  zero = jnp.zeros((), acc)
  operands = tuple(jnp.where(c, p.astype(acc), zero) for c in conditions)
  sums = jax.lax.reduce(operands, (zero,) * len(operands),
                        lambda a, b: tuple(x + y for x, y in zip(a, b)), (p.ndim - 1,))
  return tuple(s.astype(p.dtype) for s in sums)


def _reduce(p: Array, max_distance: int, offset) -> Array:
  k = max_distance
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def expand(x: Array, k_len: int, max_distance: int, offset=0) -> Array:
  """``[..., q, 2k+1] -> [..., q, k_len]``: ``out[i, j] = x[i, clip(j - i - offset, k) + k]``."""
  return _expand(x, k_len, max_distance, offset)


def _expand_fwd(x, k_len, max_distance, offset):
  return _expand(x, k_len, max_distance, offset), offset


def _expand_bwd(k_len, max_distance, offset, g):
  return _reduce(g, max_distance, offset), _float0_like(offset)


expand.defvjp(_expand_fwd, _expand_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def reduce(p: Array, max_distance: int, offset=0) -> Array:
  """``[..., q, k_len] -> [..., q, 2k+1]``: sum of ``p[i, j]`` over the keys in each bucket."""
  return _reduce(p, max_distance, offset)


def _reduce_fwd(p, max_distance, offset):
  return _reduce(p, max_distance, offset), (offset, p.shape[-1])


def _reduce_bwd(max_distance, res, g):
  offset, k_len = res
  return _expand(g, k_len, max_distance, offset), _float0_like(offset)


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
