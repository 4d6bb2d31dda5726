"""python -m experiments bench step (experiments/bench/step.py): a config's training step measured as training
runs it."""

import math

import pytest

from experiments.bench import step


def test_every_case_loads_its_config_with_its_dtype_and_overrides():
  case = step.Case("translation/shaw", "configs/translation.py:pe=shaw", "bfloat16", (("model.dropout_rate", 0.0),))
  config = step.load(case)
  assert config.model.position == "shaw" and config.model.dtype == "bfloat16" and config.model.dropout_rate == 0.0
  assert {c.name for c in step.CASES} == {"translation/shaw", "translation/sinusoidal", "lm/shaw", "lm/sinusoidal"}
  assert {c.dtype for c in step.CASES} == {"float32", "bfloat16"}


@pytest.mark.slow
def test_a_measurement_counts_each_batch_shape_and_gives_rates_flops_and_a_loss():
  r = step.measure(step.Case("tiny", "configs/tiny.py"), steps=6)
  assert sum(r["shapes"].values()) == 6 and r["steps"] == 6
  assert r["steps_per_sec"] > 0 and r["flops_per_step"] > 0 and r["matmul_peak"] > 0
  assert r["flops_per_sec"] == pytest.approx(r["flops_per_step"] * r["steps_per_sec"])
  assert r["fraction_of_peak"] == pytest.approx(r["flops_per_sec"] / r["matmul_peak"])
  assert math.isfinite(r["loss"]) and r["loss"] > 0
  assert r["memory"]["peak"] > 0 and r["max_rss_bytes"] > r["memory"]["peak"]


def test_the_table_gives_medians_and_bfloat16_s_loss_against_float32_s():
  def record(dtype, rate, loss):
    return {"case": {"name": "lm/shaw", "dtype": dtype}, "steps_per_sec": rate, "flops_per_step": 2e9,
            "flops_per_sec": 2e9 * rate, "matmul_peak": 1e11, "fraction_of_peak": 2e9 * rate / 1e11, "loss": loss,
            "memory": {"peak": 3e8}}
  text = step.table([record("float32", 1.0, 5.0), record("float32", 3.0, 5.2), record("float32", 2.0, 5.1),
                           record("bfloat16", 4.0, 5.15)])
  rows = text.splitlines()[2:]
  assert rows[0] == "| lm/shaw | float32 | 2.00 | 2.00 | 4.0 | 100.0 | 0.04 | 300 | 5.1000 | +0.0000 |"
  assert rows[1] == "| lm/shaw | bfloat16 | 4.00 | 2.00 | 8.0 | 100.0 | 0.08 | 300 | 5.1500 | +0.0500 |"


def test_against_a_baseline_each_round_pairs_the_two_checkouts_measured_at_once():
  def record(rate, baseline):
    return {"case": {"name": "translation/shaw", "dtype": "float32"}, "steps_per_sec": rate, "baseline": baseline}
  text = step.ratios([record(2.0, True), record(3.0, False), record(3.3, False), record(3.0, True)])
  assert text.splitlines()[-1] == "| translation/shaw | float32 | 1.50, 1.10 |"
  assert step.table([record(2.0, True)]).count("\n") == 1  # the baseline's records are not this checkout's
