"""rpr.record: config.json written from the typed config and read back into it; every committed record loads;
a workdir whose config.json has an older shape resumes."""

import json
import pathlib
import subprocess

import pytest

from rpr import config as rpr_config
from rpr import record
from tests.test_train import FAST, ROOT, parse, tiny_config, train_run


def _committed() -> list[str]:
  out = subprocess.run(["git", "ls-files", "experiments/results/**/config.json"], cwd=ROOT, capture_output=True,
                       text=True, check=True).stdout.split()
  return sorted(out)


def test_every_committed_config_json_loads_into_the_tree_and_round_trips():
  files = _committed()
  assert len(files) >= 200, len(files)  # the sweeps' and learning curves' records: the migration's corpus
  shapes = set()
  for path in files:
    loaded = record.load(str((ROOT / path).parent))  # migrated and validated
    again = rpr_config.RunConfig.from_dict(json.loads(json.dumps(loaded.to_dict())))
    assert again == loaded, path
    raw = json.loads((ROOT / path).read_text())["config"]
    shapes.add("first" if "model" not in raw else "options" if "position_options" in raw["model"] else "schemes")
  assert "first" in shapes and "schemes" in shapes  # both older shapes are among them


def test_the_first_shape_reads_as_it_trained():
  # arithmetic_full's pilot: the model's fields and every option at the top level, the model's length renamed.
  loaded = record.load(str(ROOT / "experiments/results/arithmetic_full/pilot_seed0/alibi_directional"))
  raw = json.loads((ROOT / "experiments/results/arithmetic_full/pilot_seed0/alibi_directional/config.json")
                   .read_text())["config"]
  assert loaded.model.max_length == raw["model_max_length"] and loaded.model.d_model == raw["d_model"]
  assert loaded.model.position == "alibi_directional" and loaded.data.arithmetic_config == raw["arithmetic_config"]
  assert loaded.budget.tensorboard is True and loaded.eval.average_last == 1  # keys added since: their defaults


@pytest.mark.parametrize("name", ["tiny", "translation", "lm", "wmt14_ende", "arithmetic", "length"])
def test_config_json_round_trips_through_the_tree(name):
  import importlib

  tree = parse(importlib.import_module(f"configs.{name}").get_config())
  on_disk = json.loads(json.dumps(tree.to_dict()))
  assert rpr_config.RunConfig.from_dict(on_disk) == tree
  # The keys on disk are the config files' names: flat, and model.<scheme>.<option>.
  options = dict(vars(tree.model.position_options))
  assert on_disk["model"].get(tree.model.position, {}) == options
  assert on_disk["learning_rate"] == tree.optim.learning_rate and on_disk["seed"] == tree.data.seed


def _first_shape(config: dict) -> dict:
  """``config`` (the current shape) as the first records wrote it: the model's fields and options on top."""
  model = dict(config.pop("model"))
  options = {}
  for scheme in ("shaw", "t5", "rope", "learned"):
    options.update(model.pop(scheme, {}))
  config["model_max_length"] = model.pop("max_length")
  return {**config, **model, **options, "preset": "tiny", "compare_positions": []}


def test_a_workdir_with_a_first_shape_record_resumes(tmp_path):
  train_run(tiny_config(**dict(FAST, num_train_steps=4)), str(tmp_path))
  path = pathlib.Path(tmp_path) / "config.json"
  written = json.loads(path.read_text())
  written["config"] = _first_shape(written["config"])
  path.write_text(json.dumps(written))
  out = train_run(tiny_config(**FAST), str(tmp_path))  # the same config: no change refused
  assert out["step"] == FAST["num_train_steps"] and not out.get("stopped_by_signal")
  assert "model" in json.loads(path.read_text())["config"]  # rewritten in the current shape


@pytest.mark.parametrize("shape", ["first", "options", "schemes"])
def test_t5s_horizon_reads_under_its_recorded_name_in_every_shape(shape):
  """T5's horizon was recorded as bucket_max_distance: each shape's value (not the default, 128) comes through."""
  old = {"num_buckets": 8, "bucket_max_distance": 16}
  recorded = {"first": {"position": "t5", **old},
              "options": {"model": {"position": "t5", "position_options": old}},
              "schemes": {"model": {"position": "t5", "t5": old}}}[shape]
  assert record.migrate(recorded)["model"]["t5"] == {"num_buckets": 8, "horizon": 16}
