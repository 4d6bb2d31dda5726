"""python -m experiments bench attention (experiments/bench/attention*.py): a tiny run writes complete results and a
report; targets are judged right."""

import json
import pathlib
import shutil
import subprocess
import sys

import jax
from absl import flags

from experiments.bench import attention_report as bench_attention
from experiments import machine
from experiments import settings
from experiments.bench import attention

TINY = attention.Settings(lengths=(32,), batch=1, heads=2, head_dim=8, max_distance=2, repeats=1, long_length=0,
                          block_q=16, block_k=16)


def test_tiny_run_writes_every_configuration(tmp_path):
  data = bench_attention.run(TINY, str(tmp_path), "python -m experiments bench attention X")
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["command"] == data["command"] == "python -m experiments bench attention X"
  results = saved["lengths"]["32"]
  assert set(results) == {attention.label(c) for c in attention.CONFIGS}
  for key, entry in results.items():
    if key == "jax_nn/jax_cudnn" and jax.default_backend() != "gpu":  # cuDNN's kernel exists on CUDA only
      assert entry["status"] == f"skipped (cuDNN needs a CUDA GPU; this is {jax.default_backend()})"
      continue
    assert entry["status"] == "ok", (key, entry["status"])
    assert len(entry["wall_s"]) == 1 and entry["memory"]["peak"] > 0
    m = entry["memory"]
    assert m["peak"] == m["temp"] + m["argument"] + m["output"] - m["alias"]  # the one definition
  assert results["plain/dense"]["vs_plain_dense"] == {"memory": 1.0, "time_wall": 1.0, "time_cpu": 1.0}
  assert results["shaw/chunked"]["vs_plain_same_impl"]["memory"] > 0
  report = (tmp_path / "README.md").read_text()
  assert "| shaw/chunked" in report and saved["machine"]["jax"] in report
  assert "temp + argument + output - alias bytes" in report


def test_run_without_lengths_writes_no_empty_attention_tables(tmp_path):
  # A model-step-only run (--lengths ''; the step itself is off here) times no attention configuration.
  bench_attention.run(attention.Settings(lengths=(), long_length=0), str(tmp_path), "cmd")
  report = (tmp_path / "README.md").read_text()
  assert json.loads((tmp_path / "results.json").read_text())["lengths"] == {}
  assert "## Ratios to plain dense attention" not in report and "## Absolute numbers" not in report
  assert "## Base Transformer training step" in report


def test_flags_are_the_settings_fields():
  fv = flags.FlagValues()
  settings.define(attention.Settings, fv)
  fv(["bench", "--lengths", "", "--model_step", "--model_length", "256", "--rss_lengths", "512,1024",
      "--min_sample_s", "0.5"])
  assert settings.parse(attention.Settings, fv) == attention.Settings(
      lengths=(), model_step=True, model_length=256, rss_lengths=(512, 1024), min_sample_s=0.5)
  fv = flags.FlagValues()
  settings.define(attention.Settings, fv)
  fv(["bench"])
  assert settings.parse(attention.Settings, fv) == attention.Settings()  # the defaults are the dataclass's


def test_report_only_renders_the_committed_readme_again(tmp_path):
  """The command line end to end: --report_only on a copy of committed results gives the committed README."""
  committed = pathlib.Path(machine.ROOT) / "experiments" / "results" / "bench" / "model_step_256"
  shutil.copy(committed / "results.json", tmp_path)
  proc = subprocess.run([sys.executable, "-m", "experiments", "bench", "attention", "--report_only", "--out",
                         str(tmp_path)],
                        cwd=machine.ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (tmp_path / "README.md").read_text() == (committed / "README.md").read_text()


def test_targets_are_judged_on_the_measured_ratios():
  def entry(time_wall, memory):
    return {"implementation": "chunked", "vs_plain_dense": {"time_wall": time_wall, "memory": memory},
            "memory": {"peak": 100}}

  data = {"lengths": {"512": {"shaw/chunked": entry(1.1, 0.3)}, "1024": {"shaw/chunked": entry(1.2, 0.3)},
                      "4096": {"plain/chunked": {"memory": {"peak": 1}}, "plain/dense": {"memory": {"peak": 8}}}}}
  lines = bench_attention.check_targets(data)
  assert any("L=512" in line and "-> met" in line for line in lines)
  assert any("L=1024" in line and "NOT met" in line for line in lines)
  assert any("plain chunked / dense" in line and "-> met" in line for line in lines)


def test_model_step_target_is_judged_on_the_median_ratio():
  def data(ratio):
    return {"lengths": {}, "model_step": {"status": "ok", "batch": 8, "length": 64, "ratio_wall": ratio,
                                          "ratio_wall_quartiles": [ratio - 0.02, ratio + 0.02]}}

  met, = [line for line in bench_attention.check_targets(data(1.04)) if "training step" in line]
  missed, = [line for line in bench_attention.check_targets(data(1.06)) if "training step" in line]
  assert "-> met" in met and "quartiles 1.020-1.060" in met
  assert "NOT met" in missed
  assert not [line for line in bench_attention.check_targets({"lengths": {}, "model_step": {"status": "skipped"}})
              if "training step" in line]


def test_peak_subtracts_donated_aliases():
  import jax.numpy as jnp

  f = jax.jit(lambda x, y: (x + 1, y * 2), donate_argnums=0)
  spec = jax.ShapeDtypeStruct((1024, 64), jnp.float32)
  m = machine.peak_bytes(f.lower(spec, spec).compile())
  assert m["alias"] == 1024 * 64 * 4
  assert m["peak"] == m["temp"] + m["argument"] + m["output"] - m["alias"]
