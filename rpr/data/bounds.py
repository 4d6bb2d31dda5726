"""Exact accuracy ceilings for models that cannot see (all of) the input order.

The bag-of-characters bound. An encoder with no position information (no
absolute encodings, no relative terms, no causal mask) is permutation
equivariant: permuting its input tokens permutes its output states and changes
nothing else, because every layer treats positions identically (token-wise
maps, and attention whose scores depend only on the token states). The decoder
reads the encoder only through cross-attention, and softmax attention over a
set of (key, value) pairs is a function of that set, not of its order. So the
whole model's output, whatever its size and however it is trained, is a
function of the multiset of input characters. Among all functions of the
multiset, the one with the highest exact-match accuracy on a set of examples
predicts, for each multiset, the target most frequent among the examples with
that multiset; so accuracy <= sum over multisets of (largest target count) / N.
The decoder may have positions of its own: they index the output, not the
input, and do not refine what it knows of the input.

Padding does not break this. Masked pads are invisible; unmasked pads are just
extra tokens whose number, ``padded_length - len(input)``, is itself a
function of the multiset (its size), so they add nothing. An EOS or BOS token
on the encoder side is likewise one more fixed element of the multiset.

What breaks it: any position information reaching the encoder. Absolute
encodings; directional relative terms (Shaw's a^K / a^V with clip distance
k >= 1 tell j - i = +1 from -1); a causal mask in the encoder or a
decoder-only model (the mask alone lets a model count its predecessors and so
recover positions); convolutions or recurrence. Shaw's k = 0 clips every
offset to one shared vector, so it carries no position and this bound applies
(the k = 0 row of the paper's Table 2).

Generalisation: any invariance the encoder has gives a "view" of the input
that determines the model's output, and the same argument bounds accuracy by
the best function of the view. A scheme that sees distance but not direction
(e.g. symmetric ALiBi, bias -m|i - j|, in bidirectional attention) is
equivariant under reversing the sequence (the only nontrivial permutation
that preserves all |i - j|), and the reversed states form the same set for
cross-attention, so it cannot tell ``s`` from ``s[::-1]``: its view is the
pair ``{s, s[::-1]}``, canonically ``min(s, s[::-1])``. Finer views give
higher bounds: bag <= reversal <= identity (= 1 for a function data set).
Here padding does matter: the reversal argument needs pads masked (or left
and right padding mirrored), since unmasked right-padding sits at a fixed end
and gives the model an anchor that tells the two directions apart. These are
ceilings, not predictions: a real model may confuse more inputs.

Which examples define the groups. A model is trained on ``train`` and scored
on ``test``. ``view_bound(test)`` groups the test examples by view and lets
each group predict its own most frequent test target: an optimistic (oracle)
ceiling on test accuracy that no view-limited model can beat, whatever it
learned from train. ``fitted_accuracy(train, test)`` is the realistic
counterpart: the accuracy on test of the best view-limited predictor *fit on
train* (majority train target per group; a group unseen in train scores 0).
``view_bound`` over the whole data set is the ceiling for fitting all of it,
and the Bayes rate of the data distribution: with a uniformly drawn test
split, a view-limited function's expected test accuracy is its whole-set
accuracy. The test-split oracle is valid but loose when the split is small
next to the number of groups: most test groups then hold one example, which
the oracle always gets right.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Hashable, Sequence

View = Callable[[str], Hashable]


def bag_view(s: str) -> str:
  """The multiset of characters, canonically as the sorted string."""
  return "".join(sorted(s))


def reversal_view(s: str) -> str:
  """The pair {s, reversed s}, canonically as the smaller of the two."""
  r = s[::-1]
  return s if s <= r else r


def identity_view(s: str) -> str:
  return s


def _group_counts(inputs: Sequence[str], targets: Sequence[str], view: View) -> dict[Hashable, Counter]:
  if len(inputs) != len(targets):
    raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
  groups: dict[Hashable, Counter] = defaultdict(Counter)
  for x, y in zip(inputs, targets):
    groups[view(x)][y] += 1
  return groups


def view_bound(inputs: Sequence[str], targets: Sequence[str], view: View = bag_view) -> float:
  """Best exact-match accuracy on these examples of any function of ``view(input)``.

  Sum over groups of equal view of the largest count of one target, over N.
  """
  if not inputs:
    raise ValueError("no examples")
  groups = _group_counts(inputs, targets, view)
  return sum(max(c.values()) for c in groups.values()) / len(inputs)


def bag_of_chars_bound(inputs: Sequence[str], targets: Sequence[str]) -> float:
  """``view_bound`` for a model without any position information."""
  return view_bound(inputs, targets, bag_view)


def reversal_bound(inputs: Sequence[str], targets: Sequence[str]) -> float:
  """``view_bound`` for a model that sees distances but not directions."""
  return view_bound(inputs, targets, reversal_view)


def fitted_accuracy(train_inputs: Sequence[str], train_targets: Sequence[str],
                    eval_inputs: Sequence[str], eval_targets: Sequence[str],
                    view: View = bag_view) -> float:
  """Accuracy on the eval examples of the per-view majority predictor fit on train.

  Ties in the train majority go to the smallest target string, so the number
  is deterministic. Groups absent from train get no prediction (scored wrong).
  """
  if not eval_inputs:
    raise ValueError("no eval examples")
  groups = _group_counts(train_inputs, train_targets, view)
  predict = {g: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for g, c in groups.items()}
  hits = sum(predict.get(view(x)) == y for x, y in zip(eval_inputs, eval_targets))
  return hits / len(eval_inputs)


VIEWS = {"bag": bag_view, "reversal": reversal_view}


def arithmetic_bounds(config_name: str, views: Sequence[str] = ("bag", "reversal")) -> dict[str, float]:
  """All ceilings for an ``rpr.data.arithmetic`` config, from its exact splits.

  Keys ``{view}_{test,all,fitted}`` for each name in ``views`` (``bag``,
  ``reversal``): oracle ceiling on the test split, ceiling over the whole data
  set, and the train-fit predictor's test accuracy. Uses the same enumeration
  and split as the TFDS builder, without needing the generated files.
  """
  from rpr.data import arithmetic  # local: keeps this module free of TFDS

  config = arithmetic.config_by_name(config_name)
  splits = arithmetic.split_examples(config)
  (tr_x, tr_y), (te_x, te_y) = splits["train"], splits["test"]
  out = {}
  for name in views:
    view = VIEWS[name]
    out[f"{name}_test"] = view_bound(te_x, te_y, view)
    out[f"{name}_all"] = view_bound(list(tr_x) + list(te_x), list(tr_y) + list(te_y), view)
    out[f"{name}_fitted"] = fitted_accuracy(tr_x, tr_y, te_x, te_y, view)
  return out
