"""experiments.bench_malloc: two malloc settings train the same run, and each process's rate and costs are read."""

import json
import os
import shutil

import numpy as np
import pytest

from experiments import bench_malloc
from rpr.records import read_jsonl


def test_rate_is_read_after_the_first_log_record():
  # 10 steps at 1/s (compiling), then 10 at 5/s and 20 at 2.5/s: 30 steps in 2 + 8 s.
  records = [{"step": 10, "train/steps_per_sec": 1.0}, {"step": 20, "train/steps_per_sec": 5.0},
             {"step": 20, "test/loss": 1.0}, {"step": 40, "train/steps_per_sec": 2.5}]
  assert bench_malloc.steady_rate(records) == pytest.approx(3.0)


def test_the_tuned_setting_is_the_only_difference_of_the_environment(monkeypatch):
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")
  assert "GLIBC_TUNABLES" not in bench_malloc.env("")
  assert bench_malloc.env("x=1")["GLIBC_TUNABLES"] == "x=1"
  assert bench_malloc.env("x=1")["PATH"] == os.environ["PATH"]


@pytest.mark.slow
def test_both_settings_train_the_same_run_and_each_process_is_measured(tmp_path):
  core = min(os.sched_getaffinity(0))
  s = bench_malloc.Settings(config="configs/tiny.py", steps=6, log_every=2, cores=(core,))
  data = bench_malloc.measure(s, str(tmp_path))
  assert sorted(data["runs"]) == ["default", "tuned"]
  for r in data["runs"].values():
    assert r["core"] == core and r["steps_per_sec"] > 0 and r["user_s"] > 0 and r["page_faults"] > 0
  assert data["ratio"] > 0
  assert data["same_run"]["records"] and data["same_run"]["parameters"] and data["same_run"]["arrays"] > 10
  # A record that differs in its last digit is told apart.
  shutil.copytree(tmp_path / "tuned", tmp_path / "edited")
  records = read_jsonl(tmp_path / "edited" / "metrics.jsonl")
  records[-1]["train/loss"] = np.nextafter(records[-1]["train/loss"], 0.0)
  (tmp_path / "edited" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  differs = bench_malloc.same_run(str(tmp_path / "default"), str(tmp_path / "edited"))
  assert not differs["records"] and differs["parameters"]
