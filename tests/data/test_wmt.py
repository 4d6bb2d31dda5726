"""The WMT14 data path end to end on TFDS mock data: vocabulary, cache, batches by step, eval.

``tfds.testing.mock_data`` with ``MockPolicy.USE_CODE`` builds the real
``wmt14_translate/de-en`` builder from its code and yields random strings for
its features instead of downloading anything; every split yields the same
examples. The vocabulary is tiny (300 pieces, most of them the byte fallback)
so that it trains in milliseconds yet round-trips any text.
"""

import collections

import numpy as np
import pytest
import tensorflow_datasets as tfds

from rpr.data import sentencepiece_vocab, text, wmt
from rpr.data.task import BOS, EOS, PAD
from tests.conftest import assert_rows_are_slices

NUM_EXAMPLES = 200
SETTINGS = dict(vocab_size=300, spm_hard_vocab_limit=False, spm_train_pairs=100,
                tokens_per_batch=96, max_length=16, bucket_boundaries=(12, 14), eval_batch_size=32,
                seed=3)


@pytest.fixture(scope="module")
def mocked(tmp_path_factory):
  """(task, workdir) built inside mock data; the mock stays on for the module's tests."""
  workdir = str(tmp_path_factory.mktemp("wmt"))
  with tfds.testing.mock_data(num_examples=NUM_EXAMPLES, policy=tfds.testing.MockPolicy.USE_CODE):
    yield wmt.WmtTask(workdir, **SETTINGS), workdir


@pytest.fixture(scope="module")
def train_texts(mocked):
  task, _ = mocked
  sources, targets = [], []
  for s, t in task._texts("train"):
    sources += s
    targets += t
  return sources, targets


def _row(ids):
  """The tokens of a padded row before its EOS; checks the row is tokens, EOS, PAD... ."""
  ids = list(ids)
  n = ids.index(EOS)
  assert PAD not in ids[:n] and BOS not in ids[:n]
  assert all(i == PAD for i in ids[n + 1:])
  return ids[:n]


def test_vocab_has_protocol_ids_and_round_trips_text(mocked):
  vocab = mocked[0].vocab
  assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3)
  assert vocab.size == 300
  text = "The quick brown fox jumps over the lazy dog. Grüße aus München, 1984!"
  ids = vocab.encode(text)
  assert min(ids) > 3  # no specials, and no UNK thanks to the byte fallback
  assert vocab.decode(ids) == text
  assert vocab.decode([BOS] + ids + [EOS] + ids + [PAD]) == text


def test_second_construction_loads_vocab_and_data_without_tfds(mocked, monkeypatch):
  task, workdir = mocked

  def fail(*args, **kwargs):
    raise AssertionError("a resumed task must not read TFDS, retrain or re-tokenise")

  monkeypatch.setattr(sentencepiece_vocab, "train_sentencepiece", fail)
  monkeypatch.setattr(wmt, "tokenize_pairs", fail)
  monkeypatch.setattr(wmt.WmtTask, "_texts", fail)
  again = wmt.WmtTask(workdir, **SETTINGS)
  assert again.vocab.model_proto == task.vocab.model_proto
  # A fresh instance (cold epoch cache) gives the same batches: resume is exact.
  for step in (0, 7, again.batches.batches_per_epoch + 1):
    a, b = task.train_batch(step), again.train_batch(step)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    np.testing.assert_array_equal(a["targets"], b["targets"])


def test_asking_for_another_vocab_size_is_an_error(mocked):
  with pytest.raises(ValueError, match="pieces"):
    wmt.WmtTask(mocked[1], **{**SETTINGS, "vocab_size": 200})


def test_train_batches_respect_budget_and_hold_the_data(mocked, train_texts):
  task, _ = mocked
  vocab, batches = task.vocab, task.batches
  sources, targets = train_texts
  assert len(task.train) == NUM_EXAMPLES
  assert len(batches.shapes) >= 2  # several buckets are exercised
  shapes = set()
  for step in range(2 * batches.batches_per_epoch + 1):
    batch = task.train_batch(step)
    length, index = batches(step)
    B, L = batch["inputs"].shape
    assert batch["targets"].shape == (B, L) and L == length and len(index) == B
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    assert B * L <= SETTINGS["tokens_per_batch"] and L <= SETTINGS["max_length"]
    shapes.add((B, L))
    for row_in, row_out, i in zip(batch["inputs"], batch["targets"], index):
      assert _row(row_in) == vocab.encode(sources[i])
      assert _row(row_out) == vocab.encode(targets[i])
  assert shapes == set(batches.shapes)
  assert_rows_are_slices(task, range(batches.batches_per_epoch))  # every bucket's shape


def test_epochs_use_each_kept_example_at_most_once_and_drop_long_ones(mocked):
  task, _ = mocked
  batches = task.batches
  lengths = np.maximum(task.train.source_lengths, task.train.target_lengths) + 1
  assert batches.num_dropped == int((lengths > SETTINGS["max_length"]).sum()) > 0
  K = batches.batches_per_epoch
  epochs = []
  for e in range(2):
    seen = np.concatenate([batches(e * K + k)[1] for k in range(K)])
    assert len(seen) == len(set(seen.tolist()))
    assert (lengths[seen] <= SETTINGS["max_length"]).all()
    epochs.append(seen)
  assert not np.array_equal(epochs[0], epochs[1])  # reshuffled per epoch


def test_order_depends_on_seed_only(mocked):
  task, _ = mocked
  args = (task.train.source_lengths, task.train.target_lengths)
  kwargs = dict(tokens_per_batch=96, max_length=16, boundaries=task.boundaries)
  same = text.TokenBudgetBatches(*args, seed=3, **kwargs)
  other = text.TokenBudgetBatches(*args, seed=4, **kwargs)
  steps = range(task.batches.batches_per_epoch)
  ours = [task.batches(s)[1].tolist() for s in steps]
  assert [same(s)[1].tolist() for s in reversed(steps)][::-1] == ours  # any access order
  assert [other(s)[1].tolist() for s in steps] != ours


def test_eval_batches_cover_the_split_once_in_fixed_order(mocked):
  task, _ = mocked
  vocab = task.vocab
  batches = list(task.eval_batches("validation"))
  refs, srcs = task.references("validation"), task.sources("validation")
  assert len(refs) == len(srcs) == NUM_EXAMPLES
  rows = []
  for batch in batches:
    assert batch["inputs"].shape[0] == batch["targets"].shape[0] == SETTINGS["eval_batch_size"]
    for row_in, row_out in zip(batch["inputs"], batch["targets"]):
      if not row_in.any():  # an all-PAD filler row
        assert not row_out.any()
        continue
      rows.append((_row(row_in), _row(row_out)))
  assert len(rows) == NUM_EXAMPLES  # only the last batch has fillers
  assert len(batches) == -(-NUM_EXAMPLES // SETTINGS["eval_batch_size"])
  assert rows == [(vocab.encode(s), vocab.encode(r)) for s, r in zip(srcs, refs)]
  # Exactly the split's examples, each once.
  split = [(s, t) for src, tgt in task._texts("validation") for s, t in zip(src, tgt)]
  assert collections.Counter(zip(srcs, refs)) == collections.Counter(split)
  again = list(task.eval_batches("validation"))
  for a, b in zip(batches, again):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])


def test_make_task_reads_its_keys_from_a_run_config(mocked):
  # A flat run config also holds model and optimiser keys: those are ignored.
  config = {"dataset": "wmt14", "d_model": 64, "batch_size": 8, "language_pair": "de-en", **SETTINGS}
  task = wmt.make_task(config, mocked[1], num_devices=4)
  assert task.vocab.model_proto == mocked[0].vocab.model_proto
  assert (task.source_lang, task.target_lang) == ("en", "de")
  assert task.batches.shapes and all(B % 4 == 0 for B, _ in task.batches.shapes)


def test_token_budget_batches_on_synthetic_lengths():
  rng = np.random.default_rng(0)
  src, tgt = rng.integers(1, 120, 5000), rng.integers(1, 120, 5000)
  b = text.TokenBudgetBatches(src, tgt, tokens_per_batch=1000, max_length=100,
                             boundaries=text.default_bucket_boundaries(100), batch_multiple=4)
  assert all(B % 4 == 0 and B * L <= 1000 for B, L in b.shapes)
  assert b.num_kept + b.num_dropped == 5000
  with pytest.raises(ValueError, match="tokens_per_batch"):
    text.TokenBudgetBatches(src, tgt, tokens_per_batch=99, max_length=100, boundaries=[50])
