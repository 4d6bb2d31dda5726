"""The blocked forward and backward passes of :func:`rpr.attention.chunked.chunked_attention`.

Both passes scan the query blocks and, for each, run the key blocks its
:class:`~rpr.attention.chunked_plan.Plan` visits through one *tile* step.
The steps share the per-tile helpers: :func:`tile_scores` (the masked logits,
with Shaw's a^K term), :func:`expand_onto` (a ``[.., 2k+1]`` per-row bucket
tensor put on a tile: a^K on the logits, a^V's gradient on ``dp``) and
:func:`reduce_into` (a tile's bucket sums: a^V's weights forward, a^K's
gradient backward). On an edge tile (one bucket per row) these are per-row
constants, never a tile-sized pass: the a^K constant ``c_i`` shifts the
exponent (``exp(s_ij - (m_i - c_i))``), a^V's constant folds into
``D_i`` backward, and the bucket sums are row sums kept per side in
:class:`Buckets`. Shaw's extra elementwise work is confined to the one to
three band tiles per query block.

Forward: ``m_i``, ``l_i``, ``acc_i`` of the online softmax; the saved
statistics are ``lse_i = m_i + log l_i`` and a^V's normalised buckets.
Backward: ``p_ij = exp(s_ij - lse_i)``, ``ds_ij = p_ij (dp_ij - D_i)``,
``D_i = g_i . z_i``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from rpr.attention import masks
from rpr.attention import relative as rel
from rpr.attention.chunked_plan import BAND, Case, Corner, Plan, edge_index

Array = jax.Array


class Inputs(NamedTuple):
  """The arrays of one call; the tables and bias constants are differentiable, the rest are not.

  Lengths are padded to multiples of the blocks.
  """
  q: Array  # [nq, h, b, block_q, d], scaled by 1/sqrt(d), in query blocks
  k: Array  # [h, b, Lk, d]
  v: Array  # [h, b, Lk, dv]
  key_table: Optional[Array]  # a^K table [2k+1, d] | [h, 2k+1, d]
  value_table: Optional[Array]  # a^V table [2k+1, dv] | [h, 2k+1, dv]
  bias_consts: tuple  # the traced values bias_fn closes over (T5's table)
  key_valid: Optional[Array]  # [b, Lk] bool
  mask: Optional[Array]  # [h|1, b|1, Lq|1, Lk|1] bool
  rel_offset: Array  # int32: Shaw's offset
  q_offset: Array  # int32: position of query 0
  rng: Array  # dropout key


@dataclasses.dataclass(frozen=True)
class Config:
  """The static choices of one call: the plan, the true key length, ``bias_fn`` and dropout."""
  plan: Plan
  k_len: int
  bias_fn: Optional[Callable] = None  # (q_pos [bq], k_pos [bk], *bias_consts) -> [h|1, bq, bk]
  dropout_rate: float = 0.0


class Rows(NamedTuple):
  """One query block and the per-row values its tiles share."""
  index: Array  # query block number I
  start: Array  # its first row, I * block_q
  q: Array  # [h, b, bq, d]
  qk: Optional[Array]  # q_i . w^K_r, [h, b, bq, 2k+1], or None
  g: Optional[Array] = None  # backward: the output's cotangent [h, b, bq, dv]
  gv: Optional[Array] = None  # backward: g_i . w^V_r, a^V's share of dp per bucket
  lse: Optional[Array] = None  # backward: [h, b, bq]
  delta: Optional[Array] = None  # backward: D_i = g_i . z_i


class Tile(NamedTuple):
  """Key block at ``start`` of a query block: its Shaw ``case`` and distance offset ``rel_offset + q0 - start``."""
  start: Array
  case: Case
  offset: Array


class Buckets(NamedTuple):
  """Per-row bucket sums ``[h, b, bq, 2k+1]``, with the edge tiles' row sums kept apart in ``edge [2, h, b, bq]``.

  Edge tiles add to one bucket, ``0`` or ``2k``; keeping those two columns
  apart makes the update a row vector instead of a pass over all buckets.
  """
  inner: Array
  edge: Array

  @classmethod
  def zeros(cls, shape: tuple, dtype) -> "Buckets":
    return cls(jnp.zeros(shape, dtype), jnp.zeros((2,) + shape[:-1], dtype))

  def total(self) -> Array:
    return self.inner.at[..., 0].add(self.edge[0]).at[..., -1].add(self.edge[1])


# ----------------------------------------------------------------------------
# Per-tile helpers, shared by both passes.


def expand_onto(t: Array, x: Optional[Array], tile: Tile):
  """Adds bucket values ``x [h, b, bq, 2k+1]`` to ``t [h, b, bq, bk]`` at each cell's bucket; returns ``(t, column)``.

  ``column [h, b, bq]`` is an edge tile's one bucket per row, left for the
  caller to fold in as a constant (None on a band tile or without ``x``).
  A corner adds its box's exact values minus that constant.
  """
  if x is None:
    return t, None
  if tile.case == BAND:
    return t + rel.bucket_expand(x, t.shape[-1], tile.offset).astype(t.dtype), None
  column = x[..., edge_index(tile.case)]
  corner = tile.case
  if isinstance(corner, Corner):
    width = corner.cols.stop - corner.cols.start
    box = rel.bucket_expand(x[..., corner.rows, :], width, corner.offset) - column[..., corner.rows, None]
    t = t.at[..., corner.rows, corner.cols].add(box.astype(t.dtype))
  return t, column


def reduce_into(acc: Buckets, x: Array, tile: Tile) -> Buckets:
  """``acc`` plus the tile's bucket sums of ``x [h, b, bq, bk]`` (the transpose of :func:`expand_onto`)."""
  rows = acc.inner.shape[-1]
  if tile.case == BAND:
    return acc._replace(inner=acc.inner + rel.bucket_reduce(x, rows, tile.offset))
  edge = acc.edge.at[edge_index(tile.case)].add(x.sum(-1))
  corner, inner = tile.case, acc.inner
  if isinstance(corner, Corner):  # the box's cells move from the edge bucket to their own
    box = x[..., corner.rows, corner.cols]
    sums = rel.bucket_reduce(box, rows, corner.offset).at[..., edge_index(corner)].add(-box.sum(-1))
    inner = inner.at[..., corner.rows, :].add(sums)
  return Buckets(inner, edge)


def tile_bias(cfg: Config, q_offset: Array, rows: Rows, start: Array, *consts) -> Array:
  """``bias_fn`` on the tile's query and key positions: ``[h | 1, bq, bk]``."""
  plan = cfg.plan
  q_pos = q_offset + rows.start + jnp.arange(plan.block_q, dtype=jnp.int32)
  return cfg.bias_fn(q_pos, start + jnp.arange(plan.block_k, dtype=jnp.int32), *consts)


def tile_allowed(cfg: Config, inp: Inputs, rows: Rows, start: Array) -> Optional[Array]:
  """Which cells of the tile the mask allows (broadcastable to ``[h, b, bq, bk]``), or None for all."""
  plan, bq, bk = cfg.plan, cfg.plan.block_q, cfg.plan.block_k
  allowed = []
  if inp.key_valid is not None:
    allowed.append(jax.lax.dynamic_slice_in_dim(inp.key_valid, start, bk, axis=1)[None, :, None, :])
  if plan.causal or plan.window is not None:
    q_pos = inp.q_offset + rows.start + jnp.arange(bq, dtype=jnp.int32)
    d = (start + jnp.arange(bk, dtype=jnp.int32))[None, :] - q_pos[:, None]
    allowed += [rule[None, None] for rule in masks.position_rules(d, plan.causal, plan.window)]
  if inp.mask is not None:
    m = inp.mask
    if m.shape[2] > 1:
      m = jax.lax.dynamic_slice_in_dim(m, rows.start, bq, axis=2)
    if m.shape[3] > 1:
      m = jax.lax.dynamic_slice_in_dim(m, start, bk, axis=3)
    allowed.append(m)
  return functools.reduce(jnp.logical_and, allowed) if allowed else None


def tile_scores(cfg: Config, inp: Inputs, rows: Rows, tile: Tile, bias: Optional[Array]):
  """Masked logits ``s_ij`` of a tile ``[h, b, bq, bk]``, and an edge tile's a^K constant per row (else None)."""
  bk = cfg.plan.block_k
  kj = jax.lax.dynamic_slice_in_dim(inp.k, tile.start, bk, axis=2)
  s = jnp.einsum("hbqd,hbkd->hbqk", rows.q, kj)
  s, column = expand_onto(s, rows.qk, tile)
  if bias is not None:
    s = s + bias[:, None].astype(s.dtype)  # [h | 1, 1, bq, bk]
  allowed = tile_allowed(cfg, inp, rows, tile.start)
  if allowed is not None:
    # The dense path's finite floor: a fully masked row stays finite.
    s = jnp.where(allowed, s, jnp.finfo(s.dtype).min)
  if cfg.k_len % bk:
    # Block padding after the last key must not count even then.
    s = jnp.where(tile.start + jnp.arange(bk, dtype=jnp.int32) < cfg.k_len, s, -jnp.inf)
  return s, column


def keep_mask(cfg: Config, inp: Inputs, rows: Rows, start: Array, shape: tuple) -> Array:
  """The tile's dropout keep-mask, scaled by ``1 / (1 - rate)``; the same draw in both passes."""
  key = jax.random.fold_in(jax.random.fold_in(inp.rng, rows.index), start)
  return jax.random.bernoulli(key, 1.0 - cfg.dropout_rate, shape) / (1.0 - cfg.dropout_rate)


def visit_tiles(cfg: Config, inp: Inputs, rows: Rows, step: Callable, carry):
  """``carry = step(carry, tile)`` over the key blocks the plan gives this query block, in order."""
  bk = cfg.plan.block_k
  for visit in cfg.plan.visits(rows.index, inp.q_offset, inp.rel_offset):
    def body(t, carry, case=visit.case):
      start = t * bk
      return step(carry, Tile(start, case, inp.rel_offset + rows.start - start))
    carry = jax.lax.fori_loop(visit.first, visit.last + 1, body, carry)
  return carry


def _table_product(x: Array, table: Array) -> Array:
  """``[h, b, q, d] x [R, d] | [h, R, d] -> [h, b, q, R]``."""
  return jnp.einsum("hbqd,rd->hbqr" if table.ndim == 2 else "hbqd,hrd->hbqr", x, table)


def _bucket_product(buckets: Array, table: Array) -> Array:
  """``[h, b, q, R] x [R, d] | [h, R, d] -> [h, b, q, d]``."""
  return jnp.einsum("hbqr,rd->hbqd" if table.ndim == 2 else "hbqr,hrd->hbqd", buckets, table)


def _table_grad(buckets: Array, x: Array, table: Array) -> Array:
  """Transpose of :func:`_bucket_product` with respect to the table."""
  return jnp.einsum("hbqr,hbqd->rd" if table.ndim == 2 else "hbqr,hbqd->hrd", buckets, x)


# ----------------------------------------------------------------------------
# Forward.


class Softmax(NamedTuple):
  """The online softmax of one query block, after the tiles seen so far (a^V's buckets after dropout)."""
  m: Array  # running max [h, b, bq]
  l: Array  # mass sum_j exp(s_ij - m_i)
  acc: Array  # sum_j p_ij v_j [h, b, bq, dv]
  buckets: Optional[Buckets]  # a^V: the mass per bucket


def forward_tile(cfg: Config, inp: Inputs, rows: Rows, carry: Softmax, tile: Tile) -> Softmax:
  """The online softmax after one more tile (an edge tile's a^K constant ``c_i`` shifts its exponent)."""
  bias = None if cfg.bias_fn is None else tile_bias(cfg, inp.q_offset, rows, tile.start, *inp.bias_consts)
  s, c = tile_scores(cfg, inp, rows, tile, bias)
  row_max = s.max(-1) if c is None else s.max(-1) + c
  m = jnp.maximum(carry.m, row_max)
  alpha = jnp.exp(carry.m - m)
  p = jnp.exp(s - (m if c is None else m - c)[..., None])
  l = carry.l * alpha + p.sum(-1)
  if cfg.dropout_rate > 0:
    p = p * keep_mask(cfg, inp, rows, tile.start, p.shape)
  vj = jax.lax.dynamic_slice_in_dim(inp.v, tile.start, cfg.plan.block_k, axis=2)
  acc = carry.acc * alpha[..., None] + jnp.einsum("hbqk,hbkd->hbqd", p, vj)
  buckets = carry.buckets
  if buckets is not None:
    buckets = Buckets(buckets.inner * alpha[..., None], buckets.edge * alpha)
    buckets = reduce_into(buckets, p, tile)
  return Softmax(m, l, acc, buckets)


def forward_block(cfg: Config, inp: Inputs, qi: Array, index: Array):
  """One query block: ``(out [h, b, bq, dv], lse [h, b, bq], a^V's normalised buckets or None)``."""
  h, b, bq, _ = qi.shape
  dtype = qi.dtype
  kt, vt = inp.key_table, inp.value_table
  rows = Rows(index, index * bq, qi, None if kt is None else _table_product(qi, kt))
  buckets = None if vt is None else Buckets.zeros((h, b, bq, vt.shape[-2]), dtype)
  init = Softmax(jnp.full((h, b, bq), -jnp.inf, dtype), jnp.zeros((h, b, bq), dtype),
                 jnp.zeros((h, b, bq, inp.v.shape[-1]), dtype), buckets)
  m, l, acc, buckets = visit_tiles(cfg, inp, rows, functools.partial(forward_tile, cfg, inp, rows), init)
  # A row without any allowed key (its max is the mask's floor, or -inf if it saw no key block) outputs
  # zero; its lse of +inf makes every p_ij of the backward pass zero.
  empty = m <= jnp.finfo(dtype).min / 2
  l = jnp.where(empty, 1, l)
  value_buckets = None
  if buckets is not None:  # z_i += sum_r reduce(alpha)_ir w^V_r
    total = jnp.where(empty[..., None], 0, buckets.total())
    value_buckets = total / l[..., None]
    acc = acc + _bucket_product(total, vt)
  out = jnp.where(empty[..., None], 0, acc / l[..., None])
  return out, jnp.where(empty, jnp.inf, m + jnp.log(l)), value_buckets


def forward(cfg: Config, inp: Inputs):
  """``out [nq, h, b, bq, dv]``, ``lse [nq, h, b, bq]`` and a^V's buckets per query block (or None)."""
  step = lambda _, xs: (None, forward_block(cfg, inp, *xs))
  return jax.lax.scan(step, None, (inp.q, jnp.arange(inp.q.shape[0], dtype=jnp.int32)))[1]


# ----------------------------------------------------------------------------
# Backward.


class Grads(NamedTuple):
  """Gradients accumulated over one query block's tiles; ``dk``, ``dv`` transposed, ``[h, b, d, Lk]``."""
  dq: Array  # [h, b, bq, d]
  dbuckets: Optional[Buckets]  # a^K: the gradient of q_i . w^K_r
  dk: Array
  dv: Array
  dconsts: tuple


def backward_tile(cfg: Config, inp: Inputs, rows: Rows, carry: Grads, tile: Tile) -> Grads:
  """The gradients after one more tile: ``p`` recomputed from ``lse``, ``ds = p (dp - D)``."""
  bias = None
  if cfg.bias_fn is not None:
    bias, bias_vjp = jax.vjp(functools.partial(tile_bias, cfg, inp.q_offset, rows, tile.start), *inp.bias_consts)
  s, c = tile_scores(cfg, inp, rows, tile, bias)
  p = jnp.exp(s - (rows.lse if c is None else rows.lse - c)[..., None])
  vj = jax.lax.dynamic_slice_in_dim(inp.v, tile.start, cfg.plan.block_k, axis=2)
  dp, e = expand_onto(jnp.einsum("hbqd,hbkd->hbqk", rows.g, vj), rows.gv, tile)
  p_drop = p
  if cfg.dropout_rate > 0:
    keep = keep_mask(cfg, inp, rows, tile.start, p.shape)
    dp = (dp if e is None else dp + e[..., None]) * keep
    p_drop = p * keep
    ds = p * (dp - rows.delta[..., None])
  else:  # an edge tile's a^V constant folds into D_i
    ds = p * (dp - (rows.delta if e is None else rows.delta - e)[..., None])
  kj = jax.lax.dynamic_slice_in_dim(inp.k, tile.start, cfg.plan.block_k, axis=2)
  dq = carry.dq + jnp.einsum("hbqk,hbkd->hbqd", ds, kj)
  dbuckets = carry.dbuckets
  if dbuckets is not None:
    dbuckets = reduce_into(dbuckets, ds, tile)
  # dk and dv accumulate transposed, [h, b, d, k]: each block's update is then the product "qd,qk->dk",
  # which runs as a faster matmul than "qk,qd->kd" (both operands contracted on their row axis).
  dk = _add_at(carry.dk, tile.start, jnp.einsum("hbqd,hbqk->hbdk", rows.q, ds))
  dv = _add_at(carry.dv, tile.start, jnp.einsum("hbqd,hbqk->hbdk", rows.g, p_drop))
  dconsts = carry.dconsts
  if bias is not None:
    ct = ds.sum(1)
    if bias.shape[0] == 1:
      ct = ct.sum(0, keepdims=True)
    dconsts = jax.tree.map(jnp.add, dconsts, bias_vjp(ct.astype(bias.dtype)))
  return Grads(dq, dbuckets, dk, dv, dconsts)


def backward_block(cfg: Config, inp: Inputs, carry: tuple, xs: tuple):
  """One query block: its ``dq``, and ``carry = (dk, dv, dkt, dvt, dconsts)`` summed over query blocks."""
  dk, dv, dkt, dvt, dconsts = carry
  qi, gi, lse, delta, value_buckets, index = xs
  kt, vt = inp.key_table, inp.value_table
  rows = Rows(index, index * cfg.plan.block_q, qi, None if kt is None else _table_product(qi, kt),
              gi, None if vt is None else _table_product(gi, vt), lse, delta)
  dbuckets = None if kt is None else Buckets.zeros(rows.qk.shape, qi.dtype)
  init = Grads(jnp.zeros_like(qi), dbuckets, dk, dv, dconsts)
  dq, dbuckets, dk, dv, dconsts = visit_tiles(cfg, inp, rows, functools.partial(backward_tile, cfg, inp, rows), init)
  if kt is not None:
    dbuckets = dbuckets.total()
    dq = dq + _bucket_product(dbuckets, kt)
    dkt = dkt + _table_grad(dbuckets, qi, kt)
  if vt is not None:
    dvt = dvt + _table_grad(value_buckets, gi, vt)
  return (dk, dv, dkt, dvt, dconsts), dq


def _add_at(x: Array, start, update: Array) -> Array:
  """``x[..., start:start + n] += update`` along the last axis (``n = update.shape[-1]``)."""
  axis = x.ndim - 1
  current = jax.lax.dynamic_slice_in_dim(x, start, update.shape[-1], axis=axis)
  return jax.lax.dynamic_update_slice_in_dim(x, current + update, start, axis=axis)


# ----------------------------------------------------------------------------
# The custom VJP.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def attention_core(cfg: Config, inp: Inputs) -> Array:
  """Attention of ``inp`` in query blocks, ``[nq, h, b, bq, dv]``; the backward pass recomputes each tile."""
  return forward(cfg, inp)[0]


def _core_fwd(cfg: Config, inp: Inputs):
  out, lse, value_buckets = forward(cfg, inp)
  return out, (inp, out, lse, value_buckets)


def _core_bwd(cfg: Config, residuals, g):
  inp, out, lse, value_buckets = residuals
  g = g.astype(inp.q.dtype)
  delta = jnp.sum(g * out, axis=-1)  # D_i = g_i . z_i = sum_j p_ij dp_ij  [nq, h, b, bq]
  zeros = lambda x: None if x is None else jnp.zeros_like(x)
  transposed_zeros = lambda x: jnp.zeros(x.shape[:2] + x.shape[:1:-1], x.dtype)  # [h, b, d, length]
  init = (transposed_zeros(inp.k), transposed_zeros(inp.v), zeros(inp.key_table), zeros(inp.value_table),
          jax.tree.map(jnp.zeros_like, inp.bias_consts))
  xs = (inp.q, g, lse, delta, value_buckets, jnp.arange(inp.q.shape[0], dtype=jnp.int32))
  (dk, dv, dkt, dvt, dconsts), dq = jax.lax.scan(functools.partial(backward_block, cfg, inp), init, xs)
  grads = Inputs(dq, jnp.swapaxes(dk, 2, 3), jnp.swapaxes(dv, 2, 3), dkt, dvt, dconsts,
                 None, None, None, None, None)  # masks, offsets and the rng take no gradient
  return (grads,)


attention_core.defvjp(_core_fwd, _core_bwd)
