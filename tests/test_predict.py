"""rpr.predict: decoding through the model's cache with rpr.decode."""

import functools

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
  wide = np.asarray(run(method="beam", beam_size=3, alpha=0.6))
  assert wide.shape == (3, 6)
