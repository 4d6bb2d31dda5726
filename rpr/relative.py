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
logits that XLA fuses into the softmax.
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


def _expand(x: Array, k_len: int, max_distance: int, offset) -> Array:
  q_len = x.shape[-2]
  ids = bucket_ids(q_len, k_len, max_distance, offset)
  ids = jnp.broadcast_to(ids, x.shape[:-2] + (q_len, k_len))
  return jnp.take_along_axis(x, ids, axis=-1, mode="clip")


def _reduce(p: Array, max_distance: int, offset) -> Array:
  k = max_distance
  if k == 0:
    return jnp.sum(p, axis=-1, keepdims=True)
  q_len, k_len = p.shape[-2:]
  rel = relative_distance(q_len, k_len, offset)
  left = jnp.sum(jnp.where(rel <= -k, p, 0), axis=-1, keepdims=True)
  right = jnp.sum(jnp.where(rel >= k, p, 0), axis=-1, keepdims=True)
  # Interior buckets hold one key each: key j = i + offset + r for r in (-k, k).
  r = jnp.arange(-k + 1, k, dtype=jnp.int32)
  j = jnp.arange(q_len, dtype=jnp.int32)[:, None] + jnp.asarray(offset, jnp.int32) + r
  valid = (j >= 0) & (j < k_len)
  j = jnp.broadcast_to(jnp.clip(j, 0, k_len - 1), p.shape[:-2] + j.shape)
  inner = jnp.where(valid, jnp.take_along_axis(p, j, axis=-1, mode="clip"), 0)
  return jnp.concatenate([left, inner.astype(p.dtype), right], axis=-1)


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
