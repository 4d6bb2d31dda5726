"""What the engine needs from a data set: a vocabulary and batches addressed by step.

A batch is a dict of int32 numpy arrays ``inputs [batch, in_length]`` and
``targets [batch, out_length]``; ``targets`` hold the answer followed by EOS
and padding (id 0). The decoder input is ``targets`` shifted right with BOS
(the model does that). ``train_batch(step)`` is a pure function of the task's
seed and ``step``, so a run resumed at step ``s`` sees exactly the batches a
straight run would have seen; ``train_batch(step, rows)`` is that batch's
``rows``, whichever process asks.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

import numpy as np

from rpr import tokens
from rpr.tokens import BOS, EOS, PAD  # noqa: F401  (re-exported: the ids every vocabulary reserves)


class Vocab(Protocol):
  size: int
  pad_id: int
  bos_id: int
  eos_id: int

  def encode(self, text: str) -> list[int]:
    """Text to ids, without BOS/EOS."""

  def decode(self, ids: Sequence[int]) -> str:
    """Ids to text; stops at EOS, skips PAD and BOS."""


class Task(Protocol):
  """A data set. Text tasks (``is_text``) also have ``references(split) -> list[str]``: the raw
  reference texts, one per real row of ``eval_batches(split)`` in that order, which BLEU is scored on."""

  vocab: Vocab
  is_text: bool  # evaluate BLEU (natural language) in addition to exact match; needs references(split)
  is_lm: bool  # optional (default False): decoder-only windows, inputs [b, 0]; see rpr.data.lm

  def train_rows(self, step: int) -> int:
    """The number of rows of the training batch of ``step`` (global, across all devices), without building it."""

  def train_batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """Rows ``rows`` of the training batch of ``step`` (global, across all devices), building no other row:
    each process of a multi-process run builds the rows of its own devices only (``rpr.sharding.host_batch``)."""

  def eval_batches(self, split: str) -> Iterator[dict[str, np.ndarray]]:
    """Every example of ``split`` once, in fixed order; the last batch may be padded with all-PAD rows."""


class CharVocab:
  """Character vocabulary: PAD=0, BOS=1, EOS=2, then one id per character."""

  def __init__(self, chars: str):
    if len(set(chars)) != len(chars):
      raise ValueError(f"CharVocab characters must be unique, got {chars!r}")
    self.chars = chars
    self.pad_id, self.bos_id, self.eos_id = PAD, BOS, EOS
    self.size = 3 + len(chars)
    self._ids = {c: i + 3 for i, c in enumerate(chars)}

  def encode(self, text: str) -> list[int]:
    try:
      return [self._ids[c] for c in text]
    except KeyError as e:
      raise ValueError(f"character {e.args[0]!r} is not in the vocabulary {self.chars!r}") from None

  def decode(self, ids: Sequence[int]) -> str:
    return "".join(self.chars[i - 3] for i in tokens.content(ids))


def pad_batch(rows: Sequence[Sequence[int]], length: int, eos: bool = False) -> np.ndarray:
  """Right-pads id lists to ``[len(rows), length]`` (appending EOS first if asked)."""
  out = np.zeros((len(rows), length), np.int32)
  for n, r in enumerate(rows):
    r = list(r) + ([EOS] if eos else [])
    if len(r) > length:
      raise ValueError(f"sequence of length {len(r)} does not fit the padded length {length}")
    out[n, : len(r)] = r
  return out
