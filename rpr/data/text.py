"""Text translation as a Task: tokenised pairs, step-addressed token-budget batches, length-sorted eval.

Shared by every translation data set (``rpr.data.wmt``, ``rpr.data.bible``).
A data set builds a SentencePiece vocabulary and its tokenised training pairs,
and subclasses :class:`TranslationTask` with ``split_texts(split)``, the raw
(source, target) texts of an eval split.

Batches. Both ``inputs`` and ``targets`` end with EOS (as in tensor2tensor,
which Shaw used); lengths below count it. An example goes to the smallest
bucket boundary ``L >= max(source length, target length)``; examples longer
than ``max_length`` are left out of training. Bucket ``L`` always yields
``[B_L, L]`` with ``B_L = tokens_per_batch // L`` rounded down to a multiple
of ``batch_multiple``, so every batch holds at most ``tokens_per_batch``
positions per side, padding included (tensor2tensor counts them the same way),
and jit sees one shape per bucket. ``tokens_per_batch`` is the global budget:
the caller scales it by the device count and passes the device count as
``batch_multiple`` so the batch splits evenly.

Step addressing. Epoch ``e`` permutes each bucket with a generator seeded by
``(seed, e)``, cuts it into full batches (a bucket's remainder waits for
another epoch's permutation) and shuffles the batch order. Every epoch has the
same number of batches, so ``train_batch(step)`` is batch ``step mod K`` of
epoch ``step // K``: a pure function of ``(seed, step)`` given the vocabulary
and the tokenised data.

Evaluation. ``eval_batches(split)`` yields every example once, sorted by
length (stable) so that a batch's padding, and the cost of decoding it, stays
small; batch rows are padded to the same length set as training (past the
last boundary: multiples of 64), the last batch with all-PAD rows.
``references(split)`` gives the raw target-language strings in exactly the
order of the real rows of ``eval_batches(split)``: score BLEU against these,
not against decoded ``targets``, which have been through the vocabulary's
normalisation. Eval examples are never filtered by length.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import shutil
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np
from absl import logging

from rpr import progress
from rpr.data import sentencepiece_vocab
from rpr.data.task import EOS

DEFAULT_MAX_LENGTH = 256
# Eval lengths past the last bucket boundary are rounded up to this, so even
# very long test sentences give few distinct shapes.
_EVAL_LENGTH_STEP = 64


def default_bucket_boundaries(max_length: int = DEFAULT_MAX_LENGTH) -> list[int]:
  """Bucket lengths up to ``max_length``: steps of 8 to 64, of 16 to 128, then of 32.

  16 buckets for ``max_length=256``: few enough compilations, and from the
  40 bucket up a row's longer side is padded by under 20% of the bucket length
  (the short buckets pad relatively more, but their batches are cheap).
  """
  out, n = [], 8
  while n < max_length:
    out.append(n)
    n += 8 if n < 64 else 16 if n < 128 else 32
  return out + [max_length]


@dataclasses.dataclass
class TokenizedPairs:
  """Token ids of many (source, target) pairs, stored flat.

  Pair ``i`` has source ``source_ids[source_offsets[i]:source_offsets[i + 1]]``
  and likewise for the target; no BOS/EOS is stored.
  """

  source_ids: np.ndarray  # [total source tokens] uint16 or int32
  source_offsets: np.ndarray  # [num pairs + 1] int64
  target_ids: np.ndarray
  target_offsets: np.ndarray

  _FILES = ("source_ids", "source_offsets", "target_ids", "target_offsets")

  def __len__(self) -> int:
    return len(self.source_offsets) - 1

  @property
  def source_lengths(self) -> np.ndarray:
    return np.diff(self.source_offsets)

  @property
  def target_lengths(self) -> np.ndarray:
    return np.diff(self.target_offsets)

  def save(self, directory: str) -> None:
    """Writes the arrays under ``directory``, which appears complete or not at all."""
    tmp = f"{directory}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in self._FILES:
      np.save(os.path.join(tmp, name + ".npy"), getattr(self, name))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
      json.dump({"num_pairs": len(self), "source_tokens": int(self.source_offsets[-1]),
                 "target_tokens": int(self.target_offsets[-1])}, f)
    try:
      os.replace(tmp, directory)
    except OSError:
      # Another process (another host of the same run) finished first; its
      # arrays are identical because tokenisation is deterministic.
      if not os.path.exists(os.path.join(directory, "meta.json")):
        raise
      shutil.rmtree(tmp, ignore_errors=True)

  @classmethod
  def load(cls, directory: str) -> "TokenizedPairs":
    """Memory-maps arrays written by ``save``: only the pages a batch touches are read."""
    return cls(**{name: np.load(os.path.join(directory, name + ".npy"), mmap_mode="r")
                  for name in cls._FILES})


def tokenize_pairs(chunks: Iterable[tuple[Sequence[str], Sequence[str]]],
                   vocab: sentencepiece_vocab.SentencePieceVocab, total: int | None = None) -> TokenizedPairs:
  """Encodes chunks of (source texts, target texts) into a ``TokenizedPairs``; ``total``: the pairs expected,
  for the progress lines' ETA (a split of millions takes minutes)."""
  dtype = np.uint16 if vocab.size <= 2**16 else np.int32
  flat = {"source": [], "target": []}
  lengths = {"source": [], "target": []}
  counter = progress.Progress("tokenising", total, "pairs")
  for sources, targets in chunks:
    for side, texts in (("source", sources), ("target", targets)):
      ids = vocab.encode_batch(texts)
      lens = np.fromiter(map(len, ids), np.int64, len(ids))
      flat[side].append(np.fromiter(itertools.chain.from_iterable(ids), dtype, int(lens.sum())))
      lengths[side].append(lens)
    counter.update(len(sources))
  counter.finish()

  def offsets(lens):
    return np.concatenate([[0], np.cumsum(np.concatenate(lens) if lens else [], dtype=np.int64)]).astype(np.int64)

  def ids(parts):
    return np.concatenate(parts) if parts else np.zeros(0, dtype)

  return TokenizedPairs(ids(flat["source"]), offsets(lengths["source"]),
                        ids(flat["target"]), offsets(lengths["target"]))


def gather_padded(ids: np.ndarray, offsets: np.ndarray, index: np.ndarray, length: int) -> np.ndarray:
  """Sequences ``index`` of a flat store, each followed by EOS, right-padded: int32 ``[len(index), length]``."""
  index = np.asarray(index, np.int64)
  starts = offsets[index]
  lens = offsets[index + 1] - starts
  if len(index) and lens.max() + 1 > length:
    raise ValueError(f"a sequence of {lens.max()} tokens + EOS does not fit length {length}")
  pos = np.arange(length)
  inside = pos[None, :] < lens[:, None]
  # Clipping keeps the reads of padding positions in range; they are masked.
  flat_pos = np.minimum(starts[:, None] + pos[None, :], max(len(ids) - 1, 0))
  out = np.where(inside, ids[flat_pos] if len(ids) else 0, 0).astype(np.int32)
  out[np.arange(len(index)), lens] = EOS
  return out


class TokenBudgetBatches:
  """Training batches by step: bucketed by length, ``[B_L, L]`` per bucket, reshuffled per epoch.

  See the module docstring for the scheme. ``source_lengths`` and
  ``target_lengths`` count tokens without EOS; ``max_length`` and the
  boundaries count it.
  """

  def __init__(self, source_lengths: np.ndarray, target_lengths: np.ndarray, *,
               tokens_per_batch: int, max_length: int, boundaries: Sequence[int],
               batch_multiple: int = 1, seed: int = 0):
    if batch_multiple < 1:
      raise ValueError(f"batch_multiple must be positive, got {batch_multiple}")
    boundaries = sorted(set(int(b) for b in boundaries if b <= max_length) | {max_length})
    self.boundaries = np.asarray(boundaries, np.int64)
    self.seed = seed
    self.batch_sizes = [(tokens_per_batch // L) // batch_multiple * batch_multiple for L in boundaries]
    if min(self.batch_sizes) < 1:
      raise ValueError(f"tokens_per_batch={tokens_per_batch} cannot hold {batch_multiple} row(s) "
                       f"of the longest bucket ({boundaries[-1]} tokens)")
    lengths = np.maximum(np.asarray(source_lengths), np.asarray(target_lengths)) + 1
    keep = lengths <= max_length
    bucket = np.searchsorted(self.boundaries, lengths, side="left")
    self.examples = [np.flatnonzero(keep & (bucket == b)).astype(np.int32) for b in range(len(boundaries))]
    self.num_kept = int(keep.sum())
    self.num_dropped = int(len(lengths) - self.num_kept)
    self.batches_per_bucket = [len(e) // B for e, B in zip(self.examples, self.batch_sizes)]
    self.batches_per_epoch = sum(self.batches_per_bucket)
    if self.batches_per_epoch == 0:
      raise ValueError(f"no bucket fills one batch: {self.num_kept} examples kept, "
                       f"batch sizes {dict(zip(boundaries, self.batch_sizes))}")
    self._epochs: collections.OrderedDict[int, tuple[np.ndarray, list[np.ndarray]]] = collections.OrderedDict()

  @property
  def shapes(self) -> list[tuple[int, int]]:
    """Every ``[batch, length]`` a training batch can have."""
    return [(B, int(L)) for B, L, n in zip(self.batch_sizes, self.boundaries, self.batches_per_bucket) if n]

  def _epoch(self, epoch: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(bucket and row of each batch position ``[K, 2]``, per-bucket ``[batches, B]`` example indices)."""
    if epoch not in self._epochs:
      rng = np.random.default_rng([self.seed, epoch])
      rows = []
      for ex, B, n in zip(self.examples, self.batch_sizes, self.batches_per_bucket):
        rows.append(rng.permutation(ex)[: n * B].reshape(n, B))
      where = np.concatenate([np.stack([np.full(n, b), np.arange(n)], 1)
                              for b, n in enumerate(self.batches_per_bucket)])
      self._epochs[epoch] = (where[rng.permutation(len(where))], rows)
      # Steps advance monotonically: the current and the previous epoch suffice.
      while len(self._epochs) > 2:
        self._epochs.popitem(last=False)
    return self._epochs[epoch]

  def __call__(self, step: int) -> tuple[int, np.ndarray]:
    """``(length L, example indices [B_L])`` of training step ``step``."""
    if step < 0:
      raise ValueError(f"step must be non-negative, got {step}")
    epoch, k = divmod(int(step), self.batches_per_epoch)
    where, rows = self._epoch(epoch)
    b, r = where[k]
    return int(self.boundaries[b]), rows[b][r]


class _EvalSplit(NamedTuple):
  """One eval split, tokenised once and kept in memory (a few thousand pairs)."""

  pairs: TokenizedPairs
  sources: list[str]  # raw texts in stored order
  references: list[str]
  order: np.ndarray  # [num pairs] eval order: stored indices sorted by length


class TranslationTask:
  """Translation implementing ``rpr.data.task.Task`` (see the module docstring).

  Subclasses build ``vocab`` and the tokenised ``train`` pairs, call this
  ``__init__``, and implement ``split_texts``.
  """

  is_text = True

  def __init__(self, vocab: sentencepiece_vocab.SentencePieceVocab, train: TokenizedPairs, *,
               tokens_per_batch: int, max_length: int = DEFAULT_MAX_LENGTH,
               bucket_boundaries: Sequence[int] | None = None, batch_multiple: int = 1, seed: int = 0,
               eval_batch_size: int = 64):
    """``tokens_per_batch``: global positions per side per batch; ``max_length``: longest training
    example (tokens + EOS, either side); ``bucket_boundaries``: default ``default_bucket_boundaries``;
    ``batch_multiple``: batch sizes are multiples of this (the device count); ``seed``: the order
    of training batches; ``eval_batch_size``: rows per eval batch."""
    self.vocab, self.train = vocab, train
    self.max_length = max_length
    self.boundaries = list(bucket_boundaries or default_bucket_boundaries(max_length))
    self.eval_batch_size = eval_batch_size
    self._eval: dict[str, _EvalSplit] = {}
    self.batches = TokenBudgetBatches(
        train.source_lengths, train.target_lengths, tokens_per_batch=tokens_per_batch,
        max_length=max_length, boundaries=self.boundaries, batch_multiple=batch_multiple, seed=seed)
    logging.info("%s: %d training pairs, %d longer than %d left out; %d batches per epoch, shapes %s",
                 type(self).__name__, len(train), self.batches.num_dropped, max_length,
                 self.batches.batches_per_epoch, self.batches.shapes)

  def split_texts(self, split: str) -> tuple[list[str], list[str]]:
    """The raw (source texts, target texts) of eval split ``split``, in stored order."""
    raise NotImplementedError

  def train_rows(self, step: int) -> int:
    return len(self.batches(step)[1])

  def train_batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """Batch ``step``: int32 ``inputs`` and ``targets``, both ``[B_L, L]`` for one bucket ``L`` (its ``rows``)."""
    length, index = self.batches(step)
    index = index[rows]
    return {"inputs": gather_padded(self.train.source_ids, self.train.source_offsets, index, length),
            "targets": gather_padded(self.train.target_ids, self.train.target_offsets, index, length)}

  def _eval_data(self, split: str) -> _EvalSplit:
    """Tokenised pairs, raw texts and eval order of ``split``, computed once."""
    if split not in self._eval:
      sources, references = self.split_texts(split)
      pairs = tokenize_pairs([(sources, references)], self.vocab)
      order = np.argsort(np.maximum(pairs.source_lengths, pairs.target_lengths), kind="stable")
      self._eval[split] = _EvalSplit(pairs, list(sources), list(references), order)
    return self._eval[split]

  def _eval_length(self, n: int) -> int:
    """The padded length for a batch whose longest sequence (with EOS) is ``n``."""
    i = np.searchsorted(self.boundaries, n, side="left")
    if i < len(self.boundaries):
      return int(self.boundaries[i])
    return -(-n // _EVAL_LENGTH_STEP) * _EVAL_LENGTH_STEP

  def eval_batches(self, split: str) -> Iterator[dict[str, np.ndarray]]:
    """Every example of ``split`` once, sorted by length; see ``references`` for the text."""
    data = self._eval_data(split)
    pairs, order, B = data.pairs, data.order, self.eval_batch_size
    lengths = np.maximum(pairs.source_lengths, pairs.target_lengths) + 1
    for start in range(0, len(order), B):
      index = order[start:start + B]
      length = self._eval_length(int(lengths[index].max()))
      batch = {"inputs": gather_padded(pairs.source_ids, pairs.source_offsets, index, length),
               "targets": gather_padded(pairs.target_ids, pairs.target_offsets, index, length)}
      if len(index) < B:  # all-PAD rows keep the shape fixed
        batch = {k: np.pad(v, ((0, B - len(index)), (0, 0))) for k, v in batch.items()}
      yield batch

  def references(self, split: str) -> list[str]:
    """Raw target texts, one per real (not all-PAD) row of ``eval_batches(split)``, in that order."""
    data = self._eval_data(split)
    return [data.references[i] for i in data.order]

  def sources(self, split: str) -> list[str]:
    """Raw source texts in the order of ``references(split)`` (for writing translations out)."""
    data = self._eval_data(split)
    return [data.sources[i] for i in data.order]
