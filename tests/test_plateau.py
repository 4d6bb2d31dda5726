"""rpr.plateau (the rule), and the training loop stopping on it, resuming at it, and evaluating on restart."""

import dataclasses
import os

import numpy as np
import pytest

from experiments import status as status_lib
from rpr import data
from rpr import plateau
from rpr import predict as predict_lib
from rpr import steps
from rpr import train
from rpr.records import read_jsonl
from tests.test_train import _SigtermAt, load_state, tiny_config
from tests.test_train import ConfigError, validate, train_run


def test_gain_is_the_smoothed_change_over_the_window_signed_by_the_metric():
  rule = plateau.Rule("validation/bleu", min_steps=0, window=0.25, min_gain=0.2, smoothing=2)
  curve = [(500, 1.0), (1000, 2.0), (1500, 3.0), (2000, 3.1), (2500, 3.2), (3000, 3.3), (3500, 3.4), (4000, 3.4)]
  # v(4000) = mean(3.4, 3.4); v(3000) = mean(3.2, 3.3)
  assert rule.gain(curve, 4000) == pytest.approx(3.4 - 3.25)
  assert rule.reached(curve, 4000)
  assert not rule.reached(curve, 2000)  # v(2000) = 3.05, v(1500) = 2.5: still improving
  assert rule.gain(curve, 1000) is None  # v(750) needs two evaluations at <= 750
  assert not dataclasses.replace(rule, min_steps=4500).reached(curve, 4000)
  lower = plateau.Rule("validation/perplexity", 0, 0.5, 1.0)
  assert lower.gain([(1, 50.0), (2, 45.0)], 2) == 5.0  # lower is better: a fall is a gain
  assert not lower.reached([(1, 50.0), (2, 45.0)], 2) and lower.reached([(1, 50.0), (2, 49.5)], 2)


def test_the_rule_holds_only_at_an_evaluation_step():
  # At step 3,000, after no evaluation since 2,000, the window starts past the evaluation at 1,500 and the
  # gain there (0.6) is below min_gain, though at the last evaluation (1.6) it was not.
  rule = plateau.Rule("validation/bleu", min_steps=0, window=0.5, min_gain=1.0)
  curve = [(1000, 0.0), (1500, 1.0), (2000, 1.6)]
  assert not rule.reached(curve, 2000) and rule.gain(curve, 3000) == pytest.approx(0.6)
  assert not rule.reached(curve, 3000)
  assert rule.reached([*curve, (3000, 1.6)], 3000)


def test_judge_reads_the_curve_from_the_records_and_the_value_just_evaluated():
  rule = plateau.Rule("validation/bleu", min_steps=0, window=0.5, min_gain=1.0)
  records = [{"step": 1000, "validation/bleu": 0.0}, {"step": 1000, "train/loss": 2.0},
             {"step": 1500, "validation/bleu": 1.0}, {"step": 2000, "validation/bleu": 1.6}]
  assert rule.judge(records, 2000) == (pytest.approx(1.6), False)  # gain 1.6 >= 1.0: still improving
  assert rule.judge(records, 3000) == (pytest.approx(0.6), False)  # no evaluation at 3,000: never held
  assert rule.judge(records, 3000, 1.6) == (pytest.approx(0.6), True)


@pytest.mark.parametrize("metric", ["validation/bleu", "test/chrf", "valid/exact_match", "valid/perplexity"])
def test_which_way_is_better_comes_from_the_metric_name(metric):
  assert plateau.higher_is_better(metric) == (not metric.endswith(("perplexity", "loss")))


@pytest.mark.parametrize("overrides, message", [
    ({"plateau_metric": "valid/steps"}, "plateau_metric = 'valid/steps'"),
    ({"plateau_metric": "test/loss"}, "a split in eval_splits"),
    ({"plateau_metric": "valid/loss", "plateau_window": 1.0}, "plateau_window"),
    ({"plateau_metric": "valid/loss", "plateau_smoothing": 0}, "plateau_smoothing"),
    ({"final_decode_method": "sample"}, "final_decode_method = 'sample'"),
])
def test_bad_plateau_settings_fail_naming_the_key(overrides, message):
  with pytest.raises(ConfigError, match=message):
    validate(tiny_config(**overrides), num_devices=1)


def _timeless(workdir):
  """A workdir's metrics.jsonl records without their wall-clock step rates."""
  return [{k: v for k, v in r.items() if k != "train/steps_per_sec"} for r in read_jsonl(workdir / "metrics.jsonl")]


# The valid loss of the tiny run falls by far less than 100 per window: the rule holds at the first
# evaluation step >= plateau_min_steps where the gain is defined (step 8). No TensorBoard events: no test here reads
# them, and writing them imports TensorFlow (seconds of CPU).
PLATEAU = dict(num_train_steps=40, eval_splits=("valid",), final_eval_splits=("long",), eval_every_steps=2,
               log_every_steps=2, checkpoint_every_steps=100, plateau_metric="valid/loss", plateau_min_steps=8,
               plateau_window=0.5, plateau_min_gain=100.0, final_decode_method="beam", beam_size=2, tensorboard=False,
               model={"dropout_rate": 0.1})


def test_the_plateau_stops_the_run_saves_it_and_scores_the_final_splits_once(tmp_path, monkeypatch):
  methods = []
  predict = predict_lib.predict  # traced once per decode method and length
  monkeypatch.setattr(predict_lib, "predict", lambda *a, **k: methods.append(k["method"]) or predict(*a, **k))
  steps.programs.cache_clear()  # the spy sees the decoders only as they are traced: built anew, not reused
  config = tiny_config(**PLATEAU)
  out = train_run(config, str(tmp_path))
  assert set(methods[:-1]) == {"greedy"} and methods[-1] == "beam"  # eval_splits greedy, the final splits by beam
  assert out["step"] == 8 and out["plateau/reached"] == 1.0 and "long/exact_match" in out
  records = read_jsonl(tmp_path / "metrics.jsonl")
  assert max(r["step"] for r in records) == 8
  assert [r["step"] for r in records if "plateau/gain" in r] == [4, 6, 8]  # v(S / 2) exists from S = 4 on
  assert [r["step"] for r in records if "long/loss" in r] == [8]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["8"]
  assert status_lib.finished(str(tmp_path), config)

  # Run again: nothing is trained, evaluated or written.
  before = (tmp_path / "metrics.jsonl").read_text()
  again = train_run(config, str(tmp_path))
  assert again["step"] == 8 and again["long/loss"] == out["long/loss"]
  assert (tmp_path / "metrics.jsonl").read_text() == before

  # Killed after the save at the plateau, before its final evaluation was written: it is written on restart.
  lines = before.splitlines(keepends=True)
  (tmp_path / "metrics.jsonl").write_text("".join(line for line in lines if "plateau/reached" not in line))
  assert not status_lib.finished(str(tmp_path), config)
  redo = train_run(config, str(tmp_path))
  assert redo["long/loss"] == out["long/loss"] and redo["long/exact_match"] == out["long/exact_match"]
  assert (tmp_path / "metrics.jsonl").read_text().splitlines() == before.splitlines()


def test_a_restart_evaluates_the_step_its_predecessor_saved_but_did_not_evaluate(tmp_path, monkeypatch):
  # SIGTERM during step 3 saves step 4 and stops before step 4's evaluation; the restart writes it. The rule of
  # PLATEAU ends both runs at step 8 (not before: plateau_min_steps), so that they run PLATEAU's programs, which this
  # module compiles once.
  config = dict(PLATEAU, eval_every_steps=4, final_eval_splits=())
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  assert train_run(tiny_config(**config), str(straight))["step"] == 8
  with monkeypatch.context() as m:
    m.setitem(data.REGISTRY, "copy", data.Entry(lambda c: _SigtermAt(c, step=3)))
    assert train_run(tiny_config(**config), str(resumed))["stopped_by_signal"] == 1.0
  assert not [r for r in read_jsonl(resumed / "metrics.jsonl") if "valid/loss" in r]
  assert train_run(tiny_config(**config), str(resumed))["step"] == 8
  assert _timeless(resumed) == _timeless(straight)  # the same records, each step once
  a, b = load_state(straight, 8), load_state(resumed, 8)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_a_run_resumed_between_evaluations_trains_on_to_the_next_one(tmp_path, monkeypatch):
  # SIGTERM during step 2 saves step 3, between the evaluations at 2 and 4. At 3 the window (0.25) starts at
  # 2.25, past the evaluation at 2, so the gain there is defined (0 < min_gain) where at 2 it was not: the
  # restart must not stop at 3, but train to 4 and stop there, as the straight run does.
  config = dict(PLATEAU, eval_every_steps=2, log_every_steps=1, plateau_min_steps=0, plateau_window=0.25,
                final_eval_splits=())
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  assert train_run(tiny_config(**config), str(straight))["step"] == 4
  with monkeypatch.context() as m:
    m.setitem(data.REGISTRY, "copy", data.Entry(lambda c: _SigtermAt(c, step=2)))
    assert train_run(tiny_config(**config), str(resumed))["step"] == 3
  out = train_run(tiny_config(**config), str(resumed))
  assert out["step"] == 4 and out["plateau/reached"] == 1.0
  assert _timeless(resumed) == _timeless(straight)


def test_describe_says_how_far_a_run_is_from_its_rule():
  rule = plateau.Rule("valid/loss", min_steps=40, window=0.5, min_gain=0.2, smoothing=2)
  assert rule.describe([{"step": 5, "train/loss": 4.0}]) == "no valid/loss yet"
  assert "gained (not yet measured)" in rule.describe([{"step": 10, "valid/loss": 3.0}])
  records = [{"step": 10, "valid/loss": 3.0}, {"step": 15, "train/loss": 2.0}, {"step": 20, "valid/loss": 2.0},
             {"step": 30, "valid/loss": 1.5}, {"step": 40, "valid/loss": 1.3}]
  # at step 40: mean of 1.5 and 1.3 against the mean of 3.0 and 2.0 at step 20 (half of 40), a gain of 1.1
  assert rule.describe(records) == (
      "valid/loss 1.30 at step 40, gained 1.10 over the last 50% of the steps (means of 2 evaluations) (the rule "
      "stops it at a step >= 40 with a gain under 0.2)")
