"""rpr.train.evaluate with stand-in steps: exact match per input length, and BLEU against the raw references."""

import logging

import numpy as np
import pytest

from rpr import config as rpr_config
from rpr import metrics
from rpr import evaluation
from rpr import progress
from rpr import train
from rpr.data.task import CharVocab, pad_batch


class _Task:
  """Two eval batches of 3 rows (the last row of the second is all-PAD filler)."""

  def __init__(self, is_text):
    self.vocab = CharVocab("abcdefgh ")
    self.is_text = is_text
    texts = ["ab", "abc", "ab", "abcd", "a"]
    rows = [self.vocab.encode(t) for t in texts]
    inputs, targets = pad_batch(rows, 5), pad_batch(rows, 6, eos=True)
    self.batches = [{"inputs": inputs[:3], "targets": targets[:3]},
                    {"inputs": np.pad(inputs[3:], ((0, 1), (0, 0))), "targets": np.pad(targets[3:], ((0, 1), (0, 0)))}]
    # Raw references differ from what decoding the targets gives back (as after a tokeniser's normalisation).
    self.raw = ["ab!", "abc!", "ab!", "abcd!", "a!"]

  def eval_batches(self, split):
    return iter(self.batches)

  def references(self, split):
    return self.raw


def _evaluate(task, wrong_rows, eval_by_length=True, buckets=()):
  config = rpr_config.Eval(eval_splits=("valid",), max_eval_batches=None, eval_by_length=eval_by_length,
                           decode_extra_length=50, source_length_buckets=buckets)
  seen = []

  def eval_fn(params, batch):
    return {"loss_sum": 1.0, "weight_sum": 2.0, "correct_sum": 1.0}

  def predict_fn(params, inputs, max_decode_len):
    b = len(seen)
    predictions = np.array(task.batches[b]["targets"])
    for r in wrong_rows.get(b, ()):
      predictions[r, 0] = task.vocab.encode("h")[0]
    seen.append(b)
    return predictions

  return train.evaluate(config, task, None, train.make_mesh(), eval_fn, predict_fn, max_decode_length=6)


def test_exact_match_by_input_length_skips_filler_rows():
  # Wrong: row 1 of batch 0 ("abc") and row 0 of batch 1 ("abcd"); lengths 2, 3, 2 | 4, 1.
  results = _evaluate(_Task(is_text=False), {0: [1], 1: [0]})
  assert results["valid/exact_match"] == pytest.approx(3 / 5)
  by_length = {k: v for k, v in results.items() if "by_length" in k}
  assert by_length == {"valid/exact_match_by_length/1": 1.0, "valid/exact_match_by_length/2": 1.0,
                       "valid/exact_match_by_length/3": 0.0, "valid/exact_match_by_length/4": 0.0}
  assert not any("by_length" in k for k in _evaluate(_Task(is_text=False), {}, eval_by_length=False))


def test_bleu_scores_decoded_hypotheses_against_the_raw_references():
  task = _Task(is_text=True)
  results = _evaluate(task, {})
  hypotheses = ["ab", "abc", "ab", "abcd", "a"]
  assert results["valid/bleu"] == pytest.approx(metrics.bleu(hypotheses, task.raw))
  assert results["valid/bleu"] < 100.0  # decoded targets would have scored 100


def test_bleu_by_source_length_bucket_scores_each_buckets_sentences_alone():
  task = _Task(is_text=True)  # input lengths 2, 3, 2, 4, 1; bucket 1-2 holds rows 0, 2, 4, the open 4+ row 3
  results = _evaluate(task, {0: [1]}, eval_by_length=False, buckets=(2, 3))
  hyps = ["ab", "hbc", "ab", "abcd", "a"]
  assert {k: v for k, v in results.items() if "sentences" in k} == {
      "valid/sentences_by_length/1-2": 3.0, "valid/sentences_by_length/3": 1.0, "valid/sentences_by_length/4+": 1.0}
  for name, rows in (("1-2", [0, 2, 4]), ("3", [1]), ("4+", [3])):
    want = [hyps[i] for i in rows], [task.raw[i] for i in rows]
    assert results[f"valid/bleu_by_length/{name}"] == pytest.approx(metrics.bleu(*want))
    assert results[f"valid/chrf_by_length/{name}"] == pytest.approx(metrics.chrf(*want))
  assert results["valid/chrf_by_length/3"] < results["valid/chrf_by_length/4+"]  # the wrong row is alone there
  assert evaluation.bucket_names((10, 11, 20)) == ["1-10", "11", "12-20", "21+"]
  assert not any("by_length" in k for k in _evaluate(task, {}, eval_by_length=False))


def test_decode_limits_read_the_inputs_only():
  inputs = np.array([[5, 6, 7, 0, 0], [5, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(train.decode_limits(inputs, 0, 50, 64), [53, 51, 50])
  np.testing.assert_array_equal(train.decode_limits(inputs, 0, 50, 52), [52, 51, 50])


def test_changing_the_references_changes_no_hypothesis(monkeypatch):
  """The decode limit comes from the inputs: the hypotheses are the same whatever the targets say."""
  def hypotheses(target_width):
    task = _Task(is_text=True)
    for b in task.batches:  # longer references, padded wider (the old limit was the targets' width)
      b["targets"] = np.pad(b["targets"], ((0, 0), (0, target_width - b["targets"].shape[1])))
    config = rpr_config.Eval(eval_splits=("valid",), max_eval_batches=None, eval_by_length=False,
                             decode_extra_length=2)

    def predict_fn(params, inputs, max_decode_len):
      # A model that never stops: it writes "a" forever, so only the limit ends a row.
      return np.full((inputs.shape[0], max_decode_len), task.vocab.encode("a")[0], np.int32)

    def eval_fn(params, batch):
      return {"loss_sum": 1.0, "weight_sum": 2.0, "correct_sum": 1.0}

    seen = []
    monkeypatch.setattr(metrics, "bleu", lambda hyps, refs: seen.extend(hyps) or 0.0)
    train.evaluate(config, task, None, train.make_mesh(), eval_fn, predict_fn, max_decode_length=64)
    return seen

  hyps = hypotheses(6)
  assert hyps == ["a" * (len(t) + 2) for t in ("ab", "abc", "ab", "abcd", "a")]  # input length + 2
  assert hypotheses(40) == hyps


def test_an_evaluation_logs_its_batches_and_how_to_cap_it_when_uncapped(monkeypatch, caplog):
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)
  monkeypatch.setattr(evaluation, "HINT_AFTER_SECONDS", -1.0)  # as if the ETA were long
  caplog.set_level(logging.INFO, logger="absl")
  _evaluate(_Task(is_text=True), {})
  first, second, last = [r.getMessage() for r in caplog.records if r.module == "progress"]
  assert first.startswith("evaluation of valid (loss and decoding): 1/2 batches, ") and "ETA 0:" in first
  assert second.startswith("evaluation of valid (loss and decoding): 2/2 batches, ")
  assert second.endswith("cap it for a short run with --config.max_eval_batches=N (N batches per split)")
  assert last.startswith("evaluation of valid (loss and decoding): 2 batches done in 0:00:")


def test_a_capped_evaluation_counts_to_its_cap_and_gives_no_hint(monkeypatch, caplog):
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)
  monkeypatch.setattr(evaluation, "HINT_AFTER_SECONDS", -1.0)
  caplog.set_level(logging.INFO, logger="absl")
  config = rpr_config.Eval(eval_splits=("valid", "test"), max_eval_batches=1, decode_extra_length=50)
  task = _Task(is_text=False)
  train.evaluate(config, task, None, train.make_mesh(), lambda p, b: {"loss_sum": 1.0, "weight_sum": 2.0},
                 lambda p, inputs, n: task.batches[0]["targets"], max_decode_length=6)
  lines = [r.getMessage() for r in caplog.records if r.module == "progress"]
  assert lines[0].startswith("evaluation of valid+test (loss and decoding): 1/2 batches, in valid, ")
  assert lines[1].startswith("evaluation of valid+test (loss and decoding): 2/2 batches, in test, ")
  assert lines[2].startswith("evaluation of valid+test (loss and decoding): 2 batches done in ")
  assert not any("max_eval_batches" in line for line in lines)
