"""The real-text baselines: TF-IDF retrieval, the LM's documents, each test book's scores and the README."""

import json

import numpy as np

from experiments import baselines
from rpr import tokens


def test_retrieval_returns_the_nearest_training_verse_and_the_earliest_of_a_tie():
  train = ["le chat dort", "le chien mange", "le chat dort", "la maison brule"]
  queries = ["un chat qui dort", "le chien", "maison maison", "zzz inconnu"]
  # A query with no known word is equally far from every verse: the first one.
  assert baselines.nearest_by_tfidf(train, queries).tolist() == [0, 1, 3, 0]


def test_documents_of_a_stream_end_at_each_eos():
  e = tokens.EOS
  stream = np.asarray([5, 6, e, 7, e, 8, 9, 9, e])
  docs = baselines.documents_of(stream)
  assert [d.tolist() for d in docs] == [[5, 6, e], [7, e], [8, 9, 9, e]]


def test_each_book_is_scored_on_its_own_verses_in_the_order_the_books_first_appear():
  books = ["Luke", "Joshua", "Luke", "Joshua", "Luke"]
  refs = ["the cat sat on the mat", "a dog ran far away", "the bird sang all day", "rain fell on the hill",
          "light came in the morning"]
  hyps = ["the cat sat on the mat", "a dog ran far away", "the bird sang all day", "snow lay on a mountain",
          "dark went out at night"]
  scored = baselines.by_book(books, hyps, refs)
  assert list(scored) == ["Luke", "Joshua"]
  assert scored["Luke"] == baselines.scores(hyps[0::2], refs[0::2])
  assert scored["Joshua"] == baselines.scores(hyps[1::2], refs[1::2])
  assert scored["Luke"]["verses"] == 3 and scored["Joshua"]["verses"] == 2
  assert scored["Luke"]["bleu"] != scored["Joshua"]["bleu"]  # each book's own verses, not the corpus's


def test_the_readme_has_a_row_per_baseline_and_a_column_per_test_book(tmp_path):
  split = {"bleu": 10.0, "chrf": 30.0, "verses": 5}
  data = {"command": "python -m experiments baselines", "date": "today",
          "translation": {name: {s: split for s in ("validation", "test", "test_long")}
                          for name in ("retrieval", "copy")},
          "translation_by_book": {"retrieval": {"Luke": {"bleu": 20.2, "chrf": 37.7, "verses": 1151},
                                                "Proverbs": {"bleu": 2.53, "chrf": 24.2, "verses": 915}},
                                  "copy": {"Luke": {"bleu": 0.13, "chrf": 17.4, "verses": 1151},
                                           "Proverbs": {"bleu": 0.05, "chrf": 15.6, "verses": 915}}},
          "lm": {"chosen_order": "4", "train_tokens": 9,
                 "orders": {"4": {"splits": {"test": {"perplexity": 32.0, "tokens": 9}}}}}}
  baselines.write(data, str(tmp_path))
  readme = (tmp_path / "README.md").read_text()
  assert "| baseline | Luke (1,151) | Proverbs (915) |" in readme
  assert "| retrieval | 20.20 / 37.70 | 2.53 / 24.20 |" in readme
  assert "| copy | 0.13 / 17.40 | 0.05 / 15.60 |" in readme
  assert json.loads((tmp_path / "baselines.json").read_text()) == data
