"""Language modelling over documents as a Task: random training windows, tiled eval windows.

The contract (``is_lm = True``, ``is_text = False``): a batch is
``{"inputs": int32 [b, 0], "targets": int32 [b, W]}``. The model reads
BOS + ``targets[:, :-1]`` and predicts ``targets``; PAD (0) in ``targets`` is
not scored. ``targets`` never hold BOS.

Token stream. Each document is its SentencePiece ids followed by EOS, so the
model learns where an address ends; the EOS counts as one of its tokens.

Training. The training documents are concatenated into one stream; batch
``step`` holds ``batch_size`` windows of ``context_length`` tokens at offsets
drawn uniformly from a generator seeded by ``(seed, step)``, so
``train_batch(step)`` is a pure function of ``(seed, step)``. Windows may
cross a document's EOS into the next document.

Evaluation. An eval split of window ``W`` cuts each document into
non-overlapping windows ``[0, W), [W, 2W), ...``; the last partial window is
padded with PAD. Every held-out token is thus scored exactly once per split,
each from the start of its own window (so with less context than a sliding
window would give). ``<split>`` uses ``W = context_length``;
``<long_split>_x<m>`` uses ``W = m * context_length`` on the same documents
(train short, test long). Batches hold ``max(1, eval_batch_size // m)`` rows,
so about the same number of tokens at every ``W``; the last batch is filled
with all-PAD rows.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from rpr.data.task import EOS, Vocab


def with_eos(documents: Sequence[Sequence[int]]) -> list[np.ndarray]:
  """Each document's ids followed by EOS, as int32 arrays."""
  return [np.append(np.asarray(d, np.int32), np.int32(EOS)) for d in documents]


def windows(documents: Sequence[np.ndarray], width: int) -> np.ndarray:
  """Non-overlapping windows of ``width`` tokens within each document, PAD-filled: int32 ``[n, width]``."""
  rows = [d[start:start + width] for d in documents for start in range(0, len(d), width)]
  out = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


class DocumentLMTask:
  """Language modelling implementing ``rpr.data.task.Task`` plus ``is_lm`` (see the module docstring)."""

  is_text = False
  is_lm = True

  def __init__(self, vocab: Vocab, train: Sequence[Sequence[int]], evaluation: dict[str, Sequence[Sequence[int]]],
               *, context_length: int, batch_size: int, eval_batch_size: int, seed: int = 0,
               long_split: str = "test", long_multiples: Sequence[int] = (2, 4, 8)):
    """``train`` and ``evaluation[split]`` are documents as id lists (without EOS); ``long_split``
    names the split also evaluated in windows of ``m * context_length`` for ``m`` in ``long_multiples``."""
    if min(context_length, batch_size, eval_batch_size) < 1:
      raise ValueError(f"context_length, batch_size and eval_batch_size must be positive, got "
                       f"{context_length}, {batch_size}, {eval_batch_size}")
    self.vocab, self.seed = vocab, seed
    self.context_length, self.batch_size, self.eval_batch_size = context_length, batch_size, eval_batch_size
    self.stream = np.concatenate(with_eos(train)) if len(train) else np.zeros(0, np.int32)
    if len(self.stream) < context_length:
      raise ValueError(f"the training documents hold {len(self.stream)} tokens, fewer than one window "
                       f"of context_length={context_length}")
    self.documents = {split: with_eos(docs) for split, docs in evaluation.items()}
    # split -> (documents of split, window multiple)
    self.splits = {split: (split, 1) for split in evaluation}
    if long_multiples:
      if long_split not in evaluation:
        raise ValueError(f"long_split {long_split!r} is not an eval split; allowed: {sorted(evaluation)}")
      self.splits.update({f"{long_split}_x{m}": (long_split, m) for m in long_multiples})

  def train_rows(self, step: int) -> int:
    return self.batch_size

  def train_batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """``batch_size`` windows of ``context_length`` tokens of the training stream at random offsets."""
    if step < 0:
      raise ValueError(f"step must be non-negative, got {step}")
    rng = np.random.default_rng([self.seed, step])
    starts = rng.integers(0, len(self.stream) - self.context_length + 1, size=self.batch_size)[rows]
    targets = self.stream[starts[:, None] + np.arange(self.context_length)]
    return {"inputs": np.zeros((len(starts), 0), np.int32), "targets": targets}

  def window_length(self, split: str) -> int:
    """The window length of eval split ``split``."""
    return self.context_length * self._split(split)[1]

  def _split(self, split: str) -> tuple[str, int]:
    if split not in self.splits:
      raise ValueError(f"unknown eval split {split!r}; allowed: {list(self.splits)}")
    return self.splits[split]

  def eval_batches(self, split: str) -> Iterator[dict[str, np.ndarray]]:
    """Every token of ``split`` once, in windows of ``window_length(split)``; see the module docstring."""
    name, m = self._split(split)
    rows = windows(self.documents[name], m * self.context_length)
    B = max(1, self.eval_batch_size // m)
    for start in range(0, len(rows), B):
      targets = rows[start:start + B]
      targets = np.pad(targets, ((0, B - len(targets)), (0, 0)))  # all-PAD rows keep the shape fixed
      yield {"inputs": np.zeros((B, 0), np.int32), "targets": targets}
