"""python -m experiments bench malloc (experiments/bench/malloc.py): two malloc settings train the same run, and
each process's rate and costs are read."""

import json
import os
import shutil

import numpy as np
import pytest

from experiments.bench import malloc as bench_malloc
from rpr.records import read_jsonl


def test_rate_is_read_after_the_first_log_record():
  # 10 steps at 1/s (compiling), then 10 at 5/s and 20 at 2.5/s: 30 steps in 2 + 8 s.
  records = [{"step": 10, "train/steps_per_sec": 1.0}, {"step": 20, "train/steps_per_sec": 5.0},
             {"step": 20, "test/loss": 1.0}, {"step": 40, "train/steps_per_sec": 2.5}]
  assert bench_malloc.steady_rate(records) == pytest.approx(3.0)


def test_the_tuned_setting_is_the_only_difference_of_the_environment(monkeypatch):
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")
  assert bench_malloc.env("")["GLIBC_TUNABLES"] == ""  # set, so run.py keeps glibc's defaults
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


def test_the_readme_gives_the_ratio_and_the_verdict_and_appends_the_notes(tmp_path):
  data = {"command": "python -m experiments bench malloc --out x", "ratio": 1.5,
          "machine": {"cpu": "cpu", "cores": 2, "jax": "0"}, "settings": {"config": "c", "steps": 4, "tunables": "t"},
          "runs": {"default": {"core": 0, "steps_per_sec": 2.0, "user_s": 9.0, "system_s": 3.0, "page_faults": 1000},
                   "tuned": {"core": 1, "steps_per_sec": 3.0, "user_s": 9.0, "system_s": 0.1, "page_faults": 10}},
          "same_run": {"records": True, "parameters": False, "arrays": 7}}
  (tmp_path / "notes.md").write_text("Read me.\n")
  text = bench_malloc.write(data, str(tmp_path))
  assert text == (tmp_path / "README.md").read_text()
  assert "| default | 0 | 2.00 | 9 | 3 | 1,000 |" in text
  assert "1.50x.** The same run under both: records identical, parameters (7 arrays) DIFFER." in text
  assert text.endswith("## Reading\n\nRead me.\n")
