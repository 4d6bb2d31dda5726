"""Attention as pure functions, layout ``[batch, length, heads, head_dim]``.

Every function is jit-able, differentiable and dtype-generic (float32,
bfloat16, float64); the softmax runs in at least float32. Masks are boolean,
``True`` where a query may attend to a key, and broadcast to
``[batch, heads, q_length, k_length]``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rpr import relative as rel

Array = jax.Array


# ----------------------------------------------------------------------------
# Checks: bad arguments fail naming the value and what is allowed.


def check_qkv(query: Array, key: Array, value: Array) -> None:
  for name, x in (("query", query), ("key", key), ("value", value)):
    if x.ndim != 4:
      raise ValueError(f"{name} must be [batch, length, heads, head_dim], got shape {x.shape}")
  if query.shape[-1] != key.shape[-1]:
    raise ValueError(f"query and key head_dim differ: query {query.shape} vs key {key.shape}")
  if key.shape[:3] != value.shape[:3]:
    raise ValueError(f"key and value must agree on [batch, length, heads]: key {key.shape} vs value {value.shape}")
  if query.shape[0] != key.shape[0] or query.shape[2] != key.shape[2]:
    raise ValueError(f"query and key must agree on batch and heads: query {query.shape} vs key {key.shape}")


def check_mask(mask: Optional[Array], shape: tuple, name: str = "mask") -> None:
  """``mask`` must broadcast to ``shape`` = [batch, heads, q_length, k_length]."""
  if mask is None:
    return
  ok = mask.ndim == 4 and all(m in (1, s) for m, s in zip(mask.shape, shape))
  if not ok:
    raise ValueError(
        f"{name} has shape {tuple(mask.shape)}; it must broadcast to [batch, heads, q_length, k_length] = {shape}"
        " (each dim equal or 1)")


# ----------------------------------------------------------------------------
# Masks.


def causal_mask(q_length: int, k_length: int, offset=0) -> Array:
  """``[1, 1, q, k]``: query ``i`` (at position ``i + offset``) sees keys ``j <= i + offset``."""
  return (rel.relative_distance(q_length, k_length, offset) <= 0)[None, None]


def padding_mask(q_valid: Optional[Array], k_valid: Array) -> Array:
  """``[batch, 1, q, k]`` from ``[batch, q]`` / ``[batch, k]`` booleans (``q_valid`` may be None)."""
  m = k_valid[:, None, None, :]
  if q_valid is not None:
    m = m & q_valid[:, None, :, None]
  return m


def window_mask(q_length: int, k_length: int, window: int, offset=0, causal: bool = False) -> Array:
  """``[1, 1, q, k]``: keys within ``window`` positions of the query (restricted attention)."""
  if window < 0:
    raise ValueError(f"window must be >= 0, got {window}")
  d = rel.relative_distance(q_length, k_length, offset)
  m = jnp.abs(d) <= window
  if causal:
    m = m & (d <= 0)
  return m[None, None]


def combine_masks(*masks: Optional[Array]) -> Optional[Array]:
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = out & m
  return out


# ----------------------------------------------------------------------------
# Shaw relative terms.


@dataclasses.dataclass(frozen=True)
class Relative:
  """Shaw et al. (2018) relative terms for one attention call.

  Attributes:
    max_distance: clipping distance k; relative ids are ``clip(j - i - offset, -k, k) + k``.
    key_table: a^K table ``[2k+1, head_dim]`` (shared across heads) or
      ``[heads, 2k+1, head_dim]`` (per head), or None to switch a^K off.
    value_table: a^V table, same layouts, or None.
    offset: position of query 0 relative to key 0 (a decoder step at ``t`` has ``offset=t``).
    ids: explicit relation ids ``[q, k]`` or ``[batch, q, k]`` in ``[0, num_relations)``
      (trees, graphs); when given, ``max_distance`` and ``offset`` are ignored and
      the tables have ``num_relations`` rows.
  """

  max_distance: int = 0
  key_table: Optional[Array] = None
  value_table: Optional[Array] = None
  offset: object = 0
  ids: Optional[Array] = None

  @property
  def num_relations(self) -> int:
    for t in (self.key_table, self.value_table):
      if t is not None:
        return t.shape[-2]
    return 2 * self.max_distance + 1

  def check(self, num_heads: int, head_dim: int) -> None:
    if self.ids is None:
      k = rel.check_max_distance(self.max_distance)
      want = 2 * k + 1
    else:
      want = self.num_relations
    for name, t in (("key_table", self.key_table), ("value_table", self.value_table)):
      if t is None:
        continue
      if t.ndim not in (2, 3) or t.shape[-2] != want:
        raise ValueError(
            f"Relative.{name} has shape {tuple(t.shape)}; allowed: [{want}, {head_dim}] or "
            f"[{num_heads}, {want}, {head_dim}] ({want} = 2k+1 rows for k={self.max_distance})"
            if self.ids is None else
            f"Relative.{name} has shape {tuple(t.shape)}; allowed: [{want}, {head_dim}] or [{num_heads}, {want}, {head_dim}]")
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
    if self.ids is not None or not isinstance(self.offset, (int, np.integer)) or isinstance(self.offset, bool):
      return self
    k = self.max_distance
    reach = max(q_length - 1 + int(self.offset), k_length - 1 - int(self.offset), 0)
    if reach >= k:
      return self
    cut = lambda t: None if t is None else t[..., k - reach:k + reach + 1, :]
    return dataclasses.replace(self, max_distance=reach, key_table=cut(self.key_table),
                               value_table=cut(self.value_table))

  def expand(self, x: Array, k_length: int) -> Array:
    """``[b, h, q, R] -> [b, h, q, k]``."""
    if self.ids is not None:
      return rel.expand_ids(x, self.ids)
    return rel.expand(x, k_length, self.max_distance, self.offset)

  def reduce(self, p: Array) -> Array:
    """``[b, h, q, k] -> [b, h, q, R]``."""
    if self.ids is not None:
      return rel.reduce_ids(p, self.ids, self.num_relations)
    return rel.reduce(p, self.max_distance, self.offset)


def _table_einsum(spec_shared: str, spec_heads: str, a: Array, table: Array) -> Array:
  return jnp.einsum(spec_shared if table.ndim == 2 else spec_heads, a, table.astype(a.dtype))


def relative_logits(query: Array, relative: Relative, k_length: int) -> Array:
  """a^K term ``q_i . w^K_{clip(j-i)}`` as ``[b, h, q, k]`` (query already scaled)."""
  qw = _table_einsum("bqhd,rd->bhqr", "bqhd,hrd->bhqr", query, relative.key_table)
  return relative.expand(qw, k_length)


def relative_values(weights: Array, relative: Relative) -> Array:
  """a^V term ``sum_j alpha_ij w^V_{clip(j-i)}`` as ``[b, q, h, d]``."""
  buckets = relative.reduce(weights)
  return _table_einsum("bhqr,rd->bqhd", "bhqr,hrd->bqhd", buckets, relative.value_table)


# ----------------------------------------------------------------------------
# Softmax, dropout, combination: shared by every scoring function.

BiasFn = Callable[[Array, Array], Array]  # (q_positions [q], k_positions [k]) -> [heads|1, q, k]


def _masked_softmax(logits: Array, mask: Optional[Array], dtype) -> Array:
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  return jax.nn.softmax(logits, axis=-1).astype(dtype)


def _dropout(weights: Array, rate: float, rng: Optional[Array]) -> Array:
  if rate <= 0.0:
    return weights
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
  if rng is None:
    raise ValueError("dropout_rate > 0 needs a dropout_rng (or pass deterministic attention with rate 0)")
  keep = jax.random.bernoulli(rng, 1.0 - rate, weights.shape)
  return jnp.where(keep, weights / (1.0 - rate), 0).astype(weights.dtype)


def attend(logits: Array, value: Array, *, mask=None, relative: Optional[Relative] = None,
           dropout_rate: float = 0.0, dropout_rng=None, return_weights: bool = False):
  """Softmax over keys, dropout, weighted sum of values (+ a^V). ``logits`` is ``[b, h, q, k]``."""
  weights = _masked_softmax(logits, mask, value.dtype)
  probs = _dropout(weights, dropout_rate, dropout_rng)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
  if relative is not None and relative.value_table is not None:
    out = out + relative_values(probs, relative)
  return (out, weights) if return_weights else out


# ----------------------------------------------------------------------------
# Scoring functions.


def dot_product_attention(query: Array, key: Array, value: Array, *, mask: Optional[Array] = None,
                          bias: Optional[Array] = None, relative: Optional[Relative] = None,
                          dropout_rate: float = 0.0, dropout_rng: Optional[Array] = None,
                          return_weights: bool = False):
  """Scaled dot-product attention (Vaswani et al. 2017) with optional Shaw terms.

  ``e_ij = q_i (k_j + a^K_ij)^T / sqrt(d) + bias_ij``, ``z_i = sum_j alpha_ij (v_j + a^V_ij)``.

  Args:
    query: ``[batch, q_length, heads, head_dim]``.
    key, value: ``[batch, k_length, heads, head_dim]``.
    mask: boolean, broadcastable to ``[batch, heads, q_length, k_length]``.
    bias: additive logits bias, broadcastable to the same shape (T5, ALiBi).
    relative: Shaw terms (:class:`Relative`), or None.
    dropout_rate, dropout_rng: dropout on the attention weights.
    return_weights: also return the ``[batch, heads, q, k]`` weights (before dropout).

  Returns:
    ``[batch, q_length, heads, head_dim]`` (and the weights if asked).
  """
  check_qkv(query, key, value)
  b, q_len, h, d = query.shape
  k_len = key.shape[1]
  shape = (b, h, q_len, k_len)
  check_mask(mask, shape)
  check_mask(bias, shape, "bias")
  query = query / jnp.sqrt(jnp.asarray(d, query.dtype))
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
  if relative is not None:
    relative.check(h, d)
    relative = relative.within(q_len, k_len)
    if relative.key_table is not None:
      logits = logits + relative_logits(query, relative, k_len)
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  return attend(logits, value, mask=mask, relative=relative, dropout_rate=dropout_rate,
                dropout_rng=dropout_rng, return_weights=return_weights)


def additive_attention(query: Array, key: Array, value: Array, v: Array, *, mask: Optional[Array] = None,
                       bias: Optional[Array] = None, dropout_rate: float = 0.0,
                       dropout_rng: Optional[Array] = None, return_weights: bool = False):
  """Additive (Bahdanau et al. 2015) attention: ``e_ij = v^T tanh(q_i + k_j)``.

  ``query`` and ``key`` are already projected (``W_q x``, ``W_k y``) to
  ``[batch, length, heads, dim]``; ``v`` is ``[heads, dim]`` or ``[dim]``.
  The score costs ``O(q k dim)`` memory, as the formulation requires.
  """
  for name, x in (("query", query), ("key", key), ("value", value)):
    if x.ndim != 4:
      raise ValueError(f"{name} must be [batch, length, heads, dim], got shape {x.shape}")
  if query.shape[-1] != key.shape[-1] or v.shape[-1] != query.shape[-1]:
    raise ValueError(f"additive attention needs query, key and v of one dim: {query.shape}, {key.shape}, v {v.shape}")
  b, q_len, h, _ = query.shape
  shape = (b, h, q_len, key.shape[1])
  check_mask(mask, shape)
  v = v if v.ndim == 2 else jnp.broadcast_to(v, (h, v.shape[-1]))
  hidden = jnp.tanh(query[:, :, None] + key[:, None, :])  # [b, q, k, h, a]
  logits = jnp.einsum("bqkha,ha->bhqk", hidden, v.astype(hidden.dtype))
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  return attend(logits, value, mask=mask, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
                return_weights=return_weights)


def local_attention(query: Array, key: Array, value: Array, window: int, *, causal: bool = False,
                    key_valid: Optional[Array] = None, dropout_rate: float = 0.0,
                    dropout_rng: Optional[Array] = None) -> Array:
  """Restricted self-attention: query ``i`` sees keys ``|j - i| <= window`` (and ``j <= i`` if causal).

  Computed in blocks of ``window`` positions, each attending to itself and its
  two neighbours, so time and memory are ``O(length * window)`` rather than
  ``O(length^2)``. Equals :func:`dot_product_attention` with :func:`window_mask`.

  Args:
    query, key, value: ``[batch, length, heads, head_dim]`` (one length).
    window: r >= 1.
    key_valid: optional ``[batch, length]`` padding mask of keys.
  """
  check_qkv(query, key, value)
  if isinstance(window, bool) or not isinstance(window, int) or window < 1:
    raise ValueError(f"window must be an int >= 1, got {window!r}")
  b, n, h, d = query.shape
  if key.shape[1] != n:
    raise ValueError(f"local_attention is self-attention: query length {n} != key length {key.shape[1]}")
  if key_valid is None:
    key_valid = jnp.ones((b, n), bool)
  elif key_valid.shape != (b, n):
    raise ValueError(f"key_valid has shape {key_valid.shape}; allowed: [batch, length] = {(b, n)}")
  w = window
  nb = -(-n // w)
  pad = nb * w - n

  def blocks(x, fill=0):
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
    return x.reshape((b, nb, w) + x.shape[2:])

  def neighbours(x, fill=0):  # [b, nb, w, ...] -> [b, nb, 3w, ...]: previous, own, next block
    widths = [(0, 0), (1, 1)] + [(0, 0)] * (x.ndim - 2)
    xp = jnp.pad(x, widths, constant_values=fill)
    return jnp.concatenate([xp[:, :-2], xp[:, 1:-1], xp[:, 2:]], axis=2)

  qb = blocks(query) / jnp.sqrt(jnp.asarray(d, query.dtype))
  kb, vb = neighbours(blocks(key)), neighbours(blocks(value))
  validb = neighbours(blocks(key_valid, False), False)  # [b, nb, 3w]
  logits = jnp.einsum("bnqhd,bnkhd->bnhqk", qb, kb)
  # Query i of a block sits at local position w + i among the 3w keys.
  dist = jnp.arange(3 * w)[None, :] - (w + jnp.arange(w)[:, None])
  m = jnp.abs(dist) <= w
  if causal:
    m = m & (dist <= 0)
  mask = m[None, None, None] & validb[:, :, None, None, :]
  weights = _masked_softmax(logits, mask, value.dtype)
  weights = _dropout(weights, dropout_rate, dropout_rng)
  out = jnp.einsum("bnhqk,bnkhd->bnqhd", weights, vb)
  return out.reshape(b, nb * w, h, d)[:, :n]
