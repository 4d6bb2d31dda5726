"""Dense attention: the ``[batch, heads, q_length, k_length]`` weights are formed, as the equations write them.

Layout ``[batch, length, heads, head_dim]`` as in ``jax.nn.dot_product_attention``.
Every function is jit-able, differentiable and dtype-generic (float32,
bfloat16, float16, float64); the softmax runs in at least float32. A
:class:`~rpr.attention.masks.Mask` (or a boolean array, True = may attend)
says which keys each query sees; a query with no key outputs zero.
"""

from __future__ import annotations

from typing import Optional, Union

import jax
import jax.numpy as jnp

from rpr.attention import masks as masks_lib
from rpr.attention.masks import Mask
from rpr.attention.dense_terms import relative_logits, relative_values
from rpr.attention.relative import Relative

Array = jax.Array
MaskLike = Union[Mask, Array, None]


def check_qkv(query: Array, key: Array, value: Array) -> None:
  """Shapes ``[batch, length, heads, head_dim]`` that agree, floating dtypes, no empty axis."""
  for name, x in (("query", query), ("key", key), ("value", value)):
    if x.ndim != 4:
      raise ValueError(f"{name} must be [batch, length, heads, head_dim], got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(f"{name} has dtype {x.dtype}; allowed: a floating dtype (float32, bfloat16, float16, float64)")
    if 0 in x.shape:
      raise ValueError(f"{name} has shape {x.shape}; every axis must be >= 1")
  if query.shape[-1] != key.shape[-1]:
    raise ValueError(f"query and key head_dim differ: query {query.shape} vs key {key.shape}")
  if key.shape[:3] != value.shape[:3]:
    raise ValueError(f"key and value must agree on [batch, length, heads]: key {key.shape} vs value {value.shape}")
  if query.shape[0] != key.shape[0] or query.shape[2] != key.shape[2]:
    raise ValueError(f"query and key must agree on batch and heads: query {query.shape} vs key {key.shape}")


def as_mask(mask: MaskLike) -> Mask:
  """A :class:`Mask` from a Mask, a boolean array (``Mask.array``) or None (everything allowed)."""
  if mask is None:
    return Mask()
  if isinstance(mask, Mask):
    return mask
  return Mask(array=jnp.asarray(mask))


def softmax(logits: Array, mask: Optional[Array], dtype) -> Array:
  """``softmax_j`` over the allowed keys, in at least float32; a row with no allowed key is all zero."""
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  if mask is None:
    return jax.nn.softmax(logits, axis=-1).astype(dtype)
  weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(logits.dtype).min), axis=-1)
  return jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0).astype(dtype)


def dropout(weights: Array, rate: float, rng: Optional[Array]) -> Array:
  """Inverted dropout on the attention weights (``rate`` 0: unchanged)."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
  if rate == 0.0:
    return weights
  if rng is None:
    raise ValueError("dropout_rate > 0 needs a dropout_rng (or pass deterministic attention with rate 0)")
  keep = jax.random.bernoulli(rng, 1.0 - rate, weights.shape)
  return jnp.where(keep, weights / (1.0 - rate), 0).astype(weights.dtype)


def weighted_values(logits: Array, value: Array, mask: Optional[Array], relative: Optional[Relative],
                    dropout_rate: float, dropout_rng: Optional[Array]) -> tuple[Array, Array]:
  """``alpha = softmax(logits)``, dropout, ``z_i = sum_j alpha_ij (v_j + a^V_ij)``: ``(z, alpha before dropout)``."""
  weights = softmax(logits, mask, value.dtype)
  probs = dropout(weights, dropout_rate, dropout_rng)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
  if relative is not None and relative.value_table is not None:
    out = out + relative_values(probs, relative)
  return out, weights


def dot_product_attention(query: Array, key: Array, value: Array, *, mask: MaskLike = None,
                          bias: Optional[Array] = None, relative: Optional[Relative] = None, q_offset=0,
                          dropout_rate: float = 0.0, dropout_rng: Optional[Array] = None,
                          return_weights: bool = False):
  """Scaled dot-product attention (Vaswani et al. 2017) with Shaw et al.'s (2018) relative terms.

  Relation-aware self-attention, Shaw, Uszkoreit and Vaswani (2018), for
  heads of size ``d_z`` and clipping distance ``k``:

      (3)  z_i  = sum_j alpha_ij (x_j W^V + a^V_ij)
      (4)  e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z),   alpha_ij = softmax_j(e_ij)
      (5)  e_ij = (x_i W^Q (x_j W^K)^T + x_i W^Q (a^K_ij)^T) / sqrt(d_z)

  with ``a^K_ij = w^K_clip(j-i, k)``, ``a^V_ij = w^V_clip(j-i, k)`` and
  ``clip(x, k) = max(-k, min(k, x))``. Equation (5) is how this runs: the
  first term is one batched matmul, the second is ``q_i . w^K_r`` for the
  ``2k+1`` rows ``r`` spread over the keys by :func:`rpr.attention.relative.expand`,
  and the a^V sum of (3) is :func:`~rpr.attention.relative.reduce` of the
  weights times ``w^V``; no ``[q, k, d]`` tensor is formed. ``bias`` (T5,
  ALiBi) is added to ``e_ij``.

  Args:
    query: ``[batch, q_length, heads, head_dim]`` (``x_i W^Q``).
    key, value: ``[batch, k_length, heads, head_dim]`` (``x_j W^K``, ``x_j W^V``).
    mask: a :class:`Mask`, or a boolean array broadcastable to ``[batch, heads, q_length, k_length]``.
    bias: additive logits bias, broadcastable to the same shape.
    relative: Shaw's tables (:class:`Relative`; their ``2k+1`` rows give ``k``), or None.
    q_offset: position of query 0 (keys sit at ``0 .. k_length-1``) for the mask's causal and window parts.
    dropout_rate, dropout_rng: dropout on the attention weights.
    return_weights: also return the ``[batch, heads, q, k]`` weights (before dropout).

  Returns:
    ``[batch, q_length, heads, head_dim]`` (and the weights if asked).
  """
  check_qkv(query, key, value)
  b, q_len, h, d = query.shape
  k_len = key.shape[1]
  mask = as_mask(mask)
  masks_lib.check_offset(q_offset)
  mask.check(b, h, q_len, k_len)
  masks_lib.check_array(bias, (b, h, q_len, k_len), "bias")
  query = query / jnp.sqrt(jnp.asarray(d, query.dtype))
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
  if relative is not None:
    relative.check(h, d)
    relative = relative.within(q_len, k_len)
    if relative.key_table is not None:
      logits = logits + relative_logits(query, relative, k_len)
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  out, weights = weighted_values(logits, value, mask.dense(q_len, k_len, q_offset), relative, dropout_rate,
                                 dropout_rng)
  return (out, weights) if return_weights else out


def additive_attention(query: Array, key: Array, value: Array, v: Array, *, mask: MaskLike = None,
                       bias: Optional[Array] = None, q_offset=0, dropout_rate: float = 0.0,
                       dropout_rng: Optional[Array] = None, return_weights: bool = False):
  """Additive (Bahdanau et al. 2015) attention: ``e_ij = v^T tanh(q_i + k_j)``.

  ``query`` and ``key`` are already projected (``W_q x``, ``W_k y``) to
  ``[batch, length, heads, dim]``; ``v`` is ``[heads, dim]`` or ``[dim]``.
  The score costs ``O(q k dim)`` memory, as the formulation requires.
  """
  check_qkv(query, key, value)
  if v.shape[-1] != query.shape[-1]:
    raise ValueError(f"additive attention needs query, key and v of one dim: {query.shape}, {key.shape}, v {v.shape}")
  b, q_len, h, _ = query.shape
  k_len = key.shape[1]
  mask = as_mask(mask)
  masks_lib.check_offset(q_offset)
  mask.check(b, h, q_len, k_len)
  v = v if v.ndim == 2 else jnp.broadcast_to(v, (h, v.shape[-1]))
  hidden = jnp.tanh(query[:, :, None] + key[:, None, :])  # [b, q, k, h, a]
  logits = jnp.einsum("bqkha,ha->bhqk", hidden, v.astype(hidden.dtype))
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  out, weights = weighted_values(logits, value, mask.dense(q_len, k_len, q_offset), None, dropout_rate,
                                 dropout_rng)
  return (out, weights) if return_weights else out
