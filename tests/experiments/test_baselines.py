"""The real-text baselines: TF-IDF retrieval, the LM's documents, and the report section that sets them beside
groups."""

import json
import types

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


DATA = {"translation": {"retrieval": {"test": {"bleu": 13.0, "chrf": 30.0, "verses": 3}},
                        "copy": {"test": {"bleu": 2.0, "chrf": 20.0, "verses": 3}}},
        "lm": {"chosen_order": "4", "orders": {"3": {"splits": {"test": {"perplexity": 40.0, "tokens": 9}}},
                                                "4": {"splits": {"test": {"perplexity": 32.0, "tokens": 9}}}}}}


def _report(metric, groups):
  return types.SimpleNamespace(spec=types.SimpleNamespace(metric=metric),
                               groups=[types.SimpleNamespace(label=k, values=v) for k, v in groups.items()])


def test_the_section_gives_each_groups_margin_on_its_worst_seed(tmp_path, monkeypatch):
  path = tmp_path / "baselines.json"
  path.write_text(json.dumps(DATA))
  monkeypatch.setattr(baselines, "RESULTS", str(path))
  text = "\n".join(baselines.baselines_section(_report("test/bleu", {"shaw": [14.0, 15.5], "t5": [12.0, 14.0]})))
  assert "retrieval: the nearest training verse's English (TF-IDF)**: test/bleu 13.00" in text
  assert "Better on every seed: shaw (by 1.00). Not on every seed: t5." in text
  assert "copy: the French source**: test/bleu 2.00" in text and "shaw (by 12.00), t5 (by 10.00)" in text
  # Perplexity: lower is better, and the chosen order is the baseline.
  text = "\n".join(baselines.baselines_section(_report("test/perplexity", {"k=2": [31.0, 31.5], "k=0": [70.0]})))
  assert "Kneser-Ney 4-gram**: test/perplexity 32.00" in text and "40.00" not in text
  assert "Better on every seed: k=2 (by 0.50). Not on every seed: k=0." in text
  assert baselines._baselines_of("test/exact_match") == {}
