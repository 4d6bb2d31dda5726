"""rpr.train.evaluate with stand-in steps: exact match per input length, and BLEU against the raw references."""

import ml_collections
import numpy as np
import pytest

from rpr import metrics
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


def _evaluate(task, wrong_rows, eval_by_length=True):
  config = ml_collections.ConfigDict({"eval_splits": ("valid",), "max_eval_batches": None,
                                      "eval_by_length": eval_by_length})
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

  return train.evaluate(config, task, None, train.make_mesh(), eval_fn, predict_fn)


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
