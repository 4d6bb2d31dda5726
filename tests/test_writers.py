"""rpr.writers: the metrics.jsonl writer (the TensorBoard events and HParams: tests/test_hparams.py)."""

import subprocess
import sys

from rpr import records, writers
from tests.test_train import ROOT


def test_the_jsonl_writer_appends_one_record_per_call_with_plain_values(tmp_path):
  w = writers.JsonlWriter(str(tmp_path / "m.jsonl"))
  w.write_scalars(3, {"a": 1.5, "b": float("nan")})
  w.write_scalars(4, {"a": 2})
  w.close()
  assert records.read_jsonl(tmp_path / "m.jsonl") == [{"step": 3, "a": 1.5, "b": "nan"}, {"step": 4, "a": 2}]


def test_the_writers_have_every_method_of_clus_metric_writer():
  from clu.metric_writers import interface

  for cls in (writers.Silent, writers.JsonlWriter):
    assert interface.MetricWriter.__abstractmethods__ <= set(vars(cls)) | set(vars(writers.Silent)), cls


def test_without_tensorboard_a_run_writes_jsonl_only_and_never_imports_tensorflow(tmp_path):
  code = f"""
import glob, sys
from configs import tiny
from rpr import config as rpr_config, records, train
config = tiny.get_config()
config.update(num_train_steps=2, log_every_steps=1, eval_splits=(), tensorboard=False)
train.train_and_evaluate(rpr_config.parse(config), {str(tmp_path)!r})
assert not glob.glob({str(tmp_path / "events.*")!r})
assert [r["step"] for r in records.read_jsonl({str(tmp_path / "metrics.jsonl")!r})] == [1, 2], "records"
print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "clu", "keras")))
"""
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == "[]"


def test_process_0_writes_and_the_others_write_nothing(tmp_path):
  writers.create(str(tmp_path), process_index=1, tensorboard=False).write_scalars(1, {"a": 1.0})
  assert not list(tmp_path.iterdir())
  w = writers.create(str(tmp_path), process_index=0, tensorboard=False)
  w.write_scalars(1, {"a": 1.0})
  w.close()
  assert records.read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "a": 1.0}]
