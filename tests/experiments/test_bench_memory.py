"""python -m experiments bench memory (experiments/bench/memory.py, memory_report.py): a tiny run measures, compares
and records; targets come from the numbers."""

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from absl import flags

from experiments.bench import memory_report as bench_memory
from experiments import machine
from experiments import settings
from experiments.bench import hlo
from experiments.bench import memory

# Four compiles of a one-layer decoder with cross-attention (no encoder layer, no dropout) at low LLVM
# optimisation: ~10 s of CPU.
TINY = memory.Settings(lengths=(128, 256), d_model=16, num_heads=2, d_ff=32, vocab_size=50, positions=("none",),
                       encoder_layers=0, dropout_rate=0.0, fast_compile=True, top_arrays=3)


def test_tiny_run_chunked_grows_less_than_dense_and_records_its_command(tmp_path):
  # L = 128 -> 256: the chunked layers' block is 128, so 256 is two blocks a side; dense grows ~L^2.
  command = "python -m experiments bench memory --lengths 128,256 ..."
  data = bench_memory.run(TINY, str(tmp_path), command)

  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["command"] == command and command in (tmp_path / "README.md").read_text()
  assert saved["machine"]["jax"] == jax.__version__ and saved["machine"]["cores"] >= 1
  assert saved["args"]["lengths"] == [128, 256] and saved["args"]["d_model"] == 16

  res = saved["results"]
  assert set(res) == {f"none/{impl}/{n}" for impl in ("dense", "chunked") for n in (128, 256)}
  for entry in res.values():
    m = entry["memory"]
    assert m["peak"] == m["temp"] + m["argument"] + m["output"] - m["alias"] > 0
  growth = {g["implementation"]: g["ratio"] for g in saved["growth"]}
  assert growth["chunked"] < growth["dense"], growth
  assert growth["dense"] > 2.5  # the [b, h, L, L] weights dominate dense already at these sizes
  assert res["none/chunked/256"]["memory"]["peak"] < res["none/dense/256"]["memory"]["peak"]
  # The verdict is computed from the ratio, and the report states it.
  (target,) = saved["targets"]
  assert target["judged"] and target["pass"] == (growth["chunked"] <= memory.TARGET_RATIO)
  assert f"**{memory.verdict(saved['targets'])}**" in (tmp_path / "README.md").read_text()
  assert res["none/chunked/256"]["largest_arrays"] and "largest_arrays" not in res["none/dense/256"]
  # The claim itself: above one block (L = 256: 2 x 2 blocks) the chunked step holds no array with two L-long
  # axes; dense holds its [b, h, L, L] weights. (At L = 128 the one block is the whole square.)
  assert res["none/chunked/256"]["quadratic_arrays"]["count"] == 0
  dense = res["none/dense/256"]["quadratic_arrays"]
  assert dense["count"] > 0 and any(a["dims"][-2:] == [256, 256] for a in dense["largest"])
  assert "chunked: 0 of 1 compiled steps with L > 128" in (tmp_path / "README.md").read_text()
  assert data["results"].keys() == res.keys()


def test_flags_are_the_settings_fields_and_bad_implementations_fail():
  fv = flags.FlagValues()
  settings.define(memory.Settings, fv)
  fv(["bench", "--lengths", "1024,2048", "--positions", "shaw,t5,none", "--fast_compile", "--dropout_rate", "0"])
  assert settings.parse(memory.Settings, fv) == memory.Settings(lengths=(1024, 2048), positions=("shaw", "t5", "none"),
                                                                fast_compile=True, dropout_rate=0.0)
  with pytest.raises(ValueError, match=r"--implementations: \['sparse'\] not in \('dense', 'chunked'\)"):
    memory.Settings(implementations=("dense", "sparse"))


def test_report_only_renders_the_committed_readme_again(tmp_path):
  committed = pathlib.Path(machine.ROOT) / "experiments" / "results" / "bench" / "model_memory"
  for name in ("results.json", "notes.md"):
    shutil.copy(committed / name, tmp_path)
  proc = subprocess.run([sys.executable, "-m", "experiments", "bench", "memory", "--report_only", "--out",
                         str(tmp_path)],
                        cwd=machine.ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (tmp_path / "README.md").read_text() == (committed / "README.md").read_text()


def test_verdict_follows_the_ratios():
  data = {"chunk_block": 128, "growth": [
      {"position": "shaw", "implementation": "chunked", "from": 64, "to": 128, "ratio": 3.9},
      {"position": "shaw", "implementation": "chunked", "from": 4096, "to": 8192, "ratio": 2.0},
      {"position": "shaw", "implementation": "dense", "from": 4096, "to": 8192, "ratio": 3.9}]}
  targets = memory.check_targets(data)
  assert [(t["from"], t["judged"], t["pass"]) for t in targets] == [(64, False, False), (4096, True, True)]
  assert memory.verdict(targets) == "PASS"  # below the block the chunked path is quadratic by design
  data["growth"][1]["ratio"] = 2.31
  assert memory.verdict(memory.check_targets(data)) == "FAIL"
  assert memory.verdict([]).startswith("NOT EVALUATED")


def test_largest_arrays_names_a_quadratic_tensor_and_its_source_line():
  def quadratic(x):
    scores = jnp.exp(x @ x.T)  # the [L, L] tensor
    return (jnp.tanh(scores) @ x).sum() + (scores @ x).max()

  compiled = jax.jit(quadratic).lower(jax.ShapeDtypeStruct((256, 8), jnp.float32)).compile()
  top = hlo.largest_arrays(compiled.as_text(), 2)
  assert top[0]["shape"] == "f32[256,256]" and top[0]["bytes"] == 256 * 256 * 4
  assert top[0]["source"].startswith("tests/experiments/test_bench_memory.py:")


def test_peak_subtracts_donated_aliases():
  f = jax.jit(lambda x, y: (x + 1, y * 2), donate_argnums=0)
  spec = jax.ShapeDtypeStruct((1024, 64), jnp.float32)
  m = machine.peak_bytes(f.lower(spec, spec).compile())
  assert m["alias"] == 1024 * 64 * 4
  assert m["peak"] == m["temp"] + m["argument"] + m["output"] - m["alias"]
