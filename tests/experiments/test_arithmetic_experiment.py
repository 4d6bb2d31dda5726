"""The arithmetic experiment: the invariances its bounds rest on, the attention rows, and ``python run.py``.

The bag-of-characters bound holds because a Transformer whose encoder has no
position information computes a function of the multiset of input
characters; symmetric ALiBi computes a function of the input up to reversal.
These tests check both on tiny untrained models, exactly as the experiment's
README states them, and that the tests could fail (a scheme with positions
breaks each invariance).
"""

import itertools
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import data
from rpr import model as model_lib
from rpr.data import arithmetic
from rpr.data.task import CharVocab
from tests.test_train import parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = CharVocab(arithmetic.VOCAB_CHARS)
LENGTH = 8  # padded input length: pads are part of what the invariance must survive


def arithmetic_config(variant=""):
  from configs import arithmetic as module

  return module.get_config(variant)


def _encode(texts):
  ids = np.zeros((len(texts), LENGTH), np.int32)
  for n, t in enumerate(texts):
    ids[n, :len(t)] = VOCAB.encode(t)
  return jnp.asarray(ids)


def _logits(position: str, texts, **position_options):
  """Teacher-forced logits of a tiny untrained model for the same target after each input; ``[n, L_out, V]``."""
  config = model_lib.preset(
      "tiny", vocab_size=VOCAB.size, position=position, dropout_rate=0.0, position_options=position_options,
      deterministic=True)
  model = model_lib.Transformer(config)
  inputs = _encode(texts)
  targets = jnp.asarray(np.tile(np.array([VOCAB.encode("232") + [2]], np.int32), (len(texts), 1)))
  params = model.init(jax.random.PRNGKey(0), inputs[:1], targets[:1])["params"]
  return np.asarray(jax.jit(model.apply)({"params": params}, inputs, targets))


def _permutations(text):
  return sorted({"".join(p) for p in itertools.permutations(text)})


def test_without_positions_every_permutation_of_the_input_gives_the_same_logits():
  texts = _permutations("21+211")  # 60 distinct orders of one multiset
  logits = _logits("none", texts)
  np.testing.assert_allclose(logits, np.broadcast_to(logits[:1], logits.shape), rtol=0, atol=1e-5)
  assert np.ptp(logits) > 0.1  # the logits themselves are not trivial
  # The test can fail: with an absolute encoding the orders are told apart.
  with_positions = _logits("sinusoidal", texts)
  assert np.max(np.abs(with_positions - with_positions[:1])) > 1e-3


def test_symmetric_alibi_cannot_tell_an_input_from_its_reverse_but_directional_alibi_can():
  texts = ["12+1", "1+21", "21+1"]  # an input, its reverse, another order
  sym = _logits("alibi", texts)
  np.testing.assert_allclose(sym[1], sym[0], rtol=0, atol=1e-5)
  assert np.max(np.abs(sym[2] - sym[0])) > 1e-3  # distances do tell other orders apart
  directional = _logits("alibi_directional", texts)
  assert np.max(np.abs(directional[1] - directional[0])) > 1e-3


def _encoder_attention(config, params, text: str) -> np.ndarray:
  """Encoder self-attention weights ``[layers, heads, len(text), len(text)]`` of one right-padded input."""
  model = model_lib.Transformer(parse(config).model.replace(vocab_size=VOCAB.size, deterministic=True))
  ids = np.zeros((1, max(arithmetic.config_by_name(config.arithmetic_config).max_input_length, len(text))), np.int32)
  ids[0, :len(text)] = VOCAB.encode(text)
  _, state = model.apply({"params": params}, jnp.asarray(ids), method=type(model).encode, mutable=["intermediates"])
  enc = state["intermediates"]["encoder"]
  layers = sorted((k for k in enc if k.startswith("layer_")), key=lambda k: int(k.split("_")[1]))
  weights = np.stack([np.asarray(enc[k]["self_attention"]["attention_weights"][0])[0] for k in layers])
  return weights[:, :, :len(text), :len(text)]


def _untrained_params(config):
  m = model_lib.Transformer(parse(config).model.replace(vocab_size=VOCAB.size))
  return m.init(jax.random.PRNGKey(0), jnp.ones((1, 7), jnp.int32), jnp.ones((1, 5), jnp.int32))["params"]


@pytest.mark.parametrize("scheme, zero", [("none", True), ("sinusoidal", False), ("shaw", False),
                                          ("alibi", False)])
def test_attention_rows_of_the_two_ones_are_equal_exactly_when_there_is_no_position(scheme, zero):
  config = arithmetic_config(f"pe={scheme}")
  config.model.d_model, config.model.d_ff = 32, 64
  weights = _encoder_attention(config, _untrained_params(config), "12+1")
  assert weights.shape == (config.model.num_encoder_layers, config.model.num_heads, 4, 4)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  diff = float(np.max(np.abs(weights[:, :, 0, :] - weights[:, :, 3, :])))  # the two "1"s of "12+1"
  assert (diff == 0.0) if zero else (diff > 1e-4), diff


def test_config_variants_and_registration():
  c = arithmetic_config("pe=shaw,k=4")
  assert (c.model.position, c.model.shaw.max_distance, c.dataset) == ("shaw", 4, "arithmetic")
  c = arithmetic_config("pe=alibi,directional=1,seed=2")
  assert (c.model.position, c.seed) == ("alibi_directional", 2)
  assert arithmetic_config("quick").num_train_steps == 3000
  for bad, match in (("pe=fourier", r"pe='fourier' is not allowed; allowed: one of \['alibi'"),
                     ("pe=alibi,directional=yes", r"directional='yes' is not allowed"),
                     ("pe=rope,k=3", r"k= is Shaw's clipping distance; pe=rope has none"),
                     ("pe=rope,directional=1", r"directional=1 is ALiBi's"),
                     ("pe=shaw,pe=rope", r"unknown or repeated word 'pe=rope'")):
    with pytest.raises(ValueError, match=match):
      arithmetic_config(bad)
  assert data.entry("arithmetic").splits == ("test",)


@pytest.mark.slow
def test_run_py_default_compares_three_schemes_end_to_end(tmp_path):
  """`python run.py` itself, on 200 single-digit examples and 3 steps: three trainings, then the report."""
  flags = [f"--workdir={tmp_path / 'runs'}", "--config.arithmetic_config=n10_addsub",
           f"--config.data_dir={tmp_path / 'tfds'}", "--config.batch_size=16", "--config.eval_batch_size=20",
           "--config.num_train_steps=3", "--config.warmup_steps=1", "--config.log_every_steps=3",
           "--config.model.d_model=16", "--config.model.num_heads=2", "--config.model.d_ff=32",
           "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
           "--config.tensorboard=False"]  # events: test_train.py's run.py test
  run = lambda: subprocess.run([sys.executable, "run.py", *flags], cwd=ROOT, capture_output=True, text=True,
                               env={**os.environ, "JAX_PLATFORMS": "cpu"})
  first = run()
  assert first.returncode == 0, first.stderr[-2000:]
  assert all(f"| `{s}` |" in first.stdout for s in ("shaw", "sinusoidal", "none")), first.stdout
  assert "| bound without order: bag of characters (whole set) | 0." in first.stdout  # the baseline's own row
  assert (tmp_path / "runs" / "report" / "plot.png").exists() and (tmp_path / "runs" / "report" / "table.md").exists()
  again = run()  # finished runs are not trained again
  assert again.returncode == 0 and again.stderr.count("finished, skipped") == 3, again.stderr[-2000:]
