"""The arithmetic experiment: the invariances its bounds rest on, the attention-row measurement, the report.

The bag-of-characters bound holds because a Transformer whose encoder has no
position information computes a function of the multiset of input
characters; symmetric ALiBi computes a function of the input up to reversal.
These tests check both on tiny untrained models, exactly as the experiment's
report states them, and that the tests could fail (a scheme with positions
breaks each invariance).
"""

import itertools
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import arithmetic as experiment
from experiments import report
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


def _untrained_params(config):
  m = model_lib.Transformer(parse(config).model.replace(vocab_size=VOCAB.size))
  return m.init(jax.random.PRNGKey(0), jnp.ones((1, 7), jnp.int32), jnp.ones((1, 5), jnp.int32))["params"]


@pytest.mark.parametrize("scheme, zero", [("none", True), ("sinusoidal", False), ("shaw", False),
                                          ("alibi", False)])
def test_attention_rows_of_the_two_ones_are_equal_exactly_when_there_is_no_position(scheme, zero):
  config = arithmetic_config(f"pe={scheme}")
  config.model.d_model, config.model.d_ff = 32, 64
  weights = experiment.encoder_attention(config, _untrained_params(config), "12+1")
  assert weights.shape == (config.model.num_encoder_layers, config.model.num_heads, 4, 4)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  diff = experiment.row_difference(weights, 0, 3)
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


def _fake_workdir(root, name, seed, position, value, **options):
  """A finished run's records as the engine writes them: config.json and metrics.jsonl."""
  workdir = root / name / f"seed{seed}"
  workdir.mkdir(parents=True)
  config = {"dataset": "arithmetic", "arithmetic_config": "n10_addsub", "seed": seed,
            "model": {"position": position, "position_options": {"max_distance": 16, **options}}}
  (workdir / "config.json").write_text(json.dumps({"config": config}))
  records = [{"step": 10, "train/steps_per_sec": 2.0}, {"step": 10, "test/exact_match": value}]
  (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
  return workdir


def test_report_holds_each_group_to_its_ceiling(tmp_path):
  values = {("none", "none", ()): [0.2, 0.1], ("sinusoidal", "sinusoidal", ()): [0.995, 0.9],
            ("alibi", "alibi", ()): [0.3, 0.35], ("k=0", "shaw", (("max_distance", 0),)): [0.1, 0.12]}
  for (name, position, options), v in values.items():
    for seed, value in enumerate(v):
      _fake_workdir(tmp_path / "runs", name, seed, position, value, **dict(options))
  out = tmp_path / "report"
  groups = report.write_report([str(tmp_path / "runs" / "*" / "*")], str(out), metric="test/exact_match",
                               bound=("bag", "reversal"), target=0.99)
  bound = arithmetic.config_by_name("n10_addsub")
  ceilings = json.loads((out / "bounds.json").read_text())["bounds"]
  assert {g.label: g.cells["ceiling"] for g in groups} == {
      "pe=none": "bag", "pe=sinusoidal": None, "pe=alibi": "reversal", "pe=shaw, k=0": "bag"}
  text = (out / "table.md").read_text()
  assert f"bag: {ceilings['bag_all']:.4f} / {ceilings['bag_test']:.4f}" in text
  assert "| pe=sinusoidal | 2 | 10 | 0.9475 |" in text and "0.9950, 0.9000" in text  # per seed, by seed
  assert "- FAIL: pe=sinusoidal: every run >= 0.9900" in text  # a check that can fail, failing
  none_ok = max(0.2, 0.1) <= ceilings["bag_all"]
  assert f"- {'PASS' if none_ok else 'FAIL'}: pe=none: every run <= bag bound (all)" in text
  assert "permutation-equivariant" in text and f"`{bound.name}`" in text
  assert "| 0.1 |" in text and "train min per run" in text  # 10 steps at 2/s: 5 s = 0.1 min
  assert [g.cells["train_minutes"] for g in groups][0] == pytest.approx(5 / 60)
  saved = {g["variant"]: g["view"] for g in json.loads((out / "runs.json").read_text())}
  assert saved == {g.label: g.cells["ceiling"] for g in groups}  # the ceiling column records each group's view


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
  assert all(f"| pe={s} |" in first.stdout for s in ("shaw", "sinusoidal", "none")), first.stdout
  assert "bag: " in first.stdout and "permutation-equivariant" in first.stdout
  assert (tmp_path / "runs" / "report" / "plot.png").exists()
  again = run()  # finished runs are not trained again
  assert again.returncode == 0 and again.stderr.count("finished, skipped") == 3, again.stderr[-2000:]
  # The attention section reads each group's checkpoint: without position information the rows of the two "1"s
  # of "12+1" are equal in every layer and head.
  out = tmp_path / "attention"
  groups = report.write_report([str(tmp_path / "runs" / s) for s in ("none", "sinusoidal")], str(out),
                               metric="test/exact_match", attention=True)
  difference = {g.label: g.record["row_difference_12+1"] for g in groups}
  assert difference["pe=none"] == 0.0 and difference["pe=sinusoidal"] > 0.0, difference
  text = (out / "table.md").read_text()
  assert "## Attention maps" in text and "| pe=none | 0 | 0 | [attention_pe=none.png](attention_pe=none.png) |" in text
  assert (out / "attention_pe=sinusoidal.png").read_bytes().startswith(b"\x89PNG")
  saved = {g["variant"]: g["row_difference_12+1"] for g in json.loads((out / "runs.json").read_text())}
  assert saved == difference
