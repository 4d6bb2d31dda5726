"""rpr.predict: decoding through the model's cache with rpr.decode."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from rpr import model as model_lib
from rpr import predict
from rpr.data.task import EOS, PAD


def test_beam_of_one_follows_the_greedy_path_and_outputs_look_like_targets():
  config = model_lib.preset("tiny", vocab_size=13, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1,
                            num_decoder_layers=1, dropout_rate=0.0)
  inputs = jnp.asarray(np.random.default_rng(0).integers(3, 13, size=(3, 5)), jnp.int32).at[2, 3:].set(PAD)
  params = model_lib.Transformer(config.replace(deterministic=True)).init(
      jax.random.PRNGKey(1), inputs, jnp.ones((3, 6), jnp.int32))["params"]
  run = lambda **kw: jax.jit(functools.partial(predict.predict, model_config=config, max_decode_len=6, **kw))(
      params, inputs)
  greedy = np.asarray(run(method="greedy"))
  beam = np.asarray(run(method="beam", beam_size=1, alpha=0.0))
  assert greedy.shape == (3, 6) and greedy.dtype == np.int32
  # A beam of one follows the greedy path; it may only finish earlier on it,
  # where EOS was the runner-up candidate and the shorter hypothesis scored higher.
  for g, b in zip(greedy, beam):
    if np.array_equal(g, b):
      continue
    s = int(np.flatnonzero(b == EOS)[0])
    np.testing.assert_array_equal(b[:s], g[:s])
    assert np.all(b[s + 1:] == PAD)
  for row in greedy:  # PAD only after an EOS
    hits = np.flatnonzero(row == EOS)
    if hits.size:
      assert np.all(row[hits[0] + 1:] == PAD)
    else:
      assert np.all(row != PAD)


def test_a_beam_that_holds_every_hypothesis_returns_the_best_by_brute_force():
  # Vocabulary PAD, BOS, EOS and two words; 3 tokens. With 8 beams every prefix stays alive (2, then 4) and
  # all 12 extensions of the last step fit in the 2 x 8 kept, so the search is exhaustive: its answer must
  # be the best of the 2 + 4 + 8 sequences that end in EOS, scored by the teacher-forced full pass.
  config = model_lib.preset("tiny", vocab_size=5, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                            num_decoder_layers=1, dropout_rate=0.0)
  rng = np.random.default_rng(11)  # parameters where the greedy path misses the best (checked below)
  inputs = jnp.asarray(rng.integers(3, 5, size=(8, 4)), jnp.int32)
  net = model_lib.Transformer(config.replace(deterministic=True))
  shapes = jax.eval_shape(net.init, jax.random.PRNGKey(0), inputs, jnp.ones((8, 3), jnp.int32))["params"]
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), shapes)  # peaked, varied
  alpha = 0.6
  got = np.asarray(predict.predict(params, inputs, model_config=config, max_decode_len=3, method="beam",
                                   beam_size=8, alpha=alpha))
  candidates = [list(words) + [EOS] + [PAD] * (2 - len(words))
                for n in range(3) for words in itertools.product((3, 4), repeat=n)]
  b, c = inputs.shape[0], len(candidates)
  logits = jax.jit(lambda x, y: net.apply({"params": params}, x, y))(
      jnp.repeat(inputs, c, 0), jnp.tile(jnp.asarray(candidates, jnp.int32), (b, 1)))
  logp = np.asarray(jax.nn.log_softmax(logits)).reshape(b, c, 3, -1)
  misses = 0
  for row in range(b):
    greedy = []  # each token the most likely after the previous ones, read from the candidates' logits
    while len(greedy) < 3 and EOS not in greedy:
      i = next(i for i, seq in enumerate(candidates) if seq[:len(greedy)] == greedy)
      greedy.append(max((EOS, 3, 4), key=lambda tok: logp[row, i, len(greedy), tok]))
    scores = [sum(logp[row, i, t, tok] for t, tok in enumerate(seq[:seq.index(EOS) + 1]))
              / ((5 + seq.index(EOS) + 1) / 6) ** alpha for i, seq in enumerate(candidates)]
    ranked = np.argsort(scores)[::-1]
    assert scores[ranked[0]] - scores[ranked[1]] > 1e-4  # no near tie, so the comparison is meaningful
    assert got[row].tolist() == candidates[ranked[0]], (row, got[row], candidates[ranked[0]], scores)
    misses += greedy + [PAD] * (3 - len(greedy)) != candidates[ranked[0]]
  assert misses  # the check can fail: the greedy path is not the best on every row

