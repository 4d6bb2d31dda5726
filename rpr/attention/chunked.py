"""Linear-memory attention for every position scheme: online softmax over key blocks.

Flash-style (Dao et al. 2022, on XLA rather than a custom kernel): queries are
processed in blocks of ``block_q`` rows and, for each, keys in blocks of
``block_k``. The softmax is accumulated online,

    m_i <- max(m_i, max_j s_ij),  l_i <- l_i e^(m_old - m_i) + sum_j e^(s_ij - m_i),
    acc_i <- acc_i e^(m_old - m_i) + sum_j e^(s_ij - m_i) v_j,   z_i = acc_i / l_i,

so no ``[batch, heads, q, k]`` tensor exists; only the log-sum-exp
``lse_i = m_i + log l_i`` is saved, and the backward pass recomputes each
block's weights ``p_ij = exp(s_ij - lse_i)`` and uses
``ds_ij = p_ij (dp_ij - D_i)`` with ``D_i = g_i . z_i``. Memory is
``O((q + k) (head_dim + 2k + 1))`` plus one block.

Position schemes per block ``(I, J)`` (query rows from ``q0``, keys from ``k0``):

* Shaw (``relative``): ``e_ij += q_i . w^K_{clip(j - i - offset)}`` is
  :func:`rpr.relative.expand` of ``q_I W^K^T`` with the block offset
  ``offset + q0 - k0``; ``z_i += sum_j alpha_ij w^V_{clip(...)}`` accumulates
  :func:`rpr.relative.reduce` of the block weights and multiplies by ``W^V``
  at the end. Only the two or three key blocks that the band
  ``|j - i - offset| < k`` crosses need these maps: every other block holds a
  single bucket (``0`` or ``2k``), where the a^K term is a per-row constant
  folded into the softmax's row shift and the a^V term is the block's share
  of the softmax mass (see :func:`_make_core`). With square blocks and a
  static offset, the blocks beside the diagonal one hold only a small
  corner of the band: they run as single-bucket blocks with that corner
  corrected, so the full maps run on one block per query block (two when
  the offset puts the band across a block edge; :func:`band_plan`).
* T5 / ALiBi (``bias_fn``): the scheme's ``bias_fn(q_pos, k_pos) -> [h, q, k]``
  evaluated on the block's positions; its parameters (T5's table) get
  gradients through ``jax.closure_convert``.
* RoPE: rotate query and key beforehand; nothing per block.

Masks (:class:`rpr.attention.masks.Mask`): ``key_valid`` (padding),
``causal`` (key blocks wholly in the future are skipped), ``window`` and
optionally a dense boolean ``array`` sliced per block (which itself costs
``O(q k)`` bytes). A query row with no allowed key outputs zero and passes no
gradient, as in the dense implementation.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention import relative as rel
from rpr.attention.dense import MaskLike, as_mask, check_qkv
from rpr.attention.relative import Relative

Array = jax.Array


# ----------------------------------------------------------------------------
# Helpers.


def _table_product(x: Array, table: Array) -> Array:
  """``[h, b, q, d] x [R, d] | [h, R, d] -> [h, b, q, R]``."""
  spec = "hbqd,rd->hbqr" if table.ndim == 2 else "hbqd,hrd->hbqr"
  return jnp.einsum(spec, x, table)


def _bucket_product(buckets: Array, table: Array) -> Array:
  """``[h, b, q, R] x [R, d] | [h, R, d] -> [h, b, q, d]``."""
  spec = "hbqr,rd->hbqd" if table.ndim == 2 else "hbqr,hrd->hbqd"
  return jnp.einsum(spec, buckets, table)


def _table_grad(buckets: Array, x: Array, shared: bool) -> Array:
  """Transpose of :func:`_bucket_product` with respect to the table."""
  return jnp.einsum("hbqr,hbqd->rd" if shared else "hbqr,hbqd->hrd", buckets, x)


def _ceil_div(a, b):
  return -((-a) // b)


# Where a key block sits relative to Shaw's band, for the block's rows:
# every distance <= -k (one bucket, 0), every distance >= k (bucket 2k), or
# some in between (the exact maps are needed).
LEFT, RIGHT, BAND = "left", "right", "band"


class Corner(NamedTuple):
  """A key block on one ``side`` of the band except for a static box ``rows x cols`` that the band crosses.

  With square blocks and a static offset, the blocks beside a query
  block's diagonal block hold only a corner of the band (``(k-1) x (k-1)``
  when the offset is a multiple of the block). ``offset`` is the
  relative-distance offset inside the box.
  """
  side: str
  rows: slice
  cols: slice
  offset: int


def _side(side) -> Optional[str]:
  return side.side if isinstance(side, Corner) else side


def _edge_index(side) -> int:
  """Where an edge block's single bucket sits: 0 (left of the band) or -1 (bucket 2k, right of it)."""
  return 0 if _side(side) == LEFT else -1


def _edge_column(x: Optional[Array], side) -> Optional[Array]:
  """The one bucket of a block wholly left (bucket 0) or right (bucket 2k) of the band, per row."""
  side = _side(side)
  if x is None or side not in (LEFT, RIGHT):
    return None
  return x[..., _edge_index(side)]


def band_plan(block: int, max_distance: int, offset: int) -> list:
  """Which diagonals of ``block`` x ``block`` tiles Shaw's band crosses, for a static offset.

  Returns ``[(delta, side)]``: key block ``J = I + delta`` crosses query
  block ``I``'s band, and ``side`` is :data:`BAND` (the exact maps on the
  whole block) or a :class:`Corner` (when every cell outside the band's
  bounding box lies on one side and the box covers at most half the
  block). Key blocks left of the first delta hold only bucket 0; right of
  the last, only bucket 2k.
  """
  k = max_distance
  i = np.arange(block)[:, None]
  j = np.arange(block)[None, :]
  reach = (k + abs(offset)) // block + 2
  plan = []
  for delta in range(-reach, reach + 1):
    d = j - i - (offset - delta * block)  # the relative distance of each cell of block (I, I + delta)
    band = np.abs(d) < k
    if not band.any():
      continue
    rows, cols = np.nonzero(band.any(1))[0], np.nonzero(band.any(0))[0]
    box = np.zeros_like(band)
    box[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = True
    outside = d[~box]
    side = BAND
    if outside.size and 2 * box.sum() <= band.size and (np.all(outside <= -k) or np.all(outside >= k)):
      side = Corner(LEFT if outside[0] <= -k else RIGHT, slice(int(rows[0]), int(rows[-1]) + 1),
                    slice(int(cols[0]), int(cols[-1]) + 1), int(offset - delta * block + rows[0] - cols[0]))
    plan.append((delta, side))
  deltas = [delta for delta, _ in plan]
  assert deltas == list(range(deltas[0], deltas[-1] + 1)), deltas
  return plan


# ----------------------------------------------------------------------------
# The blocked forward and backward passes.


def _make_core(*, block_q: int, block_k: int, k_len: int, causal: bool, window: Optional[int], shaw: bool,
               max_distance: int, static_offset: Optional[int], bias_fn: Optional[Callable], dropout_rate: float):
  """The attention core as a ``jax.custom_vjp`` for one static configuration.

  Arguments of the returned function (query already scaled by 1/sqrt(d) and
  in query blocks ``[nq, h, b, block_q, dim]``, keys and values ``[h, b,
  length, dim]``; lengths padded to multiples of the blocks; the output is in
  query blocks like the query): ``q, k, v, key_table, value_table, bias_consts, key_valid [b, Lk] | None,
  mask [h|1, b|1, Lq|1, Lk|1] | None, rel_offset, q_offset, rng``. The tables
  and bias constants are differentiable; masks, offsets and the rng are not.

  Key blocks start at multiples of ``block_k``. With Shaw terms each query
  block visits them in three loops that carry one online softmax: blocks
  wholly left of its band, whose only bucket is 0, blocks crossing the band
  (the exact maps of :mod:`rpr.relative`), and blocks wholly right (bucket
  2k). On an edge block the a^K term is a per-row constant ``c_i``, folded
  into the row shift of the exponent (``exp(s_ij - (m_i - c_i))``); its a^V
  bucket sum is its share of the softmax mass, accumulated per side; and in
  the backward pass its a^V term folds into ``D_i`` and its a^K bucket
  gradient is the row sum of ``ds``. So edge blocks cost what plain attention
  costs, and Shaw's extra elementwise work is confined to the two or three
  blocks per query block that the band crosses. With square blocks and a
  static offset (``static_offset``, the training case) those blocks are
  static diagonals (:func:`band_plan`), and the ones beside the diagonal
  block are edge blocks with a small :class:`Corner` corrected.
  """
  bq, bk = block_q, block_k
  n_buckets = 2 * max_distance + 1
  dropout = dropout_rate > 0
  keep_scale = 1.0 / (1.0 - dropout_rate) if dropout else 1.0
  plan = None
  if shaw and static_offset is not None and bq == bk and max_distance > 0:
    plan = band_plan(bq, max_distance, static_offset)

  def expand_corner(x, corner, column):
    """The corner box's exact a^K terms (or a^V gradients) minus the block's edge ``column``."""
    width = corner.cols.stop - corner.cols.start
    return rel.bucket_expand(x[..., corner.rows, :], width, max_distance, corner.offset) - column[..., corner.rows, None]

  def reduce_corner(x, corner):
    """The corner box's bucket sums minus its cells' share of the edge bucket: ``[..., rows, 2k+1]``."""
    xc = x[..., corner.rows, corner.cols]
    return rel.bucket_reduce(xc, max_distance, corner.offset).at[..., _edge_index(corner)].add(-xc.sum(-1))

  def tiles(q_index, rel_offset, q_offset):
    """``[(side, first, last)]``: key blocks ``first..last`` lie on ``side`` of this query block's band."""
    q0 = q_index * bq
    nk = _ceil_div(k_len, bk)
    last = nk - 1
    if causal:  # no key block wholly after the block's last query
      last = jnp.clip((q_offset + q0 + bq - 1) // bk, 0, nk - 1)
    if not shaw:
      return [(None, 0, last)]
    if plan is not None:  # static diagonals J = I + delta, each visited once if in range
      first_delta, last_delta = plan[0][0], plan[-1][0]
      return ([(LEFT, 0, jnp.minimum(q_index + first_delta - 1, last))]
              + [(side, jnp.maximum(q_index + delta, 0), jnp.minimum(q_index + delta, last)) for delta, side in plan]
              + [(RIGHT, jnp.maximum(q_index + last_delta + 1, 0), last)])
    # Keys a..z hold the band |j - i - offset| < k of rows q0..q0+bq-1;
    # blocks before a's block see only bucket 0, blocks after z's only 2k.
    a = q0 + rel_offset - (max_distance - 1)
    z = q0 + bq - 1 + rel_offset + (max_distance - 1)
    band_first = jnp.clip(a // bk, 0, nk)
    band_last = jnp.clip(z // bk, -1, nk - 1)
    return [(LEFT, 0, jnp.minimum(band_first - 1, last)),
            (BAND, band_first, jnp.minimum(band_last, last)),
            (RIGHT, jnp.maximum(band_last + 1, band_first), last)]

  def scores(qi, k, xk, q0, start, side, key_valid, mask, rel_offset, q_offset, bias):
    """Masked ``s_ij`` of the key block at ``start``: ``[h, b, bq, bk]`` (edge blocks: without their constant)."""
    kj = jax.lax.dynamic_slice_in_dim(k, start, bk, axis=2)
    s = jnp.einsum("hbqd,hbkd->hbqk", qi, kj)
    if xk is not None and side == BAND:
      s = s + rel.bucket_expand(xk, bk, max_distance, rel_offset + q0 - start).astype(s.dtype)
    if xk is not None and isinstance(side, Corner):
      s = s.at[..., side.rows, side.cols].add(expand_corner(xk, side, _edge_column(xk, side)).astype(s.dtype))
    if bias is not None:
      s = s + bias[:, None].astype(s.dtype)  # [h | 1, 1, bq, bk]
    k_pos = start + jnp.arange(bk, dtype=jnp.int32)
    allowed = None
    if key_valid is not None:
      allowed = jax.lax.dynamic_slice_in_dim(key_valid, start, bk, axis=1)[None, :, None, :]
    if causal or window is not None:
      d = k_pos[None, :] - (q_offset + q0 + jnp.arange(bq, dtype=jnp.int32))[:, None]
      if causal:
        allowed = _and(allowed, (d <= 0)[None, None])
      if window is not None:
        allowed = _and(allowed, (jnp.abs(d) <= window)[None, None])
    if mask is not None:
      m = mask
      if m.shape[2] > 1:
        m = jax.lax.dynamic_slice_in_dim(m, q0, bq, axis=2)
      if m.shape[3] > 1:
        m = jax.lax.dynamic_slice_in_dim(m, start, bk, axis=3)
      allowed = _and(allowed, m)
    if allowed is not None:
      # The dense path's finite floor: a fully masked row stays finite.
      s = jnp.where(allowed, s, jnp.finfo(s.dtype).min)
    if k_len % bk:
      # Block padding after the last key must not count even then.
      s = jnp.where(k_pos < k_len, s, -jnp.inf)
    return s

  def block_bias(consts, q0, start, q_offset):
    return bias_fn(q_offset + q0 + jnp.arange(bq, dtype=jnp.int32), start + jnp.arange(bk, dtype=jnp.int32), *consts)

  def keep_mask(rng, q_index, start, shape):
    key = jax.random.fold_in(jax.random.fold_in(rng, q_index), start)
    return jax.random.bernoulli(key, 1.0 - dropout_rate, shape) * keep_scale

  def forward(q, k, v, kt, vt, consts, key_valid, mask, rel_offset, q_offset, rng):
    nq, h, b = q.shape[:3]
    dtype = q.dtype

    def one_query_block(_, inputs):
      qi, q_index = inputs
      q0 = q_index * bq
      xk = None if kt is None else _table_product(qi, kt)

      def visit(carry, start, side):
        # m: running max; l: softmax mass; acc: sum_j p_ij v_j; and for a^V (after dropout): buckets, the
        # band blocks' bucket sums, and edge, the masses of the blocks left and right of the band.
        m, l, acc, buckets, edge = carry
        bias = None if bias_fn is None else block_bias(consts, q0, start, q_offset)
        s = scores(qi, k, xk, q0, start, side, key_valid, mask, rel_offset, q_offset, bias)
        c = _edge_column(xk, side)
        row_max = s.max(-1) if c is None else s.max(-1) + c
        m_new = jnp.maximum(m, row_max)
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - (m_new if c is None else m_new - c)[..., None])
        mass = p.sum(-1)
        l = l * alpha + mass
        if dropout:
          p = p * keep_mask(rng, q_index, start, p.shape)
        vj = jax.lax.dynamic_slice_in_dim(v, start, bk, axis=2)
        acc = acc * alpha[..., None] + jnp.einsum("hbqk,hbkd->hbqd", p, vj)
        if buckets is not None:
          buckets = buckets * alpha[..., None]
          if side == BAND:
            buckets = buckets + rel.bucket_reduce(p, max_distance, rel_offset + q0 - start)
          edge = edge * alpha
          if side != BAND:
            edge = edge.at[_edge_index(side)].add(p.sum(-1) if dropout else mass)  # the kept mass
          if isinstance(side, Corner):  # the corner's cells move from the edge bucket to their own
            buckets = buckets.at[..., side.rows, :].add(reduce_corner(p, side))
        return m_new, l, acc, buckets, edge

      a_v = shaw and vt is not None
      carry = (jnp.full((h, b, bq), -jnp.inf, dtype), jnp.zeros((h, b, bq), dtype),
               jnp.zeros((h, b, bq, v.shape[-1]), dtype),
               jnp.zeros((h, b, bq, n_buckets), dtype) if a_v else None,
               jnp.zeros((2, h, b, bq), dtype) if a_v else None)
      # One online softmax over the key blocks left of the band, across it, and right of it.
      for side, first, last in tiles(q_index, rel_offset, q_offset):
        carry = jax.lax.fori_loop(first, last + 1, lambda t, c, side=side: visit(c, t * bk, side), carry)
      m, l, acc, buckets, edge = carry
      # A row without any allowed key (its max is the mask's floor, or -inf if it saw no key block) outputs
      # zero; its lse of +inf makes every p_ij of the backward pass zero.
      empty = m <= jnp.finfo(dtype).min / 2
      l = jnp.where(empty, 1, l)
      extra = {}
      if a_v:  # reduce(P) (after dropout): the band blocks' buckets plus the edge blocks' masses
        buckets = buckets.at[..., 0].add(edge[0]).at[..., -1].add(edge[1])
        buckets = jnp.where(empty[..., None], 0, buckets)
        extra["buckets"] = buckets / l[..., None]
        acc = acc + _bucket_product(buckets, vt)  # z_i += sum_r reduce(alpha)_ir w^V_r
      out = jnp.where(empty[..., None], 0, acc / l[..., None])
      return None, (out, jnp.where(empty, jnp.inf, m + jnp.log(l)), extra)

    _, (out, lse, extra) = jax.lax.scan(one_query_block, None, (q, jnp.arange(nq, dtype=jnp.int32)))
    return out, lse, extra  # [nq, h, b, bq, dv], [nq, h, b, bq], per-block Shaw statistics

  @jax.custom_vjp
  def core(q, k, v, kt, vt, consts, key_valid, mask, rel_offset, q_offset, rng):
    return forward(q, k, v, kt, vt, consts, key_valid, mask, rel_offset, q_offset, rng)[0]

  def core_fwd(q, k, v, kt, vt, consts, key_valid, mask, rel_offset, q_offset, rng):
    out, lse, extra = forward(q, k, v, kt, vt, consts, key_valid, mask, rel_offset, q_offset, rng)
    residuals = (q, k, v, kt, vt, consts, key_valid, mask, rel_offset, q_offset, rng, out, lse, extra)
    return out, residuals

  def core_bwd(residuals, g):
    q, k, v, kt, vt, consts, key_valid, mask, rel_offset, q_offset, rng, out, lse, extra = residuals
    g = g.astype(q.dtype)
    delta = jnp.sum(g * out, axis=-1)  # D_i = g_i . z_i = sum_j p_ij dp_ij  [nq, h, b, bq]

    def one_query_block(carry, inputs):
      dk, dv, dkt, dvt, dconsts = carry
      qi, gi, lse_i, delta_i, extra_i, q_index = inputs
      q0 = q_index * bq
      xk = None if kt is None else _table_product(qi, kt)
      gw = None if vt is None else _table_product(gi, vt)

      def visit(carry, start, side):
        dq, dbuckets, dk, dv, dconsts = carry
        bias = None
        if bias_fn is not None:
          bias, bias_vjp = jax.vjp(lambda *c: block_bias(c, q0, start, q_offset), *consts)
        s = scores(qi, k, xk, q0, start, side, key_valid, mask, rel_offset, q_offset, bias)
        c, e = _edge_column(xk, side), _edge_column(gw, side)
        p = jnp.exp(s - (lse_i if c is None else lse_i - c)[..., None])
        vj = jax.lax.dynamic_slice_in_dim(v, start, bk, axis=2)
        dp = jnp.einsum("hbqd,hbkd->hbqk", gi, vj)
        offset = rel_offset + q0 - start
        if gw is not None and side == BAND:
          dp = dp + rel.bucket_expand(gw, bk, max_distance, offset).astype(dp.dtype)
        if gw is not None and isinstance(side, Corner):
          dp = dp.at[..., side.rows, side.cols].add(expand_corner(gw, side, e).astype(dp.dtype))
        p_drop = p
        if dropout:
          keep = keep_mask(rng, q_index, start, p.shape)
          dp = (dp if e is None else dp + e[..., None]) * keep
          p_drop = p * keep
          ds = p * (dp - delta_i[..., None])
        else:  # an edge block's a^V constant folds into D_i
          ds = p * (dp - (delta_i if e is None else delta_i - e)[..., None])
        kj = jax.lax.dynamic_slice_in_dim(k, start, bk, axis=2)
        dq = dq + jnp.einsum("hbqk,hbkd->hbqd", ds, kj)
        if dbuckets is not None:  # an edge block's a^K gradient is its row sum of ds, in bucket 0 or 2k
          if side == BAND:
            dbuckets = dbuckets + rel.bucket_reduce(ds, max_distance, offset)
          else:
            dbuckets = dbuckets.at[..., _edge_index(side)].add(ds.sum(-1))
          if isinstance(side, Corner):
            dbuckets = dbuckets.at[..., side.rows, :].add(reduce_corner(ds, side))
        # dk and dv accumulate transposed, [h, b, d, k]: XLA:CPU's fast matmuls take "qd,qk->dk" but
        # not "qk,qd->kd", which contracts both operands' row axis (1.4x the time per block).
        dk = _add_at(dk, start, bk, jnp.einsum("hbqd,hbqk->hbdk", qi, ds))
        dv = _add_at(dv, start, bk, jnp.einsum("hbqd,hbqk->hbdk", gi, p_drop))
        if bias_fn is not None:
          ct = ds.sum(1)
          if bias.shape[0] == 1:
            ct = ct.sum(0, keepdims=True)
          dconsts = jax.tree.map(jnp.add, dconsts, bias_vjp(ct.astype(bias.dtype)))
        return dq, dbuckets, dk, dv, dconsts

      dbuckets = None if kt is None else jnp.zeros(xk.shape, q.dtype)
      carry = (jnp.zeros_like(qi), dbuckets, dk, dv, dconsts)
      for side, first, last in tiles(q_index, rel_offset, q_offset):
        carry = jax.lax.fori_loop(first, last + 1, lambda t, c, side=side: visit(c, t * bk, side), carry)
      dq, dbuckets, dk, dv, dconsts = carry
      if kt is not None:
        dq = dq + _bucket_product(dbuckets, kt)
        dkt = dkt + _table_grad(dbuckets, qi, kt.ndim == 2)
      if vt is not None:
        dvt = dvt + _table_grad(extra_i["buckets"], gi, vt.ndim == 2)
      return (dk, dv, dkt, dvt, dconsts), dq

    zeros = lambda x: None if x is None else jnp.zeros_like(x)
    transposed_zeros = lambda x: jnp.zeros(x.shape[:2] + x.shape[:1:-1], x.dtype)  # [h, b, d, length]
    init = (transposed_zeros(k), transposed_zeros(v), zeros(kt), zeros(vt), jax.tree.map(jnp.zeros_like, consts))
    xs = (q, g, lse, delta, extra, jnp.arange(q.shape[0], dtype=jnp.int32))
    (dk, dv, dkt, dvt, dconsts), dq = jax.lax.scan(one_query_block, init, xs)
    dk, dv = jnp.swapaxes(dk, 2, 3), jnp.swapaxes(dv, 2, 3)
    return dq, dk, dv, dkt, dvt, dconsts, None, None, None, None, None

  core.defvjp(core_fwd, core_bwd)
  return core


def _add_at(x: Array, start, size: int, update: Array) -> Array:
  """``x[..., start:start + size] += update`` along the last axis."""
  axis = x.ndim - 1
  current = jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)
  return jax.lax.dynamic_update_slice_in_dim(x, current + update, start, axis=axis)


def _and(a: Optional[Array], b: Array) -> Array:
  return b if a is None else a & b


# ----------------------------------------------------------------------------
# Public entry point.


def chunked_attention(query: Array, key: Array, value: Array, *, relative: Optional[Relative] = None,
                      bias_fn: Optional[Callable[[Array, Array], Array]] = None, mask: MaskLike = None,
                      q_offset=0, dropout_rate: float = 0.0, dropout_rng: Optional[Array] = None,
                      block_q: int = 128, block_k: int = 128) -> Array:
  """Scaled dot-product attention in linear memory, with any position scheme.

  Computes what :func:`rpr.attention.dot_product_attention` computes,
  ``e_ij = q_i (k_j + a^K_ij)^T / sqrt(d) + bias_ij``,
  ``z_i = sum_j alpha_ij (v_j + a^V_ij)``, and has the same gradients, but in
  blocks of ``block_q`` queries by ``block_k`` keys: memory grows linearly in
  the lengths.

  Args:
    query: ``[batch, q_length, heads, head_dim]``.
    key, value: ``[batch, k_length, heads, head_dim]``.
    relative: Shaw terms with clipped distances (``ids`` are not supported
      here); its ``offset`` is the position of query 0.
    bias_fn: ``(q_positions [q], k_positions [k]) -> [heads | 1, q, k]``
      additive logits bias (T5, ALiBi: :attr:`rpr.positions.Terms.bias_fn`),
      evaluated per block at query positions ``q_offset + i``.
    mask: a :class:`~rpr.attention.masks.Mask` (its ``key_valid``,
      ``causal`` and ``window`` cost nothing per query-key pair; an
      ``array`` is sliced per block and costs its own O(q k) bytes), or a
      boolean array (taken as ``Mask(array=...)``).
    q_offset: position of query 0 for the mask and ``bias_fn``.
    dropout_rate, dropout_rng: dropout on the attention weights; each block's
      keep-mask is drawn from ``fold_in(dropout_rng, block)`` and redrawn in
      the backward pass (different draws from the dense path's).
    block_q, block_k: block sizes (clipped to the lengths).

  Returns:
    ``[batch, q_length, heads, head_dim]`` in ``value``'s dtype.
  """
  check_qkv(query, key, value)
  b, q_len, h, d = query.shape
  k_len = key.shape[1]
  mask_parts = as_mask(mask)
  mask_parts.check(b, h, q_len, k_len)
  key_valid, causal, mask = mask_parts.key_valid, mask_parts.causal, mask_parts.array
  if key_valid is not None:
    key_valid = jnp.broadcast_to(key_valid, (b, k_len))
  for name, size in (("block_q", block_q), ("block_k", block_k)):
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
      raise ValueError(f"{name} must be an int >= 1, got {size!r}")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
  if dropout_rate > 0 and dropout_rng is None:
    raise ValueError("dropout_rate > 0 needs a dropout_rng")
  kt = vt = None
  max_distance = 0
  static_offset = None
  rel_offset = jnp.zeros((), jnp.int32)
  if relative is not None:
    if relative.ids is not None:
      raise ValueError("chunked_attention supports clipped relative distances only; explicit relation ids "
                       "(Relative.ids) need implementation='dense'")
    relative.check(h, d)
    max_distance = rel.check_max_distance(relative.max_distance)
    kt, vt = relative.key_table, relative.value_table
    rel_offset = jnp.asarray(relative.offset, jnp.int32)
    if isinstance(relative.offset, (int, np.integer)) and not isinstance(relative.offset, bool):
      static_offset = int(relative.offset)

  dtype = jnp.promote_types(query.dtype, jnp.float32)
  bq = min(block_q, q_len)
  lq = _ceil_div(q_len, bq) * bq
  bk = min(block_k, k_len)
  lk = _ceil_div(k_len, bk) * bk

  # Heads lead ([h, b, length, d]): per-head Shaw tables [h, 2k+1, d] then
  # multiply as a batched matmul over the head axis, with no transposes. The
  # query goes straight into its blocks [nq, h, b, bq, d], in the same copy.
  def pad(x, length):  # [b, n, h, d] -> [b, length, h, d], zero padded, in the compute dtype
    return jnp.pad(x.astype(dtype), [(0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)])

  q = pad(query / jnp.sqrt(jnp.asarray(d, query.dtype)), lq).reshape(b, lq // bq, bq, h, d).transpose(1, 3, 0, 2, 4)
  k, v = (jnp.transpose(pad(x, lk), (2, 0, 1, 3)) for x in (key, value))
  kt = None if kt is None else kt.astype(dtype)
  vt = None if vt is None else vt.astype(dtype)
  if key_valid is not None:
    key_valid = jnp.pad(key_valid.astype(bool), [(0, 0), (0, lk - k_len)])
  if mask is not None:
    mask = jnp.swapaxes(mask.astype(bool), 0, 1)  # [h | 1, b | 1, q | 1, k | 1]
    if mask.shape[2] > 1:
      mask = jnp.pad(mask, [(0, 0), (0, 0), (0, lq - q_len), (0, 0)])
    if mask.shape[3] > 1:
      mask = jnp.pad(mask, [(0, 0), (0, 0), (0, 0), (0, lk - k_len)])
  consts = ()
  if bias_fn is not None:
    # Hoist the traced values bias_fn closes over (T5's table) into explicit,
    # differentiable arguments of the custom VJP.
    bias_fn, consts = jax.closure_convert(bias_fn, jnp.zeros((bq,), jnp.int32), jnp.zeros((bk,), jnp.int32))
    consts = tuple(consts)
  rng = dropout_rng if dropout_rate > 0 else jax.random.PRNGKey(0)
  core = _make_core(block_q=bq, block_k=bk, k_len=k_len, causal=causal, window=mask_parts.window,
                    shaw=relative is not None,
                    max_distance=max_distance, static_offset=static_offset, bias_fn=bias_fn,
                    dropout_rate=float(dropout_rate))
  out = core(q, k, v, kt, vt, consts, key_valid, mask, rel_offset, jnp.asarray(q_offset, jnp.int32), rng)
  out = jnp.transpose(out, (2, 0, 3, 1, 4)).reshape(b, lq, h, value.shape[-1])  # [nq, h, b, bq, d] -> [b, lq, h, d]
  return out[:, :q_len].astype(value.dtype)
