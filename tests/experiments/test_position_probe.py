"""experiments.position_probe: it reads the blocks' own outputs, and its probe finds position where there is some."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import app

from experiments import position_probe
from rpr import data
from rpr import model as model_lib
from rpr import train
from tests.test_train import FAST, tiny_config
from tests.test_train import train_run, parse


def _config(position: str, **options):
  return tiny_config(**dict(FAST, model=dict(FAST["model"], position=position, shaw=dict(max_distance=4, **options))))


def _probe_config(position: str, **options):
  """Enough tokens (512 strings of 4-12 digits) that an in-sample fit of 33 weights says what it would out of sample."""
  config = _config(position, **options)
  config.min_length, config.max_length, config.long_max_length, config.num_eval_examples = 4, 12, 14, 512
  return config


def test_the_states_are_the_blocks_outputs_and_the_cross_weights_are_distributions():
  config = _config("shaw")
  task = data.get_task(config)
  model = model_lib.build(parse(config).model.replace(vocab_size=task.vocab.size).replace(deterministic=True))
  batch = next(iter(task.eval_batches("valid")))
  x, y = jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"])
  params = model.init(jax.random.PRNGKey(0), x, y)["params"]
  states, cross = position_probe.layer_states(model)(params, batch["inputs"], batch["targets"])
  assert sorted(states) == ["decoder/layer_0", "encoder/layer_0"] and sorted(cross) == ["decoder/layer_0"]
  encoded = model.apply({"params": params}, x, method=model_lib.Transformer.encode)
  np.testing.assert_allclose(states["encoder/layer_0"], encoded, atol=1e-6)  # the last encoder block's output
  # Post-LN with shared embeddings: the logits are the last decoder block's output against the embedding.
  logits = model.apply({"params": params}, x, y)
  embedding = np.asarray(params["shared_embedding"]["embedding"])
  np.testing.assert_allclose(states["decoder/layer_0"] @ embedding.T, logits, atol=1e-4)
  w = cross["decoder/layer_0"]
  assert w.shape == (x.shape[0], 2, y.shape[1], x.shape[1])
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
  assert np.all(np.where(np.asarray(x == 0)[:, None, None, :], w, 0.0) == 0.0)  # no weight on a PAD source


def test_the_ridge_probe_recovers_a_linear_target_and_not_noise():
  rng = np.random.default_rng(0)
  x_fit, x_score = rng.normal(size=(2000, 8)), rng.normal(size=(2000, 8))
  w = rng.normal(size=8)
  predict = position_probe.fit(x_fit, x_fit @ w + 3.0)
  r2, mae = position_probe.score(predict(x_score), x_score @ w + 3.0)
  assert r2 > 0.999 and mae < 0.05
  predict = position_probe.fit(x_fit, rng.normal(size=2000))
  r2, _ = position_probe.score(predict(x_score), rng.normal(size=2000))
  assert r2 < 0.02


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
  """Probes of two short copy runs: no position term, and Shaw's a^V only."""
  out = {}
  for name, config in (("none", _probe_config("none")), ("av", _probe_config("shaw", use_keys=False))):
    workdir = str(tmp_path_factory.mktemp(name))
    train_run(config, workdir)
    out[name] = position_probe.probe(workdir, "valid", "valid")  # in-sample: the copy task has one short split
    out[name]["workdir"] = workdir
  return out


def test_runs_are_named_by_what_tells_them_apart_and_plotted_beside_their_score(probes, tmp_path):
  workdirs = [probes["none"]["workdir"], probes["av"]["workdir"]]
  names, runs = position_probe.run_names(workdirs)
  assert [names[w] for w in workdirs] == ["none, seed 0", "shaw, k=4, a^V only, seed 0"]
  assert sorted(runs) == sorted(workdirs)
  path = tmp_path / "probe.png"
  position_probe.plot({w: probes[n] for n, w in zip(("none", "av"), workdirs)}, names, dict.fromkeys(workdirs, 0.5),
                      "valid/exact_match", str(path))
  assert path.stat().st_size > 1000
  with pytest.raises(app.UsageError, match="no metrics.jsonl in"):
    position_probe.run_names([str(tmp_path)])


def test_a_scheme_is_named_by_the_options_it_reads():
  name = position_probe.scheme_name
  assert name(dict(position="t5", max_distance=16, use_keys=True, use_values=True)) == "t5"
  assert name(dict(position="shaw", max_distance=16, use_keys=True, use_values=True)) == "shaw, k=16"
  assert name(dict(position="shaw", max_distance=2, use_keys=True, use_values=False)) == "shaw, k=2, a^K only"
  assert name(dict(position="shaw", max_distance=2, use_keys=False, use_values=False)) == "shaw, k=2, neither term"
  assert name(dict(position="shaw", max_distance=16, use_keys=True, use_values=False, add_sinusoidal=True)) == (
      "shaw, k=16, a^K only + sinusoidal")


def test_a_probe_has_a_row_per_layer_and_position_and_a_monotonicity_per_decoder_layer(probes):
  rows = probes["av"]["rows"]
  assert [(r["layer"], r["target"]) for r in rows] == [
      ("encoder/layer_0", "from start"), ("encoder/layer_0", "from end"), ("decoder/layer_0", "from start")]
  assert all(r["r2"] <= 1.0 and r["mae"] >= 0.0 for r in rows)
  assert list(probes["av"]["monotonicity"]) == ["decoder/layer_0"]
  assert -1.0 <= probes["av"]["monotonicity"]["decoder/layer_0"] <= 1.0
  table = position_probe.markdown(probes, {"none": "no position", "av": "a^V only"}, {"none": 0.5, "av": 0.75},
                                  "valid/exact_match")
  lines = table.splitlines()
  assert len(lines) == 4 and lines[0].startswith("| run | valid/exact_match | encoder/layer_0 from start |")
  assert lines[3].startswith("| a^V only | 0.75 | ")


def test_a_v_puts_position_into_the_encoder_where_no_position_term_leaves_only_content(probes):
  # Random digits: content says nothing of a token's position, so without a position term only the
  # sentence length (from the bag of tokens) can inform the probe. a^V adds, at each token, a sum of
  # distance vectors that depends on how far the sentence's edges are.
  encoder = {name: next(r for r in p["rows"] if r["layer"] == "encoder/layer_0" and r["target"] == "from start")
             for name, p in probes.items()}
  assert encoder["av"]["r2"] > encoder["none"]["r2"] + 0.3, encoder
  assert encoder["av"]["mae"] < encoder["none"]["mae"], encoder


def test_a_directory_that_is_not_a_checkpointed_run_is_refused_by_name(tmp_path):
  from experiments import runs as runs_lib

  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(app.UsageError, match=f"'{tmp_path}' is not a run's workdir: it needs config.json and checkpo"):
    runs_lib.require_checkpoints([str(tmp_path)])
  with pytest.raises(app.UsageError, match="name one or more workdirs"):
    runs_lib.require_checkpoints([])


def test_runs_of_one_scheme_that_differ_elsewhere_are_named_by_what_differs(tmp_path):
  import json

  workdirs = []
  for limit in (30, None):
    workdir = tmp_path / f"limit{limit}"
    workdir.mkdir()
    config = dict(dataset="bible_fr_en", seed=0, train_max_source_tokens=limit, model=dict(position="rope"))
    (workdir / "config.json").write_text(json.dumps(dict(config=config)))
    (workdir / "metrics.jsonl").write_text(json.dumps({"step": 1, "test/bleu": 1.0}) + "\n")
    workdirs.append(str(workdir))
  names, _ = position_probe.run_names(workdirs)
  assert [names[w] for w in workdirs] == ["train_max_source_tokens=30, seed 0", "train_max_source_tokens=None, seed 0"]
