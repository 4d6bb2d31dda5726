"""rpr.assemble.prepare: what a run builds before step 1, from its typed config's sections."""

import json
import os

import jax
import numpy as np
import pytest

from rpr import assemble
from rpr.config import ConfigError
from rpr.sharding import make_mesh
from tests.test_train import FAST, parse, tiny_config


def _leaves(params):
  return [np.asarray(v) for v in jax.tree_util.tree_leaves(params)]


def test_prepare_initialises_from_the_seed_and_records_the_config(tmp_path):
  runs = {seed: assemble.prepare(parse(tiny_config(**FAST, seed=seed)), str(tmp_path / f"s{seed}"), make_mesh())
          for seed in (3, 4)}
  again = assemble.prepare(parse(tiny_config(**FAST, seed=3)), str(tmp_path / "again"), make_mesh())
  assert int(runs[3].state.step) == 0 and runs[3].records == []
  assert all(np.array_equal(a, b) for a, b in zip(_leaves(runs[3].state.params), _leaves(again.state.params)))
  assert any(not np.array_equal(a, b) for a, b in zip(_leaves(runs[3].state.params), _leaves(runs[4].state.params)))
  with open(os.path.join(tmp_path, "s4", "config.json"), encoding="utf-8") as f:
    assert json.load(f)["config"]["seed"] == 4
  # The pieces come from their sections: the model's vocabulary is the task's, the budget is the config's.
  assert runs[3].model_config.vocab_size == runs[3].task.vocab.size
  assert runs[3].budget == parse(tiny_config(**FAST, seed=3)).budget


def test_a_decoder_only_model_on_a_data_set_with_inputs_is_refused_before_any_file(tmp_path):
  config = tiny_config(**FAST)
  config.model.num_encoder_layers = 0
  with pytest.raises(ConfigError, match="num_encoder_layers = 0 does not fit"):
    assemble.prepare(parse(config), str(tmp_path / "run"), make_mesh())
  assert not os.path.exists(tmp_path / "run")


def test_prepare_checks_the_workdir_before_building_and_records_the_config_it_checked(tmp_path):
  workdir = tmp_path / "run"
  assemble.prepare(parse(tiny_config(**FAST)), str(workdir), make_mesh())
  before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
  changed = parse(tiny_config(**dict(FAST, learning_rate=1e-3)))
  with pytest.raises(ConfigError, match="learning_rate"):
    assemble.prepare(changed, str(workdir), make_mesh())
  assert {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()} == before  # refused before any write
  run = assemble.prepare(changed, str(workdir), make_mesh(), allow_config_change=("learning_rate",))
  on_disk = json.loads((workdir / "config.json").read_text())["config"]
  assert on_disk == json.loads(json.dumps(changed.to_dict())) and run.recorded["config"] == changed.to_dict()
