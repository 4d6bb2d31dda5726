"""Every run writes its hyper-parameters in TensorBoard's HParams format beside its metrics."""

import glob

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
