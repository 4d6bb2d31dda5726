"""Shaw's terms on the dense path (:mod:`rpr.attention.dense`): ``a^K`` as logits, ``a^V`` as values.

The maps of :mod:`rpr.attention.relative`, laid out head-major: the bucket
tensors live as ``[h, b, q, 2k+1]``, the layout in which a matmul batched over
heads writes and reads them, and the table products have hand-written
gradients.

XLA:CPU otherwise picks layouts that cost more than Shaw's arithmetic: ``q W^K``
came out as ``[h, 2k+1, b q]``, so the gather that spreads it over the logits
read it with a stride of ``b q`` floats (5x the time of the same gather from
contiguous rows), and each table's gradient ``sum_{b,q} buckets^T g`` became a
dot contracting both operands on their row axis, which XLA:CPU runs outside its
fast GEMM (10x the time of the forward product). Here the weight gradients are
written as ``[h, R, n] x [h, n, d]`` GEMMs (the transposed copies are
``[h, b q, R]`` sized, a few percent of the logits). Exactly the same sums (A/B
and the exactness tests: experiments/results/bench/shaw_step/).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention import relative as maps
from rpr.attention.relative import Relative, bucket_ids, bucket_reduce, float0_like

Array = jax.Array


def _table_einsum(spec_shared: str, spec_heads: str, a: Array, table: Array) -> Array:
  return jnp.einsum(spec_shared if table.ndim == 2 else spec_heads, a, table.astype(a.dtype))



def _head_major_gather(x: Array, cols: Array) -> Array:
  """``out[b, h, i, t] = x[h, b, i, cols[i, t]]`` for head-major ``x [h, b, q, R]`` and ``cols [q, n]``."""
  h, b, q, width = x.shape
  shape = (b, h, q, cols.shape[-1])
  if x.size >= maps.INT32_LIMIT or np.prod(shape[:-1]) * width >= maps.INT32_LIMIT:
    return jnp.take_along_axis(jnp.swapaxes(x, 0, 1), jnp.broadcast_to(cols, shape), axis=-1, mode="clip")
  iota = lambda axis: jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  index = ((iota(1) * b + iota(0)) * q + iota(2)) * width + jnp.broadcast_to(cols, shape)
  dims = jax.lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
  return jax.lax.gather(x.reshape(-1), index[..., None], dims, slice_sizes=(1,),
                        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def expand_heads(x: Array, k_len: int, offset=0) -> Array:
  """:func:`rpr.attention.relative.expand` from head-major buckets: ``[h, b, q, 2k+1] -> [b, h, q, k_len]``."""
  return _expand_heads(x, k_len, x.shape[-1], offset)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _expand_heads(x: Array, k_len: int, rows: int, offset) -> Array:
  return _head_major_gather(x, bucket_ids(x.shape[-2], k_len, rows, offset))


def _expand_heads_fwd(x, k_len, rows, offset):
  return _expand_heads(x, k_len, rows, offset), offset


def _expand_heads_bwd(k_len, rows, offset, g):
  return jnp.swapaxes(bucket_reduce(g, rows, offset), 0, 1), float0_like(offset)


_expand_heads.defvjp(_expand_heads_fwd, _expand_heads_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def reduce_heads(p: Array, rows: int, offset=0) -> Array:
  """:func:`rpr.attention.relative.reduce` into head-major buckets: ``[b, h, q, k_len] -> [h, b, q, rows = 2k+1]``."""
  return jnp.swapaxes(bucket_reduce(p, rows, offset), 0, 1)


def _reduce_heads_fwd(p, rows, offset):
  return reduce_heads(p, rows, offset), (offset, p.shape[-1])


def _reduce_heads_bwd(rows, res, g):
  offset, k_len = res
  return _head_major_gather(g, bucket_ids(g.shape[-2], k_len, rows, offset)), float0_like(offset)


reduce_heads.defvjp(_reduce_heads_fwd, _reduce_heads_bwd)


def _table_grad(buckets: Array, x: Array) -> Array:
  """``sum_{b, q} buckets[h, b, q, r] x[h, b, q, d]`` as a ``[h, R, b q] x [h, b q, d]`` GEMM."""
  return jnp.einsum("hrbq,hbqd->hrd", jnp.transpose(buckets, (0, 3, 1, 2)), x)


@jax.custom_vjp
def query_table_product(query: Array, table: Array) -> Array:
  """``q_i . w_r``: ``[b, q, h, d] x [h, R, d] -> [h, b, q, R]``."""
  return jnp.einsum("bqhd,hrd->hbqr", query, table)


def _query_table_fwd(query, table):
  return query_table_product(query, table), (query, table)


def _query_table_bwd(res, g):
  query, table = res
  dq = jnp.transpose(jnp.einsum("hbqr,hrd->hbqd", g, table), (1, 2, 0, 3))
  return dq, _table_grad(g, jnp.transpose(query, (2, 0, 1, 3)))


query_table_product.defvjp(_query_table_fwd, _query_table_bwd)


@jax.custom_vjp
def bucket_table_product(buckets: Array, table: Array) -> Array:
  """``sum_r buckets_r w_r``: ``[h, b, q, R] x [h, R, d] -> [b, q, h, d]``."""
  return jnp.transpose(jnp.einsum("hbqr,hrd->hbqd", buckets, table), (1, 2, 0, 3))


def _bucket_table_fwd(buckets, table):
  return bucket_table_product(buckets, table), (buckets, table)


def _bucket_table_bwd(res, g):
  buckets, table = res
  g = jnp.transpose(g, (2, 0, 1, 3))
  return jnp.einsum("hbqd,hrd->hbqr", g, table), _table_grad(buckets, g)


bucket_table_product.defvjp(_bucket_table_fwd, _bucket_table_bwd)


def _per_head(table: Array, num_heads: int, dtype) -> Array:
  """``[R, d] | [h, R, d] -> [h, R, d]`` in ``dtype`` (a shared table's gradient sums over the heads)."""
  return (jnp.broadcast_to(table, (num_heads,) + table.shape[-2:]) if table.ndim == 2 else table).astype(dtype)


def relative_logits(query: Array, relative: Relative, k_length: int) -> Array:
  """a^K term ``q_i . w^K_{clip(j-i)}`` as ``[b, h, q, k]`` (query already scaled)."""
  if relative.ids is not None:
    qw = _table_einsum("bqhd,rd->bhqr", "bqhd,hrd->bhqr", query, relative.key_table)
    return relative.expand(qw, k_length)
  qw = query_table_product(query, _per_head(relative.key_table, query.shape[2], query.dtype))
  return expand_heads(qw, k_length, relative.offset)


def relative_values(weights: Array, relative: Relative) -> Array:
  """a^V term ``sum_j alpha_ij w^V_{clip(j-i)}`` as ``[b, q, h, d]``."""
  if relative.ids is not None:
    buckets = relative.reduce(weights)
    return _table_einsum("bhqr,rd->bqhd", "bhqr,hrd->bqhd", buckets, relative.value_table)
  buckets = reduce_heads(weights, relative.num_relations, relative.offset)
  return bucket_table_product(buckets, _per_head(relative.value_table, weights.shape[1], weights.dtype))
