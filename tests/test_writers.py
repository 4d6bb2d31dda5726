"""rpr.writers: the metrics.jsonl writer (the TensorBoard events and HParams: tests/test_hparams.py)."""

from rpr import records, writers


def test_the_jsonl_writer_appends_one_record_per_call_with_plain_values(tmp_path):
  w = writers.JsonlWriter(str(tmp_path / "m.jsonl"))
  w.write_scalars(3, {"a": 1.5, "b": float("nan")})
  w.write_scalars(4, {"a": 2})
  w.close()
  assert records.read_jsonl(tmp_path / "m.jsonl") == [{"step": 3, "a": 1.5, "b": "nan"}, {"step": 4, "a": 2}]
