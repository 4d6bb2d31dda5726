"""The arithmetic experiment: the invariances its bounds rest on, the attention-row measurement, the report.

The bag-of-characters bound holds because a Transformer whose encoder has no
position information computes a function of the multiset of input
characters; symmetric ALiBi computes a function of the input up to reversal.
These tests check both on tiny untrained models, exactly as the experiment's
report states them, and that the tests could fail (a scheme with positions
breaks each invariance).
"""

import importlib.util
import itertools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import arithmetic as experiment
from experiments import attention_maps
from experiments import compare
from rpr import data
from rpr import model as model_lib
from rpr.attention import positions
from rpr import run_config
from rpr.data import arithmetic
from rpr.data.task import CharVocab

ROOT = pathlib.Path(__file__).resolve().parents[1]
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


def _untrained_params(config):
  m = model_lib.Transformer(run_config.model_config(config, VOCAB.size))
  return m.init(jax.random.PRNGKey(0), jnp.ones((1, 7), jnp.int32), jnp.ones((1, 5), jnp.int32))["params"]


@pytest.mark.parametrize("scheme, zero", [("none", True), ("sinusoidal", False), ("shaw", False),
                                          ("alibi", False)])
def test_attention_rows_of_the_two_ones_are_equal_exactly_when_there_is_no_position(scheme, zero):
  config = compare.with_scheme(arithmetic_config(), scheme)
  config.model.d_model, config.model.d_ff = 32, 64
  weights = attention_maps.encoder_attention(config, _untrained_params(config), "12+1")
  assert weights.shape == (config.model.num_encoder_layers, config.model.num_heads, 4, 4)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  diff = attention_maps.row_difference(weights, 0, 3)
  assert (diff == 0.0) if zero else (diff > 1e-4), diff


def test_config_variants_and_registration():
  c = arithmetic_config("pe=shaw,k=4")
  assert (c.model.position, c.model.position_options.max_distance, c.dataset) == ("shaw", 4, "arithmetic")
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
  assert compare.with_scheme(c, "shaw").model.position == "shaw"


def _fake_runs():
  em = {"none": [0.004, 0.006, 0.005], "sinusoidal": [0.995, 0.993, 0.991], "alibi": [0.3, 0.35, 0.32]}
  return [{"scheme": s, "seed": k, "seconds": 100.0 + k,
           "metrics": {"test/exact_match": v[k], "test/accuracy": 0.5, "step": 10.0}}
          for k in range(3) for s, v in em.items()]


def test_report_writes_markdown_and_json(tmp_path):
  config = arithmetic_config()
  bounds = {"bag_all": 0.043, "bag_test": 0.63, "bag_fitted": 0.0085, "reversal_all": 0.61,
            "reversal_test": 0.998, "reversal_fitted": 0.03}
  diffs = {"none": {"row_difference_12+1": 0.0, "figure": "attention_none.png"},
           "sinusoidal": {"row_difference_12+1": 0.2, "figure": "attention_sinusoidal.png"}}
  md, js = experiment.write_report(str(tmp_path), command="python -m experiments.arithmetic --seeds=3",
                                   config=config, runs=_fake_runs(), bounds=bounds, attention_diffs=diffs,
                                   timings={"training": 900.0, "total": 960.0}, workers=2)
  text = pathlib.Path(md).read_text()
  assert "python -m experiments.arithmetic --seeds=3" in text
  assert "| sinusoidal | order | 99.30% ± 0.20% | 99.10% - 99.50% |" in text
  assert "bag: 4.30% / 63.00%" in text and "reversal: 61.00% / 99.80%" in text
  assert "| none | 0 |" in text and "permutation-equivariant" in text
  record = json.loads(pathlib.Path(js).read_text())
  assert record["summary"]["none"]["exact_match_max"] == 0.006
  assert record["checks"] == {"none: every seed <= bag bound (all) 4.30%": True,
                              "none: every seed <= bag bound (test) 63.00%": True,
                              "sinusoidal: every seed >= 99.00%": True,
                              "alibi: every seed <= reversal bound (all) 61.00%": True,
                              "alibi: every seed <= reversal bound (test) 99.80%": True}
  assert len(record["runs"]) == 9


def test_compare_positions_end_to_end_on_the_tiny_data_set(tmp_path, capsys):
  """What `python run.py` does, on 200 single-digit examples and a few steps (two trainings)."""
  config = arithmetic_config("quick")
  config.update(dict(arithmetic_config="n10_addsub", data_dir=str(tmp_path / "tfds"), batch_size=16,
                     eval_batch_size=20, num_train_steps=3, warmup_steps=1, log_every_steps=3))
  config.model.update(dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
  out = compare.compare_positions(config, str(tmp_path / "runs"), ("sinusoidal", "none"))
  assert set(out["runs"]) == {"sinusoidal", "none"}
  bag = out["bounds"]["bag_all"]
  assert 0 < bag < 1 and (tmp_path / "runs" / "bounds.json").exists()
  printed = capsys.readouterr().out
  assert "test/exact_match" in printed and f"{bag:.4f} over the whole data set" in printed
  # A finished run is not trained again.
  again = compare.train_run(compare.with_scheme(config, "none"), str(tmp_path / "runs" / "none"))
  assert again == out["runs"]["none"]


def test_training_span_is_first_start_to_last_end():
  runs = [{"finished": 1000.0, "seconds": 100.0}, {"finished": 1050.0, "seconds": 120.0},
          {"finished": 1300.0, "seconds": 200.0}]
  assert experiment.training_span(runs) == 1300.0 - 900.0
