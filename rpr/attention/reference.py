"""Straightforward Shaw relative attention: the slow baseline that tests and benchmarks compare against.

Relation-aware self-attention (Shaw, Uszkoreit, Vaswani 2018, eqs. 3-5), for
heads of size d:

    e_ij   = q_i (k_j + a^K_ij)^T / sqrt(d)
    alpha  = softmax_j(e_ij)
    z_i    = sum_j alpha_ij (v_j + a^V_ij)
    a^K_ij = w^K_{clip(j - i, k)},  a^V_ij = w^V_{clip(j - i, k)}

where the tables w^K, w^V hold the 2k+1 vectors w_{-k} .. w_k, so their rows
give the clipping distance k.

Like tensor2tensor's ``dot_product_attention_relative`` it gathers the tables
into explicit per-pair tensors, here ``[batch, heads, q_length, k_length,
head_dim]``, so memory is O(b h q k d). That is the point: the code is short
enough to check by eye against the equations and shares nothing with
:mod:`rpr.attention.relative` (no expand/reduce, no custom gradients), so agreeing with
it means something. It follows the conventions of
:func:`rpr.attention.dot_product_attention` with :class:`rpr.attention.Relative`
and is dtype-generic (float64 when x64 is enabled).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

Array = jax.Array


def relation_ids(q_length: int, k_length: int, rows: int, offset=0) -> Array:
  """``[q_length, k_length]`` row of tables of ``rows = 2k+1`` for each pair: ``clip(j - (i + offset), -k, k) + k``.

  Query ``i`` sits at position ``i + offset`` and key ``j`` at ``j``.
  """
  k = (rows - 1) // 2
  i = jnp.arange(q_length)[:, None] + offset
  j = jnp.arange(k_length)[None, :]
  return jnp.clip(j - i, -k, k) + k


def gather_table(table: Array, ids: Array, batch: int, heads: int) -> Array:
  """Materialises ``a_ij`` as ``[batch, heads, q, k, d]``.

  Args:
    table: ``[R, d]`` (shared across heads) or ``[heads, R, d]`` (per head).
    ids: ``[q, k]`` or ``[batch, q, k]`` rows of ``table``.
  """
  if table.ndim == 2:
    a = table[ids]  # [q, k, d] or [b, q, k, d]
    a = a[None, None] if ids.ndim == 2 else a[:, None]
  else:
    a = table[:, ids]  # [h, q, k, d] or [h, b, q, k, d]
    a = a[None] if ids.ndim == 2 else jnp.moveaxis(a, 0, 1)
  q, k = ids.shape[-2:]
  # Broadcast explicitly: the baseline deliberately holds every a_ij.
  return jnp.broadcast_to(a, (batch, heads, q, k, table.shape[-1]))


def shaw_attention_reference(query: Array, key: Array, value: Array, key_table: Optional[Array],
                             value_table: Optional[Array], offset=0,
                             mask: Optional[Array] = None, ids: Optional[Array] = None,
                             return_weights: bool = False):
  """Shaw relative attention with the per-pair tables materialised.

  Args:
    query: ``[batch, q_length, heads, head_dim]``.
    key, value: ``[batch, k_length, heads, head_dim]``.
    key_table, value_table: ``[2k+1, head_dim]`` or ``[heads, 2k+1, head_dim]``, the same rows
      (with ``ids``: ``num_relations`` rows), or None to drop a^K / a^V; the
      clipping distance is k.
    offset: query ``i`` sits at position ``i + offset`` (a decoder step at ``t`` has ``offset=t``).
    mask: boolean, broadcastable to ``[batch, heads, q_length, k_length]``, True = may attend.
    ids: explicit relation ids ``[q, k]`` or ``[batch, q, k]``; replaces the clipped distances.
    return_weights: also return the ``[batch, heads, q, k]`` attention weights.

  Returns:
    ``[batch, q_length, heads, head_dim]`` (and the weights if asked).
  """
  b, q_len, h, d = query.shape
  k_len = key.shape[1]
  rows = {t.shape[-2] for t in (key_table, value_table) if t is not None}
  if ids is None and rows:
    if len(rows) > 1 or not min(rows) % 2:
      raise ValueError(f"the tables have {sorted(rows)} rows; allowed: one odd count, 2k+1")
    ids = relation_ids(q_len, k_len, rows.pop(), offset)
  dtype = jnp.promote_types(query.dtype, jnp.float32)
  q, k, v = (x.astype(dtype) for x in (query, key, value))

  # e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)  (eq. 4)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
  if key_table is not None:
    a_k = gather_table(key_table.astype(dtype), ids, b, h)
    logits = logits + jnp.einsum("bqhd,bhqkd->bhqk", q, a_k)
  logits = logits / jnp.sqrt(jnp.asarray(d, dtype))
  weights = jax.nn.softmax(logits if mask is None else jnp.where(mask, logits, -jnp.inf), axis=-1)
  if mask is not None:  # a query with no allowed key attends to nothing: zero weights, zero output
    weights = jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0)

  # z_i = sum_j alpha_ij (v_j + a^V_ij)  (eq. 3)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
  if value_table is not None:
    a_v = gather_table(value_table.astype(dtype), ids, b, h)
    out = out + jnp.einsum("bhqk,bhqkd->bqhd", weights, a_v)
  out = out.astype(query.dtype)
  return (out, weights.astype(query.dtype)) if return_weights else out
