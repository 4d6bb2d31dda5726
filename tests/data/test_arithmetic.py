"""Arithmetic data set: TFDS builder splits, the Task's batches, and the bag-of-characters bounds."""

from collections import Counter

import numpy as np
import pytest

from rpr.data import arithmetic, bounds
from rpr.data.task import EOS, PAD
from tests.conftest import assert_rows_are_slices

SMALL, TINY = "n100_addsub", "n10_addsub"


def _answer(text: str) -> str:
  """Independent oracle: split at the operator (operands are non-negative, so it is never first)."""
  for k, c in enumerate(text):
    if c in "+-" and k > 0:
      a, b = int(text[:k]), int(text[k + 1:])
      return str(a + b if c == "+" else a - b)
  raise AssertionError(f"no operator in {text!r}")


def _read_split(builder, split):
  src = builder.as_data_source(split)
  recs = src.__getitems__(list(range(len(src))))
  return [r["inputs"].decode() for r in recs], [r["targets"].decode() for r in recs]


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("tfds_small")
  arithmetic.prepare(SMALL, d)
  return d


def test_config_names_and_lengths():
  full = arithmetic.config_by_name(arithmetic.ArithmeticBuilder.DEFAULT_BUILDER_CONFIG_NAME)
  assert (full.max_operand, full.ops, full.num_examples, full.test_size) == (1000, "+-", 2_000_000, 10_000)
  # "999+999" and answers "1998" / "-999"
  assert (full.max_input_length, full.max_target_length) == (7, 4)
  small = arithmetic.config_by_name(SMALL)
  assert (small.num_examples, small.test_size, small.max_input_length, small.max_target_length) == (20_000, 2_000, 5, 3)
  tiny = arithmetic.config_by_name(TINY)
  assert (tiny.test_size, tiny.max_input_length, tiny.max_target_length) == (20, 3, 2)  # "18", "-9"
  assert arithmetic.make_config(50, "-").name == "n50_sub"
  with pytest.raises(ValueError):
    arithmetic.make_config(10, "*")


def test_builder_splits_counts_answers_order(small_dir):
  builder = arithmetic.ArithmeticBuilder(config=SMALL, data_dir=small_dir)
  assert builder.info.file_format.value == "array_record"
  tr_x, tr_y = _read_split(builder, "train")
  te_x, te_y = _read_split(builder, "test")
  assert (len(tr_x), len(te_x)) == (18_000, 2_000)
  assert not set(tr_x) & set(te_x)
  expected = {f"{i}{o}{j}" for i in range(100) for j in range(100) for o in "+-"}
  assert set(tr_x) | set(te_x) == expected and len(expected) == 2 * 100**2
  assert all(_answer(x) == y for x, y in zip(tr_x + te_x, tr_y + te_y))
  # Stored in enumeration order (i, j, operator), exactly as split_examples says.
  ref = arithmetic.split_examples(arithmetic.config_by_name(SMALL))
  assert (tr_x, tr_y) == ref["train"] and (te_x, te_y) == ref["test"]


def test_builder_is_deterministic_across_dirs(tmp_path):
  got = []
  for sub in ("a", "b"):
    b = arithmetic.prepare(TINY, tmp_path / sub)
    got.append({s: _read_split(b, s) for s in ("train", "test")})
  assert got[0] == got[1]
  assert len(got[0]["test"][0]) == 20 and len(got[0]["train"][0]) == 180


def test_held_out_mask_depends_on_examples_not_order():
  x, _ = arithmetic.enumerate_examples(arithmetic.config_by_name("n100_addsub"))
  perm = np.random.default_rng(0).permutation(len(x))
  a = {x[k] for k in np.flatnonzero(arithmetic.held_out_mask(x, 500))}
  shuffled = [x[k] for k in perm]
  b = {shuffled[k] for k in np.flatnonzero(arithmetic.held_out_mask(shuffled, 500))}
  assert a == b and len(a) == 500


def _rows(task, batch):
  return [(task.vocab.decode(x), task.vocab.decode(y)) for x, y in zip(batch["inputs"], batch["targets"])]


def test_train_batch_pure_in_seed_and_step(small_dir):
  t1 = arithmetic.ArithmeticTask(SMALL, small_dir, batch_size=16, seed=3)
  # Random access instead of preloaded arrays: must give the very same batches.
  t2 = arithmetic.ArithmeticTask(SMALL, small_dir, batch_size=16, seed=3, preload=False)
  other = arithmetic.ArithmeticTask(SMALL, small_dir, batch_size=16, seed=4)
  straight = [t1.train_batch(s) for s in range(5)]
  resumed = t2.train_batch(4)  # fresh task jumping straight to step 4, as after a restart
  for k in straight[4]:
    np.testing.assert_array_equal(straight[4][k], resumed[k])
    np.testing.assert_array_equal(straight[4][k], t1.train_batch(4)[k])
  np.testing.assert_array_equal(straight[1]["targets"], t2.train_batch(1)["targets"])
  assert not np.array_equal(straight[0]["inputs"], straight[1]["inputs"])
  assert not np.array_equal(straight[0]["inputs"], other.train_batch(0)["inputs"])
  assert_rows_are_slices(t1, (0, 4))
  assert_rows_are_slices(t2, (4,))
  b = straight[0]
  assert b["inputs"].shape == (16, 5) and b["targets"].shape == (16, 4)
  assert b["inputs"].dtype == np.int32 and b["targets"].dtype == np.int32
  assert all(_answer(x) == y for x, y in _rows(t1, b))
  # Every target row is answer + EOS + PAD...
  for row in b["targets"]:
    n = int(np.argmax(row == EOS))
    assert row[n] == EOS and (row[:n] >= 3).all() and (row[n + 1:] == PAD).all()


def test_train_epochs_visit_each_example_once(tmp_path):
  task = arithmetic.ArithmeticTask(TINY, tmp_path, batch_size=32, seed=0, preload=False)
  n = task.num_examples("train")  # 180: epochs end inside batches
  steps = 3 * n // 32 + 1
  idx = np.concatenate([task.train_indices(s) for s in range(steps)])
  for e in range(3):
    assert sorted(idx[e * n:(e + 1) * n].tolist()) == list(range(n))
  assert not np.array_equal(idx[:n], idx[n:2 * n])  # reshuffled per epoch


def test_eval_batches_cover_test_once(small_dir):
  task = arithmetic.ArithmeticTask(SMALL, small_dir, batch_size=8, eval_batch_size=300)
  batches = list(task.eval_batches("test"))
  assert len(batches) == 7  # 2000 = 6 * 300 + 200
  assert all(b["inputs"].shape == (300, 5) and b["targets"].shape == (300, 4) for b in batches)
  last = batches[-1]
  assert (last["inputs"][200:] == PAD).all() and (last["targets"][200:] == PAD).all()
  rows = [r for b in batches for r, y in zip(_rows(task, b), b["targets"]) if y.any()]
  assert rows == list(zip(*arithmetic.split_examples(task.config)["test"]))
  # Fixed order: a second pass yields the same arrays.
  again = list(task.eval_batches("test"))
  assert all(np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(batches, again))


def _brute_force(inputs, targets, key):
  """Best constant-per-group predictor by trying every target seen in each group."""
  groups = {}
  for x, y in zip(inputs, targets):
    groups.setdefault(key(x), []).append(y)
  hits = sum(max(sum(y == guess for y in ys) for guess in set(ys)) for ys in groups.values())
  return hits / len(inputs)


def test_bounds_match_brute_force():
  config = arithmetic.make_config(30, "+-")
  x, y = arithmetic.enumerate_examples(config)
  multiset = lambda s: frozenset(Counter(s).items())
  pair = lambda s: frozenset({s, s[::-1]})
  bag, rev = bounds.bag_of_chars_bound(x, y), bounds.reversal_bound(x, y)
  assert bag == pytest.approx(_brute_force(x, y, multiset))
  assert rev == pytest.approx(_brute_force(x, y, pair))
  assert bounds.view_bound(x, y, bounds.identity_view) == 1.0
  assert 0 < bag < rev < 1
  # Same on a held-out subset, as for the test-split ceiling.
  m = arithmetic.held_out_mask(x, 180)
  tx, ty = [x[k] for k in np.flatnonzero(m)], [y[k] for k in np.flatnonzero(m)]
  assert bounds.bag_of_chars_bound(tx, ty) == pytest.approx(_brute_force(tx, ty, multiset))
  assert bounds.reversal_bound(tx, ty) == pytest.approx(_brute_force(tx, ty, pair))


def test_bounds_single_digits_by_hand():
  # i+j and j+i share a bag and an answer (100 right); i-i is alone (10 right);
  # i-j and j-i (i != j) share a bag, answers differ: one of each pair (45 right).
  b = bounds.arithmetic_bounds(TINY)
  assert b["bag_all"] == pytest.approx(155 / 200)
  # For one-digit operands reversing "i+j" gives "j+i": the same grouping.
  assert b["reversal_all"] == pytest.approx(b["bag_all"])
  assert 0 <= b["bag_fitted"] <= b["bag_test"] <= 1


def test_fitted_accuracy():
  tr_x, tr_y = ["ab", "ba", "ba", "cd"], ["1", "2", "2", "3"]
  # group {a,b}: train majority "2"; group {c,d}: "3"; group {e}: unseen.
  assert bounds.fitted_accuracy(tr_x, tr_y, ["ab", "dc", "e"], ["2", "4", "5"]) == pytest.approx(1 / 3)
