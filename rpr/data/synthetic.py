"""Copy and reverse over random digit strings: tiny in-memory tasks for tests and CPU runs.

``copy`` maps ``"3141"`` to ``"3141"``; ``reverse`` maps it to ``"1413"``.
Reversal needs every output position to find the input position mirrored
around the middle, a job for relative (or absolute) positions; copying only
needs the same position.

Lengths are uniform in ``[min_length, max_length]`` for ``train`` and the
``valid`` split and in ``[max_length + 1, long_max_length]`` for the ``long``
split (length generalisation). Strings are drawn independently, so a short
``valid`` string may also occur in training; the ``long`` split never does.
Every batch is a pure function of ``(seed, split, step)`` through NumPy's
``default_rng``; nothing is stored.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from rpr.data.task import CharVocab, pad_batch

KINDS = ("copy", "reverse")
SPLITS = ("valid", "long")
DIGITS = "0123456789"


class SequenceTask:
  """The ``copy`` or ``reverse`` task; follows :class:`rpr.data.task.Task`."""

  is_text = False

  def __init__(self, kind: str, batch_size: int, min_length: int, max_length: int, long_max_length: int,
               num_eval_examples: int, eval_batch_size: int, seed: int = 0):
    if kind not in KINDS:
      raise ValueError(f"unknown synthetic task {kind!r}; allowed: {list(KINDS)}")
    if not 1 <= min_length <= max_length:
      raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
    self.kind, self.seed = kind, seed
    self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
    self.min_length, self.max_length, self.long_max_length = min_length, max_length, long_max_length
    self.num_eval_examples = num_eval_examples
    self.vocab = CharVocab(DIGITS)

  def _lengths(self, split: str) -> tuple[int, int]:
    if split in ("train", "valid"):
      return self.min_length, self.max_length
    if split == "long":
      if self.long_max_length <= self.max_length:
        raise ValueError(f"the long split needs long_max_length > max_length, got {self.long_max_length} "
                         f"<= {self.max_length}")
      return self.max_length + 1, self.long_max_length
    raise ValueError(f"unknown split {split!r} of {self.kind!r}; allowed: {list(SPLITS)}")

  def _batch(self, rng: np.random.Generator, n: int, split: str, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    lo, hi = self._lengths(split)
    lengths = rng.integers(lo, hi + 1, size=n)[rows]  # every row's draws, then the rows asked for
    digits = rng.integers(3, 3 + len(DIGITS), size=(n, hi))[rows]  # ids of the digits
    inputs = [list(d[:k]) for d, k in zip(digits, lengths)]
    outputs = inputs if self.kind == "copy" else [r[::-1] for r in inputs]
    return {"inputs": pad_batch(inputs, hi), "targets": pad_batch(outputs, hi + 1, eos=True)}

  def train_rows(self, step: int) -> int:
    return self.batch_size

  def train_batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    return self._batch(np.random.default_rng([self.seed, 0, step]), self.batch_size, "train", rows)

  def eval_batches(self, split: str) -> Iterator[dict[str, np.ndarray]]:
    self._lengths(split)  # fail on an unknown split before yielding
    rng = np.random.default_rng([self.seed, 1, SPLITS.index(split)])
    examples = self._batch(rng, self.num_eval_examples, split)
    for start in range(0, self.num_eval_examples, self.eval_batch_size):
      batch = {k: v[start:start + self.eval_batch_size] for k, v in examples.items()}
      short = self.eval_batch_size - len(batch["inputs"])
      if short:  # all-PAD rows keep every batch the same shape
        batch = {k: np.pad(v, ((0, short), (0, 0))) for k, v in batch.items()}
      yield batch


def from_config(kind: str, config) -> SequenceTask:
  """Reads ``batch_size``, ``eval_batch_size``, ``seed``, ``min_length``, ``max_length``,
  ``long_max_length`` and ``num_eval_examples`` from the run config."""
  return SequenceTask(kind, batch_size=config.batch_size, min_length=config.min_length,
                      max_length=config.max_length, long_max_length=config.long_max_length,
                      num_eval_examples=config.num_eval_examples, eval_batch_size=config.eval_batch_size,
                      seed=config.seed)
