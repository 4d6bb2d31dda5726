"""Every run writes its hyper-parameters in TensorBoard's HParams format beside its metrics, and a committed
sweep is written back as such events (experiments/hparams_view.py)."""

import glob
import json
import os

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

from rpr import train
from rpr import writers
from tests.test_train import tiny_config
from tests.test_train import train_run


def test_hparams_are_flat_scalars_or_text():
  flat = writers.hparams({"a": 1, "model": {"shaw": {"max_distance": 4}, "x": None}, "s": ("v",), "f": float("inf")})
  assert flat == {"a": 1, "model.shaw.max_distance": 4, "model.x": "None", "s": "('v',)", "f": "inf"}


def test_a_run_writes_its_hparams_and_final_metrics_to_tensorboard(tmp_path):
  config = tiny_config(num_train_steps=4, eval_splits=("valid",), eval_every_steps=4, log_every_steps=2,
                       checkpoint_every_steps=4)
  train_run(config, str(tmp_path))
  (events,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
  acc = event_accumulator.EventAccumulator(events, size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  content = acc.PluginTagToContent("hparams")
  data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
  hp = {k: getattr(v, v.WhichOneof("kind")) for k, v in data.session_start_info.hparams.items()}
  assert hp["model.shaw.max_distance"] == 4 and hp["model.position"] == "shaw" and hp["seed"] == 0
  assert hp["learning_rate"] == config.learning_rate
  tags = acc.Tags()["tensors"]
  assert "valid/exact_match" in tags and "train/loss" in tags  # the metrics the dashboard tabulates


def test_a_committed_sweep_is_written_back_with_the_keys_that_differ(tmp_path):
  from experiments import hparams_view

  for k, seed in ((2, 0), (16, 1)):
    run = tmp_path / "runs" / f"k={k}" / f"seed{seed}"
    run.mkdir(parents=True)
    config = {"seed": seed, "learning_rate": 0.5, "model": {"position": "shaw", "shaw": {"max_distance": k}}}
    (run / "config.json").write_text(json.dumps({"config": config}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 4, "test/perplexity": 40.0 + k}) + "\n")
  folders = hparams_view.export([str(tmp_path / "runs" / "*" / "*")], str(tmp_path / "tb"))
  assert [os.path.relpath(f, tmp_path / "tb") for f in folders] == ["k=2/seed0", "k=16/seed1"]  # numbers as numbers
  (events,) = glob.glob(os.path.join(folders[0], "events.out.tfevents.*"))
  acc = event_accumulator.EventAccumulator(events, size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  data = plugin_data_pb2.HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/session_start_info"])
  hp = {k: getattr(v, v.WhichOneof("kind")) for k, v in data.session_start_info.hparams.items()}
  assert hp == {"model.shaw.max_distance": 2, "seed": 0}  # learning_rate is the same in both: left out
  (value,) = acc.Tensors("test/perplexity")
  assert value.step == 4 and float(tensor_util.make_ndarray(value.tensor_proto)) == 42.0
