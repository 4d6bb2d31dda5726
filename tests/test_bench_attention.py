"""experiments/bench_attention.py: a tiny run writes complete results and a report; targets are judged right."""

import json

from experiments import bench_attention as bench


def test_tiny_run_writes_every_configuration(tmp_path):
  bench.main(["--lengths", "32", "--batch", "1", "--heads", "2", "--head_dim", "8", "--max_distance", "2",
              "--repeats", "1", "--long_length", "0", "--block_q", "16", "--block_k", "16", "--out", str(tmp_path)])
  data = json.loads((tmp_path / "results.json").read_text())
  results = data["lengths"]["32"]
  assert set(results) == {bench.label(c) for c in bench.CONFIGS}
  for key, entry in results.items():
    assert entry["status"] == "ok", (key, entry["status"])
    assert len(entry["wall_s"]) == 1 and entry["memory"]["peak"] > 0
  assert results["plain/dense"]["vs_plain_dense"] == {"memory": 1.0, "time_wall": 1.0, "time_cpu": 1.0}
  assert results["shaw/chunked"]["vs_plain_same_impl"]["memory"] > 0
  report = (tmp_path / "README.md").read_text()
  assert "| shaw/chunked" in report and data["machine"]["jax"] in report


def test_run_without_lengths_writes_no_empty_attention_tables(tmp_path):
  # A model-step-only run (--lengths ""; the step itself is off here) times no attention configuration.
  bench.main(["--lengths", "", "--long_length", "0", "--out", str(tmp_path)])
  report = (tmp_path / "README.md").read_text()
  assert json.loads((tmp_path / "results.json").read_text())["lengths"] == {}
  assert "## Ratios to plain dense attention" not in report and "## Absolute numbers" not in report
  assert "## Base Transformer training step" in report


def test_targets_are_judged_on_the_measured_ratios():
  def entry(time_wall, memory):
    return {"implementation": "chunked", "vs_plain_dense": {"time_wall": time_wall, "memory": memory},
            "memory": {"peak": 100}}

  data = {"lengths": {"512": {"shaw/chunked": entry(1.1, 0.3)}, "1024": {"shaw/chunked": entry(1.2, 0.3)},
                      "4096": {"plain/chunked": {"memory": {"peak": 1}}, "plain/dense": {"memory": {"peak": 8}}}}}
  lines = bench.check_targets(data)
  assert any("L=512" in line and "-> met" in line for line in lines)
  assert any("L=1024" in line and "NOT met" in line for line in lines)
  assert any("plain chunked / dense" in line and "-> met" in line for line in lines)


def test_model_step_target_is_judged_on_the_median_ratio():
  def data(ratio):
    return {"lengths": {}, "model_step": {"status": "ok", "batch": 8, "length": 64, "ratio_wall": ratio,
                                          "ratio_wall_quartiles": [ratio - 0.02, ratio + 0.02]}}

  met, = [line for line in bench.check_targets(data(1.04)) if "training step" in line]
  missed, = [line for line in bench.check_targets(data(1.06)) if "training step" in line]
  assert "-> met" in met and "quartiles 1.020-1.060" in met
  assert "NOT met" in missed
  assert not [line for line in bench.check_targets({"lengths": {}, "model_step": {"status": "skipped"}})
              if "training step" in line]
