"""Greedy and beam search over a ``tokens_to_logits`` callback; nothing here knows the model.

The callback maps the last token of every row and a cache to the next
token's logits and the updated cache::

  tokens_to_logits(ids [n, 1] int32, cache) -> (logits [n, vocab], new_cache)

with ``n = batch`` (greedy) or ``n = batch * beam_size`` (beam search, beams
of one example in consecutive rows). Cache leaves carry the rows on their
first axis; scalar leaves (a cache index) have no row axis and are left
alone when beams are tiled or reordered.

Both searches start every row from BOS and write at most ``max_decode_len``
tokens: the returned sequences ``[batch, max_decode_len]`` hold the tokens
without BOS, up to and including EOS, then PAD (0), the layout of the data
sets' ``targets``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from rpr.tokens import BOS, EOS, PAD

Array = jax.Array
TokensToLogits = Callable[[Array, Any], tuple[Array, Any]]

# Log-probability of impossible hypotheses; finite so that sums and the
# length penalty never produce inf - inf.
NEG_INF = -1.0e7


def length_penalty(length, alpha: float):
  """GNMT length penalty (Wu et al. 2016): ``lp(Y) = ((5 + |Y|) / 6) ** alpha``.

  A hypothesis scores ``log P(Y) / lp(Y)``; ``|Y|`` counts its tokens
  including EOS. ``alpha = 0`` ranks by log-probability alone; larger alpha
  favours longer outputs. Shaw et al. decode with beam 4 and alpha 0.6.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def tile_beams(tree, beam_size: int):
  """Repeats every row ``beam_size`` times: leaves ``[b, ...] -> [b * beam, ...]``; scalars unchanged."""
  def tile(x):
    x = jnp.asarray(x)
    return x if x.ndim == 0 else jnp.repeat(x, beam_size, axis=0)
  return jax.tree_util.tree_map(tile, tree)


def gather_beams(tree, indices: Array, batch_size: int, beam_size: int):
  """Picks beams per example: leaves ``[b * beam, ...]``, ``indices [b, k]`` -> ``[b * k, ...]``."""
  k = indices.shape[1]

  def gather(x):
    if x.ndim == 0:
      return x
    x = x.reshape((batch_size, beam_size) + x.shape[1:])
    idx = indices.reshape(indices.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1).reshape((batch_size * k,) + x.shape[2:])

  return jax.tree_util.tree_map(gather, tree)


def _log_probs(logits: Array, rows: int, bos_id: int) -> Array:
  """``[rows, vocab]`` (or ``[rows, 1, vocab]``) logits -> float32 log-softmax ``[rows, vocab]``.

  PAD and BOS are never written: they get ``NEG_INF`` after the softmax (so
  the other tokens keep the model's probabilities), since a cache that
  attends to a mid-sequence PAD or BOS would no longer match the full pass.
  """
  logits = logits.reshape(rows, -1).astype(jnp.float32)
  lp = jax.nn.log_softmax(logits, axis=-1)
  return lp.at[:, PAD].set(NEG_INF).at[:, bos_id].set(NEG_INF)


def _check(batch_size: int, max_decode_len: int, beam_size: int = 1, alpha: float = 0.0) -> None:
  for name, v in (("batch_size", batch_size), ("max_decode_len", max_decode_len), ("beam_size", beam_size)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be an int >= 1, got {v!r}")
  if alpha < 0:
    raise ValueError(f"alpha (length penalty exponent) must be >= 0, got {alpha}")


def greedy_search(tokens_to_logits: TokensToLogits, cache, batch_size: int, max_decode_len: int, *,
                  bos_id: int = BOS, eos_id: int = EOS) -> tuple[Array, Array]:
  """Argmax decoding: ``y_t = argmax_y log P(y | y_<t, x)`` until EOS or ``max_decode_len`` tokens.

  Args:
    tokens_to_logits: the callback, called with ``[batch, 1]`` ids.
    cache: its state for ``batch`` rows.
    batch_size, max_decode_len: rows and the most tokens written per row.

  Returns:
    ``sequences [batch, max_decode_len]`` int32 (PAD after EOS) and their
    ``log_probs [batch]`` (sum over the tokens up to and including EOS).
  """
  _check(batch_size, max_decode_len)
  b = batch_size

  def cond(state):
    i, _, _, _, finished, _ = state
    return (i < max_decode_len) & ~jnp.all(finished)

  def body(state):
    i, seqs, last, cache, finished, logp = state
    logits, cache = tokens_to_logits(last[:, None], cache)
    lp = _log_probs(logits, b, bos_id)
    token = jnp.argmax(lp, axis=-1).astype(jnp.int32)
    gain = jnp.take_along_axis(lp, token[:, None], axis=-1)[:, 0]
    # Rows already past EOS keep writing PAD and stop accumulating.
    token = jnp.where(finished, PAD, token)
    logp = logp + jnp.where(finished, 0.0, gain)
    seqs = seqs.at[:, i].set(token)
    return i + 1, seqs, token, cache, finished | (token == eos_id), logp

  state = (jnp.array(0, jnp.int32), jnp.zeros((b, max_decode_len), jnp.int32), jnp.full((b,), bos_id, jnp.int32),
           cache, jnp.zeros((b,), bool), jnp.zeros((b,), jnp.float32))
  _, seqs, _, _, _, logp = jax.lax.while_loop(cond, body, state)
  return seqs, logp


def beam_search(tokens_to_logits: TokensToLogits, cache, batch_size: int, max_decode_len: int, *,
                beam_size: int = 4, alpha: float = 0.6, bos_id: int = BOS, eos_id: int = EOS,
                return_all: bool = False) -> tuple[Array, Array]:
  """Beam search ranking hypotheses by ``log P(Y | x) / lp(Y)`` (:func:`length_penalty`).

  Each step extends the ``beam_size`` alive hypotheses of every example by
  every token, keeps the best ``2 * beam_size`` extensions (so at least
  ``beam_size`` of them do not end in EOS: each parent has one EOS), moves
  those ending in EOS to the finished set (kept sorted, best ``beam_size``)
  and continues with the best ``beam_size`` others. The search stops at
  ``max_decode_len`` tokens, or once no alive hypothesis can beat the worst
  finished one of its example: its log-probability can only fall and, for
  ``alpha >= 0``, its penalty is at most ``lp(max_decode_len)``. An example
  with no finished hypothesis returns its alive ones, scored at that length.

  Args:
    tokens_to_logits: the callback, called with ``[batch * beam_size, 1]`` ids.
    cache: its state for ``batch`` rows (leaves ``[batch, ...]``); it is tiled
      to ``[batch * beam_size, ...]`` here. Anything else the callback reads
      per row (encoder outputs, input masks) must be tiled by the caller with
      :func:`tile_beams`.
    batch_size, max_decode_len: examples and the most tokens written per hypothesis.
    beam_size: hypotheses kept per example (Shaw et al.: 4).
    alpha: length penalty exponent (Shaw et al.: 0.6), >= 0.
    return_all: return every finished beam, best first.

  Returns:
    ``sequences [batch, max_decode_len]`` and ``scores [batch]`` of the best
    hypothesis (``[batch, beam, max_decode_len]`` and ``[batch, beam]`` with
    ``return_all``, best first; a slot no finished hypothesis reached scores
    ``NEG_INF``); sequences end in EOS and are PAD-padded.
  """
  _check(batch_size, max_decode_len, beam_size, alpha)
  b, k, n = batch_size, beam_size, max_decode_len
  take = lambda x, idx: jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)

  def cond(state):
    i, _, alive_logp, _, _, _, fin_scores, fin_flags = state
    best_alive = jnp.max(alive_logp, axis=1) / length_penalty(n, alpha)
    worst_finished = jnp.min(jnp.where(fin_flags, fin_scores, NEG_INF), axis=1)
    return (i < n) & ~jnp.all(worst_finished >= best_alive)

  def body(state):
    i, alive_seqs, alive_logp, last, cache, fin_seqs, fin_scores, fin_flags = state
    logits, cache = tokens_to_logits(last.reshape(b * k, 1), cache)
    lp = _log_probs(logits, b * k, bos_id).reshape(b, k, -1)
    vocab = lp.shape[-1]
    flat = (alive_logp[:, :, None] + lp).reshape(b, k * vocab)
    cand_logp, cand = jax.lax.top_k(flat, 2 * k)  # [b, 2k]
    parent, token = cand // vocab, (cand % vocab).astype(jnp.int32)
    cand_seqs = take(alive_seqs, parent).at[:, :, i].set(token)
    # Extensions of impossible beams (the k - 1 empty ones at step 0) stay impossible.
    possible = cand_logp > NEG_INF / 2
    ends = (token == eos_id) & possible

    # Alive: the best k extensions not ending in EOS.
    alive_logp, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, cand_logp), k)
    alive_seqs, last = take(cand_seqs, keep), take(token, keep)
    cache = gather_beams(cache, take(parent, keep), b, k)

    # Finished: merge this step's EOS extensions (length i + 1) with the old ones.
    scores = jnp.where(ends, cand_logp / length_penalty(i + 1, alpha), NEG_INF)
    all_scores = jnp.concatenate([fin_scores, scores], axis=1)
    all_flags = jnp.concatenate([fin_flags, ends], axis=1)
    all_seqs = jnp.concatenate([fin_seqs, cand_seqs], axis=1)
    fin_scores, best = jax.lax.top_k(all_scores, k)
    return (i + 1, alive_seqs, alive_logp, last, cache, take(all_seqs, best), fin_scores, take(all_flags, best))

  alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (b, 1))
  state = (jnp.array(0, jnp.int32), jnp.zeros((b, k, n), jnp.int32), alive_logp,
           jnp.full((b, k), bos_id, jnp.int32), tile_beams(cache, k),
           jnp.zeros((b, k, n), jnp.int32), jnp.full((b, k), NEG_INF, jnp.float32), jnp.zeros((b, k), bool))
  _, alive_seqs, alive_logp, _, _, fin_seqs, fin_scores, fin_flags = jax.lax.while_loop(cond, body, state)
  # An example with no finished hypothesis returns its alive ones, scored at the full length.
  none_finished = ~jnp.any(fin_flags, axis=1)
  seqs = jnp.where(none_finished[:, None, None], alive_seqs, fin_seqs)
  scores = jnp.where(none_finished[:, None], alive_logp / length_penalty(n, alpha), fin_scores)
  return (seqs, scores) if return_all else (seqs[:, 0], scores[:, 0])
