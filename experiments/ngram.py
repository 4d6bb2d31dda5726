"""A count-based n-gram language model with interpolated Kneser-Ney smoothing, over integer tokens.

The language models' baseline (``experiments/baselines.py``). Interpolated
Kneser-Ney as Chen and Goodman (1999) state it, one absolute discount per
order, ``D = n1 / (n1 + 2 n2)`` from that order's count-of-counts:

    P_n(w | h) = (max(c_n(h w) - D_n, 0) + D_n T_n(h) P_{n-1}(w | h')) / c_n(h .)

where ``h'`` drops the oldest token of ``h``, ``c_n`` is the raw count at the
highest order and the continuation count ``|{x : c(x h w) > 0}|`` below it,
``c_n(h .) = sum_w c_n(h w)``, ``T_n(h) = |{w : c_n(h w) > 0}|``; a context
never seen (``c_n(h .) = 0``) passes its whole mass down; ``P_0`` is uniform
over the ``vocab`` tokens. Each document is padded on the left with
``order - 1`` BOS tokens, so every real token has a full context.

Scored as the trained language models are (``rpr.data.lm``): each held-out
document with its EOS, cut into the same non-overlapping windows, each window
read from BOS (here: ``order - 1`` of them) with no context from the window
before it; perplexity is exp of the mean negative log-likelihood per token.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable, Sequence


class KneserNey:
  """Interpolated Kneser-Ney of ``order`` over ``documents`` (sequences of token ids)."""

  def __init__(self, order: int, documents: Iterable[Sequence[int]], vocab: Sequence[int], bos: int):
    if order < 1:
      raise ValueError(f"order = {order} is not allowed; allowed: an int >= 1")
    self.order, self.bos, self.vocab = order, bos, tuple(vocab)
    top = collections.Counter()
    for doc in documents:
      seq = (bos,) * (order - 1) + tuple(int(t) for t in doc)
      top.update(zip(*(seq[i:] for i in range(order))))
    # counts[n]: n-gram -> count at order n (raw at the top, continuation below).
    self.counts = {order: top}
    for n in range(order - 1, 0, -1):
      self.counts[n] = collections.Counter(gram[1:] for gram in self.counts[n + 1])
    self.discount, self.context_total, self.context_types = {}, {}, {}
    for n, counts in self.counts.items():
      of = collections.Counter(v for v in counts.values() if v <= 2)
      self.discount[n] = of[1] / (of[1] + 2 * of[2]) if of[1] + of[2] else 0.5
      total, types = collections.Counter(), collections.Counter()
      for gram, c in counts.items():
        total[gram[:-1]] += c
        types[gram[:-1]] += 1
      self.context_total[n], self.context_types[n] = total, types

  def prob(self, word: int, context: Sequence[int]) -> float:
    """P(word | the last ``order - 1`` tokens of ``context``)."""
    p = 1.0 / len(self.vocab)
    history = tuple(context)[len(context) - (self.order - 1):] if self.order > 1 else ()
    for n in range(1, self.order + 1):
      h = history[len(history) - (n - 1):] if n > 1 else ()
      total = self.context_total[n].get(h, 0)
      if total:
        d = self.discount[n]
        p = (max(self.counts[n].get(h + (word,), 0) - d, 0.0) + d * self.context_types[n][h] * p) / total
    return p

  def nll(self, window: Sequence[int]) -> float:
    """Summed negative log-likelihood (nats) of a window's tokens, read from BOS padding."""
    seq = (self.bos,) * (self.order - 1) + tuple(int(t) for t in window)
    return -sum(math.log(self.prob(seq[i], seq[i - self.order + 1:i] if self.order > 1 else ()))
                for i in range(self.order - 1, len(seq)))


def perplexity(model: KneserNey, documents: Sequence[Sequence[int]], window: int) -> tuple[float, int]:
  """(perplexity, tokens) of ``documents`` cut into non-overlapping windows of ``window`` tokens."""
  nll, tokens = 0.0, 0
  for doc in documents:
    for start in range(0, len(doc), window):
      piece = doc[start:start + window]
      nll += model.nll(piece)
      tokens += len(piece)
  return math.exp(nll / tokens), tokens
