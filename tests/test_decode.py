"""Greedy and beam search on toy ``tokens_to_logits`` tables whose answers are known."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import decode
from rpr.tokens import BOS, EOS, PAD

A, B, C = 3, 4, 5
V = 6


def second_order_table() -> np.ndarray:
  """``logits[row, prev, cur, next]``: a Markov chain of order two, one per batch row.

  Row 0 is a trap for greedy search: A is the likeliest first token, but
  every continuation of A is poor, while B C EOS has probability 0.36.
  ``prev`` matters (C after A differs from C after B), so a beam search that
  reorders its cache wrongly finds other scores. Row 1 is easy: C EOS.
  """
  p = np.zeros((2, V, V, V))
  p[:, :, :] = np.eye(V)[EOS]  # unlisted contexts end at once
  p[0, PAD, BOS] = 0, 0, 0, .5, .4, .1  # first token: A .5, B .4, C .1
  p[0, BOS, A] = 0, 0, .3, 0, .3, .4  # A -> C .4 (greedy), B .3, EOS .3
  p[0, BOS, B] = 0, 0, .1, 0, 0, .9  # B -> C .9
  p[0, A, C] = 0, 0, .6, .4, 0, 0  # A C -> EOS .6
  p[0, B, C] = 0, 0, 1., 0, 0, 0  # B C -> EOS 1
  p[1, PAD, BOS] = 0, 0, .05, .05, 0, .9
  return np.log(p + 1e-9)


def toy_model(table: np.ndarray, batch_size: int, beams: int = 1):
  """``tokens_to_logits`` over ``table`` with cache ``{prev [n], row [n], step []}``."""
  table = jnp.asarray(table, jnp.float32)

  def tokens_to_logits(ids, cache):
    cur = ids[:, 0]
    logits = table[cache["row"], cache["prev"], cur]
    return logits, {"prev": cur, "row": cache["row"], "step": cache["step"] + 1}

  cache = {"prev": jnp.full((batch_size,), PAD, jnp.int32), "row": jnp.arange(batch_size, dtype=jnp.int32),
           "step": jnp.array(0, jnp.int32)}
  return tokens_to_logits, cache


def path_logp(table: np.ndarray, row: int, tokens) -> float:
  """Sum of the log-softmax along ``tokens`` (starting from BOS with prev PAD)."""
  prev, cur, total = PAD, BOS, 0.0
  for t in tokens:
    logits = table[row, prev, cur]
    total += logits[t] - np.log(np.exp(logits).sum())
    prev, cur = cur, t
  return total


def lp(n, alpha):
  return ((5 + n) / 6) ** alpha


def test_length_penalty_formula():
  assert float(decode.length_penalty(1, 0.6)) == pytest.approx(1.0)
  assert float(decode.length_penalty(7, 0.0)) == pytest.approx(1.0)
  assert float(decode.length_penalty(10, 0.6)) == pytest.approx((15 / 6) ** 0.6)
  assert float(decode.length_penalty(3, 2.0)) == pytest.approx((8 / 6) ** 2)


def test_greedy_falls_for_the_trap_and_pads_after_eos():
  table = second_order_table()
  fn, cache = toy_model(table, 2)
  seqs, logp = jax.jit(lambda c: decode.greedy_search(fn, c, 2, 5))(cache)
  np.testing.assert_array_equal(seqs, [[A, C, EOS, PAD, PAD], [C, EOS, PAD, PAD, PAD]])
  np.testing.assert_allclose(logp, [path_logp(table, 0, [A, C, EOS]), path_logp(table, 1, [C, EOS])], rtol=1e-5)
  assert float(logp[0]) == pytest.approx(math.log(.5 * .4 * .6), abs=1e-4)


def test_greedy_equals_argmax_loop():
  rng = np.random.default_rng(0)
  table = rng.normal(size=(V, V)) * 3  # first order: next token from the current one
  table[:, EOS] -= 2  # long enough sequences to exercise max_decode_len too
  t = jnp.asarray(table, jnp.float32)
  fn = lambda ids, cache: (t[ids[:, 0]], cache)
  seqs, _ = decode.greedy_search(fn, (), 1, 8)
  want, cur = [], BOS
  writable = np.where(np.isin(np.arange(V), [PAD, BOS]), -np.inf, 0.0)  # never PAD or BOS
  for _ in range(8):
    cur = int(np.argmax(table[cur] + writable))
    want.append(cur)
    if cur == EOS:
      break
  np.testing.assert_array_equal(seqs[0], want + [PAD] * (8 - len(want)))


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_finds_the_best_sequence(alpha):
  table = second_order_table()
  fn, cache = toy_model(table, 2)
  seqs, scores = jax.jit(lambda c: decode.beam_search(fn, c, 2, 5, beam_size=4, alpha=alpha))(cache)
  np.testing.assert_array_equal(seqs, [[B, C, EOS, PAD, PAD], [C, EOS, PAD, PAD, PAD]])
  want = [path_logp(table, 0, [B, C, EOS]) / lp(3, alpha), path_logp(table, 1, [C, EOS]) / lp(2, alpha)]
  np.testing.assert_allclose(scores, want, rtol=1e-5)
  assert float(scores[0]) == pytest.approx(math.log(.4 * .9) / lp(3, alpha), abs=1e-4)


def test_beam_return_all_is_sorted_and_scored():
  table = second_order_table()
  fn, cache = toy_model(table, 2)
  seqs, scores = decode.beam_search(fn, cache, 2, 5, beam_size=4, alpha=0.6, return_all=True)
  assert seqs.shape == (2, 4, 5) and scores.shape == (2, 4)
  assert np.all(np.diff(np.asarray(scores), axis=1) <= 0)
  for k in range(4):  # every returned beam carries its own score
    toks = [int(t) for t in seqs[0, k] if t != PAD]
    assert toks[-1] == EOS
    assert float(scores[0, k]) == pytest.approx(path_logp(table, 0, toks) / lp(len(toks), 0.6), abs=1e-4)


def test_wide_beam_equals_exhaustive_search():
  # With more beams than hypotheses nothing is pruned, so beam search must
  # return the best EOS-terminated sequence of an exhaustive enumeration.
  rng = np.random.default_rng(1)
  v, n, alpha = 5, 3, 0.6
  table = rng.normal(size=(v, v)) * 2
  t = jnp.asarray(table, jnp.float32)
  fn = lambda ids, cache: (t[ids[:, 0]], cache)
  seqs, scores = decode.beam_search(fn, (), 1, n, beam_size=v ** n, alpha=alpha)
  logsm = table - np.log(np.exp(table).sum(-1, keepdims=True))
  best, best_score = None, -np.inf
  for length in range(1, n + 1):
    for body in itertools.product(*[[x for x in range(v) if x != EOS]] * (length - 1)):
      toks = list(body) + [EOS]
      score = sum(logsm[a, b] for a, b in zip([BOS] + toks[:-1], toks)) / lp(length, alpha)
      if score > best_score:
        best, best_score = toks, score
  np.testing.assert_array_equal(seqs[0], best + [PAD] * (n - len(best)))
  assert float(scores[0]) == pytest.approx(best_score, abs=1e-4)


def test_length_penalty_changes_the_winner():
  # BOS -> EOS (p .5) or X (p .5); X -> EOS (p .9). Short: log .5 / lp(1);
  # long: log .45 / lp(2). The long one wins once (7/6)^alpha > log .45 / log .5.
  p = np.full((V, V), 1e-9)
  p[BOS, EOS], p[BOS, A], p[A, EOS], p[A, B] = .5, .5, .9, .1
  t = jnp.asarray(np.log(p), jnp.float32)
  fn = lambda ids, cache: (t[ids[:, 0]], cache)
  crossover = math.log(math.log(.45) / math.log(.5)) / math.log(7 / 6)
  for alpha, want in ((0.0, [EOS, PAD, PAD]), (0.6, [EOS, PAD, PAD]), (crossover + 0.1, [A, EOS, PAD]),
                      (2.0, [A, EOS, PAD])):
    seqs, score = decode.beam_search(fn, (), 1, 3, beam_size=2, alpha=alpha)
    np.testing.assert_array_equal(seqs[0], want)
    want_score = math.log(.5) if want[0] == EOS else math.log(.45) / lp(2, alpha)
    assert float(score[0]) == pytest.approx(want_score, abs=1e-4)


def test_no_eos_returns_alive_hypotheses():
  logits = np.full((V, V), -np.inf)
  logits[:, A] = 0.0  # never ends: EOS is impossible
  t = jnp.asarray(logits, jnp.float32)
  fn = lambda ids, cache: (t[ids[:, 0]], cache)
  seqs, score = decode.beam_search(fn, (), 1, 4, beam_size=2, alpha=0.6)
  np.testing.assert_array_equal(seqs[0], [A] * 4)
  assert float(score[0]) == pytest.approx(0.0, abs=1e-4)


def test_cache_leaves_are_tiled_and_gathered_per_example():
  cache = {"x": jnp.arange(6).reshape(2, 3), "index": jnp.array(7)}
  tiled = decode.tile_beams(cache, 2)
  np.testing.assert_array_equal(tiled["x"], [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])
  assert tiled["index"].shape == ()
  picked = decode.gather_beams({"x": jnp.arange(4), "index": jnp.array(7)}, jnp.array([[1, 1], [1, 0]]), 2, 2)
  np.testing.assert_array_equal(picked["x"], [1, 1, 3, 2])
  assert int(picked["index"]) == 7


@pytest.mark.parametrize("kw, match", [(dict(beam_size=0), "beam_size"), (dict(alpha=-1.0), "alpha")])
def test_bad_arguments_raise(kw, match):
  fn = lambda ids, cache: (jnp.zeros((ids.shape[0], V)), cache)
  with pytest.raises(ValueError, match=match):
    decode.beam_search(fn, (), 1, 3, **kw)
  with pytest.raises(ValueError, match="max_decode_len"):
    decode.greedy_search(fn, (), 1, 0)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_search_never_writes_pad_or_bos(method):
  # A model that prefers PAD, then BOS, then EOS: the search must write EOS (and PAD only after it).
  logits = np.full((V,), -5.0, np.float32)
  logits[PAD], logits[BOS], logits[EOS] = 9.0, 8.0, 1.0
  fn = lambda ids, cache: (jnp.broadcast_to(jnp.asarray(logits), (ids.shape[0], V)), cache)
  if method == "greedy":
    seqs, _ = decode.greedy_search(fn, (), 2, 4)
  else:
    seqs, _ = decode.beam_search(fn, (), 2, 4, beam_size=3)
  np.testing.assert_array_equal(np.asarray(seqs), [[EOS, PAD, PAD, PAD]] * 2)
