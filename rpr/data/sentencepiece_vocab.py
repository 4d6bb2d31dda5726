"""A SentencePiece vocabulary with the Task protocol's ids, trained once and kept in one file.

Ids follow ``rpr.data.task``: PAD=0, BOS=1, EOS=2, and UNK=3 after them. They
are fixed in the trainer (``pad_id=0, bos_id=1, eos_id=2, unk_id=3``) rather
than remapped afterwards, so the model file alone says what every id means.

``load_or_train(path, sentences, ...)`` trains from an iterable of strings
(streamed to the trainer through ``sentence_iterator``, so no text file is
written) only if ``path`` does not exist yet; the model is written with a
rename so a run killed mid-write never leaves a truncated file that the next
run would load.
"""

from __future__ import annotations

import io
import os
from typing import Callable, Iterable, Iterator, Sequence

import sentencepiece as spm
from absl import logging

from rpr import progress, tokens
from rpr.data.task import BOS, EOS, PAD

UNK = 3


class SentencePieceVocab:
  """Vocab protocol over a SentencePiece model: PAD=0, BOS=1, EOS=2, UNK=3."""

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    ids = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(), self._sp.unk_id())
    if ids != (PAD, BOS, EOS, UNK):
      # A model from elsewhere (e.g. T5's, PAD=0 EOS=1) would silently shift
      # every special token the engine relies on.
      raise ValueError(f"SentencePiece model has (pad, bos, eos, unk) ids {ids}, "
                       f"the Task protocol needs {(PAD, BOS, EOS, UNK)}")
    self.size = self._sp.get_piece_size()
    self.pad_id, self.bos_id, self.eos_id, self.unk_id = PAD, BOS, EOS, UNK

  @classmethod
  def load(cls, path: str | os.PathLike) -> "SentencePieceVocab":
    """The model at ``path``; :class:`rpr.data.DataError` naming it if it does not parse (cut short, damaged)."""
    with open(path, "rb") as f:
      proto = f.read()
    try:
      return cls(proto)
    except RuntimeError as e:
      from rpr import data

      cause = (str(e).strip().splitlines() or ["RuntimeError"])[0][:200]
      raise data.DataError(f"{path} is not a SentencePiece model that loads ({len(proto)} bytes: {cause}); it is "
                           "damaged: delete it and the next run trains it again from the same data") from None

  def encode(self, text: str) -> list[int]:
    """Text to ids, without BOS/EOS."""
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    """Many texts at once; SentencePiece spreads them over threads (-1: all cores)."""
    return self._sp.encode(list(texts), out_type=int, num_threads=num_threads)

  def decode(self, ids: Sequence[int]) -> str:
    """Ids to text; stops at EOS, skips PAD and BOS."""
    return self._sp.decode(tokens.content(ids))


def train_sentencepiece(
    sentences: Iterable[str],
    vocab_size: int,
    *,
    model_type: str = "unigram",
    character_coverage: float = 0.9999,
    byte_fallback: bool = True,
    hard_vocab_limit: bool = True,
    num_threads: int | None = None,
) -> bytes:
  """Trains a model on ``sentences`` and returns its serialized proto.

  ``byte_fallback`` spends 256 pieces on raw bytes so that no character is
  ever UNK (a decoded hypothesis then never contains " ⁇ " for a rare
  character of the reference); it needs ``vocab_size`` above ~260.
  ``hard_vocab_limit=False`` lets training succeed with fewer pieces than
  asked when the text cannot support that many (tiny or random corpora).
  """
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=buf,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      byte_fallback=byte_fallback,
      hard_vocab_limit=hard_vocab_limit,
      pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK,
      num_threads=num_threads or os.cpu_count() or 1,
      minloglevel=2,  # the trainer logs every EM iteration to stderr otherwise
  )
  return buf.getvalue()


def _counted(sentences: Iterable[str], counter: progress.Progress) -> Iterator[str]:
  for sentence in sentences:
    counter.update()
    yield sentence
  counter.note = "all read, SentencePiece trains on them"


def load_or_train(
    path: str | os.PathLike,
    sentences: Callable[[], Iterable[str]],
    vocab_size: int,
    *,
    hard_vocab_limit: bool = True,
    **train_kwargs,
) -> SentencePieceVocab:
  """The vocabulary at ``path``; trained from ``sentences()`` and saved there first if absent.

  ``sentences`` is a callable so that nothing (e.g. a TFDS pipeline) is set up
  when the model already exists, which is the resume case.
  """
  path = os.fspath(path)
  if os.path.exists(path):
    vocab = SentencePieceVocab.load(path)
    # An existing model with another size belongs to another configuration:
    # training on with it would silently change the experiment.
    if vocab.size > vocab_size or (hard_vocab_limit and vocab.size != vocab_size):
      raise ValueError(f"{path} has {vocab.size} pieces but {vocab_size} were asked for; "
                       "use a fresh workdir or the matching vocab_size")
    logging.info("Loaded SentencePiece vocabulary %s (%d pieces)", path, vocab.size)
    return vocab
  logging.info("Training a %d-piece SentencePiece vocabulary for %s", vocab_size, path)
  # The trainer reads every sentence, then trains without a word: the lines count what it has read, then time it.
  counter = progress.Progress(f"vocabulary {os.path.basename(path)}", unit="sentences")
  with counter.ticking():
    proto = train_sentencepiece(_counted(sentences(), counter), vocab_size, hard_vocab_limit=hard_vocab_limit,
                                **train_kwargs)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(proto)
  os.replace(tmp, path)
  return SentencePieceVocab(proto)
