"""Losses and evaluation metrics: smoothed cross entropy, token accuracy, exact match, BLEU.

The loss and accuracy are jit-able and return *sums* with their token counts,
so that sums over batches (and over devices, inside ``jax.jit``) stay exact;
divide at the end. Exact match and BLEU run on the host over decoded ids.
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rpr.tokens import EOS, PAD

Array = jax.Array


def smoothed_targets(targets: Array, vocab_size: int, label_smoothing: float) -> Array:
  """``[..., vocab]`` target distribution: ``1 - eps`` on the gold id, ``eps / (V - 1)`` on every other id.

  This is the tensor2tensor / Vaswani et al. (2017) convention (the gold id
  gets exactly ``1 - eps``), not ``optax.smooth_labels`` (``eps / V`` on all ids).
  """
  if vocab_size < 2 and label_smoothing:
    raise ValueError(f"label smoothing needs a vocabulary of >= 2 ids, got {vocab_size}")
  confidence = 1.0 - label_smoothing
  low = label_smoothing / max(vocab_size - 1, 1)
  return jax.nn.one_hot(targets, vocab_size) * (confidence - low) + low


def smoothing_entropy(vocab_size: int, label_smoothing: float) -> float:
  """Entropy of :func:`smoothed_targets`: the least value the smoothed cross entropy can take."""
  confidence = 1.0 - label_smoothing
  low = label_smoothing / max(vocab_size - 1, 1)
  h = 0.0
  if confidence > 0:
    h -= confidence * np.log(confidence)
  if low > 0:
    h -= (vocab_size - 1) * low * np.log(low)
  return float(h)


def cross_entropy(logits: Array, targets: Array, weights: Optional[Array] = None,
                  label_smoothing: float = 0.0) -> tuple[Array, Array]:
  """Label-smoothed cross entropy, summed over weighted tokens: ``(loss_sum, weight_sum)``.

  ``logits [batch, length, vocab]``, ``targets [batch, length]`` int ids,
  ``weights [batch, length]`` (default: 1 on non-PAD targets). Per token the
  loss is ``-sum_v q_v log p_v - H(q)`` with ``q`` from :func:`smoothed_targets`
  and ``H(q)`` its entropy: the KL divergence from ``q`` to the model, so it is
  0 exactly when the model predicts ``q`` (with ``eps = 0``: when it puts all
  mass on the gold id) and the number is comparable across smoothing values.
  The mean loss of a batch is ``loss_sum / weight_sum``, the number of non-PAD
  target tokens (the usual normalisation for translation).

  Computed without forming ``q`` or ``log p``: with ``q`` = ``low`` on every id
  and ``conf`` on the gold one, and ``log p_v = z_v - logsumexp(z)``,
  ``-sum_v q_v log p_v = logsumexp(z) - low sum_v z_v - (conf - low) z_gold``
  (the weights of ``logsumexp`` add up to ``(V - 1) low + conf = 1``). Every
  term is a reduction over the vocabulary that XLA fuses into one pass over the
  logits, and so is the gradient, ``softmax(z) - q``: a step of the translation
  model spent a third of its time forming ``q``, ``log p`` and their gradients.
  """
  if logits.ndim != targets.ndim + 1 or logits.shape[:-1] != targets.shape:
    raise ValueError(f"logits {logits.shape} must be targets {targets.shape} + [vocab]")
  if weights is None:
    weights = targets != PAD
  weights = weights.astype(jnp.float32)
  vocab_size = logits.shape[-1]
  if vocab_size < 2 and label_smoothing:
    raise ValueError(f"label smoothing needs a vocabulary of >= 2 ids, got {vocab_size}")
  z = logits.astype(jnp.float32)
  confidence, low = 1.0 - label_smoothing, label_smoothing / max(vocab_size - 1, 1)
  loss = jax.nn.logsumexp(z, axis=-1) - (confidence - low) * _gold(z, targets)
  if low:
    loss = loss - low * jnp.sum(z, axis=-1)
  loss = loss - smoothing_entropy(vocab_size, label_smoothing)
  return jnp.sum(loss * weights), jnp.sum(weights)


def _gold(z: Array, targets: Array) -> Array:
  """``z[..., targets]``, as a masked sum that XLA fuses into the other reductions over ``z`` (no gather)."""
  ids = jax.lax.broadcasted_iota(targets.dtype, z.shape, z.ndim - 1)
  return jnp.sum(jnp.where(ids == targets[..., None], z, 0.0), axis=-1)


def token_accuracy(logits: Array, targets: Array, weights: Optional[Array] = None) -> tuple[Array, Array]:
  """Weighted count of tokens whose target has the largest logit: ``(correct_sum, weight_sum)``.

  A target tied with another id for the largest logit counts as correct (``argmax`` would pick the lower id);
  compared with ``max`` instead of ``argmax``, which XLA:CPU computes as a slow index-carrying reduction.
  """
  if weights is None:
    weights = targets != PAD
  weights = weights.astype(jnp.float32)
  correct = (_gold(logits, targets) >= jnp.max(logits, axis=-1)).astype(jnp.float32)
  return jnp.sum(correct * weights), jnp.sum(weights)


def _through_eos(row: np.ndarray) -> np.ndarray:
  """The ids of ``row`` up to and including its first EOS; without EOS, all of it less trailing PAD.

  A PAD (or any id) before the EOS stays: sequences are compared token for token.
  """
  hits = np.flatnonzero(row == EOS)
  if hits.size:
    return row[: hits[0] + 1]
  keep = np.flatnonzero(row != PAD)
  return row[: keep[-1] + 1] if keep.size else row[:0]


def exact_match(predictions: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per example: is the prediction the target, token for token through EOS? ``(matches [batch], valid [batch])``.

  ``predictions [batch, p_len]`` and ``targets [batch, t_len]`` are id arrays
  (lengths may differ); anything a prediction writes after its EOS is ignored,
  anything before it counts (a PAD written mid-sequence is a wrong token).
  All-PAD target rows (padding of the last eval batch) are not ``valid`` and
  never match.
  """
  predictions, targets = np.asarray(predictions), np.asarray(targets)
  if predictions.shape[0] != targets.shape[0]:
    raise ValueError(f"predictions {predictions.shape} and targets {targets.shape} differ in batch size")
  valid = np.any(targets != PAD, axis=1)
  matches = np.array([v and np.array_equal(_through_eos(p), _through_eos(t))
                      for p, t, v in zip(predictions, targets, valid)], dtype=bool)
  return matches, valid


def mean_by_length(values: np.ndarray, lengths: np.ndarray) -> dict[int, float]:
  """Mean of ``values [n]`` over the examples of each length in ``lengths [n]``: ``{length: mean}``, sorted."""
  values, lengths = np.asarray(values, np.float64), np.asarray(lengths)
  if values.shape != lengths.shape or values.ndim != 1:
    raise ValueError(f"values {values.shape} and lengths {lengths.shape} must be equal 1-D shapes")
  return {int(n): float(values[lengths == n].mean()) for n in np.unique(lengths)}


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Corpus BLEU (sacrebleu's default 13a tokenisation), 0-100, one reference per hypothesis."""
  import sacrebleu  # only text tasks need it

  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Corpus chrF (sacrebleu's default: character 6-grams, beta 2), 0-100, one reference per hypothesis."""
  import sacrebleu

  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  return float(sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score)
