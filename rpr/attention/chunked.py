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

Three modules: this one checks the arguments and lays the arrays out in
blocks; :mod:`~rpr.attention.chunked_plan` decides which key blocks each
query block visits and how Shaw's terms look on them;
:mod:`~rpr.attention.chunked_kernel` runs the two passes.

Position schemes per block ``(I, J)`` (query rows from ``q0``, keys from ``k0``):

* Shaw (``relative``): ``e_ij += q_i . w^K_{clip(j - i - offset)}`` is
  :func:`rpr.attention.relative.expand` of ``q_I W^K^T`` with the block offset
  ``offset + q0 - k0``; ``z_i += sum_j alpha_ij w^V_{clip(...)}`` accumulates
  :func:`rpr.attention.relative.reduce` of the block weights and multiplies by ``W^V``
  at the end. Only the two or three key blocks that the band
  ``|j - i - offset| < k`` crosses need these maps: every other block holds a
  single bucket (``0`` or ``2k``), where the a^K term is a per-row constant
  folded into the softmax's row shift and the a^V term is the block's share
  of the softmax mass. With square blocks and a static offset, the blocks
  beside the diagonal one hold only a small corner of the band: they run as
  single-bucket blocks with that corner corrected, so the full maps run on
  one block per query block (two when the offset puts the band across a
  block edge; :func:`band_plan`).
* T5 / ALiBi (``bias_fn``): the scheme's ``bias_fn(q_pos, k_pos) -> [h, q, k]``
  evaluated on the block's positions; its parameters (T5's table) get
  gradients through ``jax.closure_convert``.
* RoPE: rotate query and key beforehand; nothing per block.

Masks (:class:`rpr.attention.masks.Mask`): ``key_valid`` (padding),
``causal`` and ``window``, and optionally a dense boolean ``array`` sliced per
block (which itself costs ``O(q k)`` bytes). Key blocks that causality or the
window rule out for a whole query block are not visited (see
:class:`~rpr.attention.chunked_plan.Plan`), so with a window ``w`` time is
``O(q (2w + block_q + block_k))`` rather than ``O(q k)``; the blocks at the
cut are masked per cell. A query row with no allowed key outputs zero and
passes no gradient, as in the dense implementation.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention.chunked_kernel import Config, Inputs, attention_core
from rpr.attention.chunked_plan import BAND, LEFT, RIGHT, Corner, Plan, band_plan  # noqa: F401 (public names)
from rpr.attention.dense import MaskLike, as_mask, check_qkv
from rpr.attention.masks import Mask, check_offset
from rpr.attention.relative import Relative

Array = jax.Array


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
      additive logits bias (T5, ALiBi: :attr:`rpr.attention.positions.Terms.bias_fn`),
      evaluated per block at query positions ``q_offset + i``.
    mask: a :class:`~rpr.attention.masks.Mask` (its ``key_valid``,
      ``causal`` and ``window`` cost nothing per query-key pair, and key
      blocks wholly outside the causal or window cut are skipped, so a
      window ``w`` makes time ``O(q_length (2w + block_q + block_k))``; an
      ``array`` is sliced per block and costs its own O(q k) bytes), or a
      boolean array (taken as ``Mask(array=...)``).
    q_offset: position of query 0 for the mask and ``bias_fn``; an int or a
      traced scalar (cached decoding). The skipped blocks are computed from
      it when the kernel runs, so a traced offset skips the same blocks.
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
  parts = as_mask(mask)
  parts.check(b, h, q_len, k_len)
  _check_options(block_q, block_k, dropout_rate, dropout_rng)
  if relative is not None:
    if relative.ids is not None:
      raise ValueError("chunked_attention supports clipped relative distances only; explicit relation ids "
                       "(Relative.ids) need implementation='dense'")
    relative.check(h, d)  # the tables' rows, which give the clipping distance

  bq, bk = min(block_q, q_len), min(block_k, k_len)
  if bias_fn is not None:
    # Hoist the traced values bias_fn closes over (T5's table) into explicit,
    # differentiable arguments of the custom VJP.
    bias_fn, consts = jax.closure_convert(bias_fn, jnp.zeros((bq,), jnp.int32), jnp.zeros((bk,), jnp.int32))
  plan = Plan.make(bq, bk, k_len, parts.causal, parts.window, relative)
  cfg = Config(plan, k_len, bias_fn, float(dropout_rate))
  check_offset(q_offset)
  if relative is not None:
    check_offset(relative.offset, "relative.offset")
  inp = _blocked_inputs(query, key, value, relative, parts, plan, q_offset)
  if bias_fn is not None:
    inp = inp._replace(bias_consts=tuple(consts))
  if dropout_rate > 0:
    inp = inp._replace(rng=dropout_rng)
  out = attention_core(cfg, inp)
  out = jnp.transpose(out, (2, 0, 3, 1, 4)).reshape(b, -1, h, value.shape[-1])  # [nq, h, b, bq, d] -> [b, lq, h, d]
  return out[:, :q_len].astype(value.dtype)


def _check_options(block_q, block_k, dropout_rate, dropout_rng) -> None:
  for name, size in (("block_q", block_q), ("block_k", block_k)):
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
      raise ValueError(f"{name} must be an int >= 1, got {size!r}")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
  if dropout_rate > 0 and dropout_rng is None:
    raise ValueError("dropout_rate > 0 needs a dropout_rng")


def _blocked_inputs(query: Array, key: Array, value: Array, relative: Optional[Relative], parts: Mask, plan: Plan,
                    q_offset) -> Inputs:
  """The kernel's :class:`Inputs`: heads leading, lengths padded to the blocks, in the compute dtype.

  Heads lead (``[h, b, length, d]``): per-head Shaw tables ``[h, 2k+1, d]``
  then multiply as a batched matmul over the head axis, with no transposes.
  The query goes straight into its blocks ``[nq, h, b, bq, d]``, in the same
  copy. No bias constants, and a fixed rng (the caller sets those it uses).
  """
  b, q_len, h, d = query.shape
  k_len = key.shape[1]
  dtype = jnp.promote_types(query.dtype, jnp.float32)
  bq, bk = plan.block_q, plan.block_k
  lq, lk = -(-q_len // bq) * bq, plan.k_blocks * bk

  def pad(x, length):  # [b, n, h, d] -> [b, length, h, d], zero padded, in the compute dtype
    return jnp.pad(x.astype(dtype), [(0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)])

  q = pad(query / jnp.sqrt(jnp.asarray(d, query.dtype)), lq).reshape(b, lq // bq, bq, h, d).transpose(1, 3, 0, 2, 4)
  k, v = (jnp.transpose(pad(x, lk), (2, 0, 1, 3)) for x in (key, value))
  table = lambda t: None if t is None else t.astype(dtype)
  kt = vt = None
  rel_offset = jnp.zeros((), jnp.int32)
  if relative is not None:
    kt, vt = table(relative.key_table), table(relative.value_table)
    rel_offset = jnp.asarray(relative.offset, jnp.int32)
  key_valid = parts.key_valid
  if key_valid is not None:
    key_valid = jnp.pad(jnp.broadcast_to(key_valid.astype(bool), (b, k_len)), [(0, 0), (0, lk - k_len)])
  mask = parts.array
  if mask is not None:
    mask = jnp.swapaxes(mask.astype(bool), 0, 1)  # [h | 1, b | 1, q | 1, k | 1]
    if mask.shape[2] > 1:
      mask = jnp.pad(mask, [(0, 0), (0, 0), (0, lq - q_len), (0, 0)])
    if mask.shape[3] > 1:
      mask = jnp.pad(mask, [(0, 0), (0, 0), (0, 0), (0, lk - k_len)])
  return Inputs(q, k, v, kt, vt, (), key_valid, mask, rel_offset, jnp.asarray(q_offset, jnp.int32),
                jax.random.PRNGKey(0))
