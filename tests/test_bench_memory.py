"""experiments/bench_memory.py: a tiny run measures, compares and records; targets come from the numbers."""

import json
import shlex

import jax
import jax.numpy as jnp

from experiments import bench_memory as bench

# Four compiles of a one-layer decoder with cross-attention (no encoder layer, no dropout) at low LLVM
# optimisation: ~10 s of CPU.
TINY = ["--d_model", "16", "--num_heads", "2", "--d_ff", "32", "--vocab_size", "50", "--positions", "none",
        "--encoder_layers", "0", "--dropout_rate", "0", "--fast_compile", "--top_arrays", "3"]


def test_tiny_run_chunked_grows_less_than_dense_and_records_its_command(tmp_path):
  # L = 128 -> 256: the chunked layers' block is 128, so 256 is two blocks a side; dense grows ~L^2.
  argv = ["--lengths", "128,256", *TINY, "--out", str(tmp_path)]
  data = bench.main(argv)

  saved = json.loads((tmp_path / "results.json").read_text())
  command = "python -m experiments.bench_memory " + shlex.join(argv)
  assert saved["command"] == command
  assert command in (tmp_path / "README.md").read_text()
  assert saved["machine"]["jax"] == jax.__version__ and saved["machine"]["cores"] >= 1

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
  assert target["judged"] and target["pass"] == (growth["chunked"] <= bench.TARGET_RATIO)
  assert f"**{bench.verdict(saved['targets'])}**" in (tmp_path / "README.md").read_text()
  assert res["none/chunked/256"]["largest_arrays"] and "largest_arrays" not in res["none/dense/256"]
  # The claim itself: above one block (L = 256: 2 x 2 blocks) the chunked step holds no array with
  # two L-long axes; dense holds its [b, h, L, L] weights. (At L = 128 the one block is the whole square.)
  assert res["none/chunked/256"]["quadratic_arrays"]["count"] == 0
  dense = res["none/dense/256"]["quadratic_arrays"]
  assert dense["count"] > 0 and any(a["dims"][-2:] == [256, 256] for a in dense["largest"])
  assert "chunked: 0 of 1 compiled steps with L > 128" in (tmp_path / "README.md").read_text()
  assert data["results"].keys() == res.keys()


def test_verdict_follows_the_ratios():
  data = {"chunk_block": 128, "growth": [
      {"position": "shaw", "implementation": "chunked", "from": 64, "to": 128, "ratio": 3.9},
      {"position": "shaw", "implementation": "chunked", "from": 4096, "to": 8192, "ratio": 2.0},
      {"position": "shaw", "implementation": "dense", "from": 4096, "to": 8192, "ratio": 3.9}]}
  targets = bench.check_targets(data)
  assert [(t["from"], t["judged"], t["pass"]) for t in targets] == [(64, False, False), (4096, True, True)]
  assert bench.verdict(targets) == "PASS"  # below the block the chunked path is quadratic by design
  data["growth"][1]["ratio"] = 2.31
  assert bench.verdict(bench.check_targets(data)) == "FAIL"
  assert bench.verdict([]).startswith("NOT EVALUATED")


def test_largest_arrays_names_a_quadratic_tensor_and_its_source_line():
  def quadratic(x):
    scores = jnp.exp(x @ x.T)  # the [L, L] tensor
    return (jnp.tanh(scores) @ x).sum() + (scores @ x).max()

  compiled = jax.jit(quadratic).lower(jax.ShapeDtypeStruct((256, 8), jnp.float32)).compile()
  top = bench.largest_arrays(compiled.as_text(), 2)
  assert top[0]["shape"] == "f32[256,256]" and top[0]["bytes"] == 256 * 256 * 4
  assert top[0]["source"].startswith("tests/test_bench_memory.py:")


def test_peak_subtracts_donated_aliases():
  f = jax.jit(lambda x, y: (x + 1, y * 2), donate_argnums=0)
  spec = jax.ShapeDtypeStruct((1024, 64), jnp.float32)
  m = bench.peak_bytes(f.lower(spec, spec).compile())
  assert m["alias"] == 1024 * 64 * 4
  assert m["peak"] == m["temp"] + m["argument"] + m["output"] - m["alias"]
