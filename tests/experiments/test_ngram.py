"""The Kneser-Ney baseline: a distribution at every context and order, equal to the formula computed by brute force."""

import itertools
import math

import numpy as np
import pytest

from experiments import ngram

BOS = 1
VOCAB = list(range(2, 8))


def corpus(seed=0, docs=5):
  rng = np.random.default_rng(seed)
  # Some structure, so that higher orders have repeated contexts: a biased walk over VOCAB.
  out = []
  for _ in range(docs):
    doc, t = [], int(rng.choice(VOCAB))
    for _ in range(int(rng.integers(5, 30))):
      t = VOCAB[(VOCAB.index(t) + int(rng.choice([1, 1, 2, -1]))) % len(VOCAB)]
      doc.append(t)
    out.append(doc)
  return out


def brute_force(order, documents, word, history):
  """The interpolated Kneser-Ney formula of experiments/ngram.py's docstring, from scanning the padded text."""
  padded = [[BOS] * (order - 1) + d for d in documents]
  positions = [(p, i) for p in padded for i in range(order - 1, len(p))]  # every real token

  def grams(n):  # every n-gram ending at a real token, with repeats
    return [tuple(p[i - n + 1:i + 1]) for p, i in positions]

  def count(n, gram):  # raw at the top order, continuation below
    if n == order:
      return grams(n).count(gram)
    return len({g[0] for g in set(grams(n + 1)) if g[1:] == gram})

  def discount(n):
    values = ([grams(n).count(g) for g in set(grams(n))] if n == order
              else [count(n, g) for g in {g[1:] for g in set(grams(n + 1))}])
    n1, n2 = values.count(1), values.count(2)
    return n1 / (n1 + 2 * n2) if n1 + n2 else 0.5

  def p(n, h):
    if n == 0:
      return 1 / len(VOCAB)
    total = sum(count(n, h + (w,)) for w in VOCAB + [BOS])
    if total == 0:
      return p(n - 1, h[1:])
    types = sum(count(n, h + (w,)) > 0 for w in VOCAB + [BOS])
    d = discount(n)
    return (max(count(n, h + (word,)) - d, 0) + d * types * p(n - 1, h[1:])) / total

  return p(order, tuple(history[len(history) - order + 1:]) if order > 1 else ())


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_context_gives_a_distribution_over_the_vocabulary(order):
  model = ngram.KneserNey(order, corpus(), VOCAB, BOS)
  contexts = list(itertools.product([BOS] + VOCAB, repeat=max(order - 1, 0)))
  for h in contexts[::7] + [(BOS,) * (order - 1), tuple(VOCAB[:order - 1])]:
    total = sum(model.prob(w, h) for w in VOCAB)
    assert math.isclose(total, 1.0, rel_tol=1e-12), (h, total)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_probabilities_equal_the_formula_by_brute_force(order):
  docs = corpus(seed=1, docs=3)
  model = ngram.KneserNey(order, docs, VOCAB, BOS)
  seen = [tuple(([BOS] * (order - 1) + docs[0])[i:i + order - 1]) for i in range(4)]
  unseen = [(7,) * (order - 1), (BOS,) + (7,) * (order - 2)] if order > 1 else []
  for h, w in itertools.product(seen + unseen, VOCAB):
    assert math.isclose(model.prob(w, h), brute_force(order, docs, w, h), rel_tol=1e-12), (h, w)


def test_perplexity_scores_every_token_once_and_windows_restart_from_bos():
  docs = corpus(seed=2, docs=4)
  model = ngram.KneserNey(3, docs[:3], VOCAB, BOS)
  held_out = [np.asarray(d) for d in corpus(seed=3, docs=2)]
  whole, n = ngram.perplexity(model, held_out, window=1000)
  assert n == sum(len(d) for d in held_out)
  nll = sum(model.nll(d) for d in held_out)
  assert math.isclose(whole, math.exp(nll / n), rel_tol=1e-12)
  windowed, m = ngram.perplexity(model, held_out, window=4)
  assert m == n and windowed != whole  # context lost at every window start
  with pytest.raises(ValueError, match="order = 0 is not allowed"):
    ngram.KneserNey(0, docs, VOCAB, BOS)
