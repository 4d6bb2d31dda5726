"""WMT14 translation as a Task: Shaw et al.'s EN-DE setup (batching and eval in ``rpr.data.text``).

Data. TFDS ``wmt14_translate/de-en`` (about 4.5M training pairs); source
English, target German by default. Eval splits are TFDS split names:
``"validation"`` is newstest2013 (Shaw's dev set, Tables 2-3) and ``"test"``
is newstest2014 (Table 1).

Vocabulary. One SentencePiece model shared by both languages (default
32,768 pieces), trained on the first ``spm_train_pairs`` training pairs (both
sides; TFDS stores the split shuffled, so the head is a sample) and kept as
``workdir/spm.model``. A rerun with the same workdir loads it instead of
retraining.

Training data. The training split is tokenised once into flat numpy arrays
under ``workdir/data/<name>/`` (ids as uint16 when the vocabulary allows, plus
int64 offsets) and memory-mapped afterwards; the name includes a digest of the
vocabulary so a different model can never be paired with stale ids. For the
4.5M WMT14 EN-DE pairs at ~28 pieces per sentence that is about
4.5M x 2 x 28 x 2 B = 0.5 GB of ids plus 72 MB of offsets on disk, paged in
on demand. Building it streams the split once (minutes on a few cores).

Batches and evaluation: :mod:`rpr.data.text` (token-budget buckets addressed
by step; eval sorted by length, with the raw references for BLEU).

Construction. ``WmtTask(workdir, data_dir, ...)`` directly, or
``make_task(run_config, workdir, num_devices)`` which reads ``CONFIG_KEYS``
from a flat run config. Tests run the whole path on
``tfds.testing.mock_data`` (tests/data/test_wmt.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import re
from typing import Any, Iterator, Sequence

import tensorflow_datasets as tfds
from absl import logging

from rpr.data import corpus, sentencepiece_vocab
from rpr.data.text import DEFAULT_MAX_LENGTH, TokenizedPairs, TranslationTask, tokenize_pairs

tfds.display_progress_bar(False)  # no TFDS progress bars in a run's log

DEFAULT_VOCAB_SIZE = 32_768
DEFAULT_TOKENS_PER_BATCH = 25_000


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


class WmtTask(TranslationTask):
  """WMT14 translation implementing ``rpr.data.task.Task`` (see the module docstring)."""

  def __init__(
      self,
      workdir: str,
      data_dir: str | None = None,
      *,
      language_pair: Sequence[str] = ("de", "en"),
      source_lang: str = "en",
      vocab_size: int = DEFAULT_VOCAB_SIZE,
      tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
      max_length: int = DEFAULT_MAX_LENGTH,
      bucket_boundaries: Sequence[int] | None = None,
      batch_multiple: int = 1,
      seed: int = 0,
      train_split: str = "train",
      spm_train_pairs: int = 1_000_000,
      spm_byte_fallback: bool = True,
      spm_hard_vocab_limit: bool = True,
      eval_batch_size: int = 64,
      mock_examples: int | None = None,
  ):
    """Loads or builds the vocabulary and the tokenised training data.

    Args:
      workdir: run directory; holds ``spm.model`` and ``data/``.
      data_dir: TFDS data directory (None: TFDS's default).
      language_pair: the TFDS config, ``("de", "en")`` -> ``wmt14_translate/de-en``.
      source_lang: which side of the pair is the input; the other is the target.
      vocab_size: SentencePiece pieces, shared by both languages.
      tokens_per_batch, max_length, bucket_boundaries, batch_multiple, seed,
        eval_batch_size: batching, see ``rpr.data.text.TranslationTask``.
      train_split: TFDS split (slicing allowed, e.g. ``"train[:10%]"``).
      spm_train_pairs: how many leading training pairs train the vocabulary.
      spm_byte_fallback: byte pieces instead of UNK (needs vocab_size > ~260).
      spm_hard_vocab_limit: False lets a small corpus give fewer pieces.
      mock_examples: read TFDS mock data (this many random pairs per split)
        instead of WMT, offline: a smoke run, never a result.
    """
    if len(language_pair) != 2 or source_lang not in language_pair:
      raise ValueError(f"source_lang {source_lang!r} must be one side of language_pair {language_pair!r}")
    self.workdir, self.data_dir = os.fspath(workdir), data_dir
    self.config_name = "-".join(language_pair)
    self.source_lang = source_lang
    self.target_lang = [l for l in language_pair if l != source_lang][0]
    self._builder = None
    self.mock_examples, self._read = mock_examples, {}

    vocab = sentencepiece_vocab.load_or_train(
        os.path.join(self.workdir, "spm.model"),
        lambda: self._sentences(train_split, spm_train_pairs),
        vocab_size, byte_fallback=spm_byte_fallback, hard_vocab_limit=spm_hard_vocab_limit)

    digest = hashlib.sha256(vocab.model_proto).hexdigest()[:12]
    name = f"wmt14_{self.config_name}_{_slug(train_split)}_{self.source_lang}2{self.target_lang}_spm{digest}"
    self.train_cache_dir = os.path.join(self.workdir, "data", name)
    if not os.path.exists(os.path.join(self.train_cache_dir, "meta.json")):
      logging.info("Tokenising %s into %s", train_split, self.train_cache_dir)
      tokenize_pairs(self._texts(train_split), vocab, self._num_examples(train_split)).save(self.train_cache_dir)
    if mock_examples:
      # TFDS's mock patches the process, so it must not be active while orbax saves in a background
      # thread: read the evaluation splits now, before training starts.
      logging.warning("mock_examples = %d: WMT is replaced by TFDS mock data (random strings).", mock_examples)
      self._read = {split: self.split_texts(split) for split in ("validation", "test")}
    super().__init__(vocab, TokenizedPairs.load(self.train_cache_dir), tokens_per_batch=tokens_per_batch,
                     max_length=max_length, bucket_boundaries=bucket_boundaries,
                     batch_multiple=batch_multiple, seed=seed, eval_batch_size=eval_batch_size)

  # TFDS access is lazy: a resumed run with its vocabulary and tokenised
  # training data in the workdir touches TFDS only to evaluate.
  def _tfds_builder(self) -> tfds.core.DatasetBuilder:
    if self._builder is None:
      self._builder = tfds.builder(f"wmt14_translate/{self.config_name}", data_dir=self.data_dir)
      corpus.generate(self._builder)  # hours the first time (WMT14's download), a no-op once prepared
    return self._builder

  def _reading(self):
    # The mock patches TFDS only while TFDS is read, not the rest of the run (orbax's saves among it).
    return (tfds.testing.mock_data(num_examples=self.mock_examples, policy=tfds.testing.MockPolicy.USE_CODE)
            if self.mock_examples else contextlib.nullcontext())

  def _num_examples(self, split: str) -> int | None:
    """Pairs in ``split`` (slices allowed), from TFDS's metadata, for the tokenising lines' ETA; None for
    mock data, which has none."""
    with self._reading():
      splits = self._tfds_builder().info.splits
      return splits[split].num_examples if len(splits) else None

  def _texts(self, split: str, limit: int | None = None,
             chunk: int = 8192) -> Iterator[tuple[list[str], list[str]]]:
    """Chunks of (source texts, target texts) of ``split`` in stored order."""
    with self._reading():
      ds = self._tfds_builder().as_dataset(split=split, shuffle_files=False)
      if limit is not None:
        ds = ds.take(limit)
      for ex in tfds.as_numpy(ds.batch(chunk)):
        yield ([s.decode("utf-8") for s in ex[self.source_lang]],
               [s.decode("utf-8") for s in ex[self.target_lang]])

  def _sentences(self, split: str, limit: int) -> Iterator[str]:
    for sources, targets in self._texts(split, limit):
      yield from sources
      yield from targets

  def split_texts(self, split: str) -> tuple[list[str], list[str]]:
    if split in self._read:
      return self._read[split]
    chunks = list(self._texts(split))
    return [s for src, _ in chunks for s in src], [t for _, tgt in chunks for t in tgt]


# Run-config keys ``make_task`` reads: ``WmtTask``'s keyword arguments.
CONFIG_KEYS = tuple(k for k in inspect.signature(WmtTask.__init__).parameters
                    if k not in ("self", "workdir", "batch_multiple"))


def make_task(config: Any, workdir: str, num_devices: int = 1) -> WmtTask:
  """A ``WmtTask`` from the run config (ConfigDict, dict, or object with attributes).

  Reads the keys in ``CONFIG_KEYS`` that are present and not None (the rest
  take ``WmtTask``'s defaults) and ignores every other key, since the run
  config also holds the model and optimiser settings. ``max_length``,
  ``seed`` and ``eval_batch_size`` mean what they mean for the other data
  sets; ``tokens_per_batch`` is the global budget. Batch sizes are made
  multiples of ``num_devices`` so the batch splits evenly over the devices.
  The vocabulary and tokenised data go under ``workdir``.
  """
  get = config.get if hasattr(config, "get") else lambda k: getattr(config, k, None)
  kwargs = {k: get(k) for k in CONFIG_KEYS if get(k) is not None}
  if isinstance(kwargs.get("language_pair"), str):  # "de-en"
    kwargs["language_pair"] = kwargs["language_pair"].split("-")
  for k in ("language_pair", "bucket_boundaries"):
    if k in kwargs:
      kwargs[k] = tuple(kwargs[k])
  return WmtTask(workdir, batch_multiple=num_devices, **kwargs)
