"""rpr.metrics: smoothed cross entropy against hand computations, accuracy, exact match, BLEU."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rpr import metrics


def test_smoothed_cross_entropy_matches_a_hand_computation():
  # One real token (id 3) and one PAD; vocabulary of 4, eps = 0.1.
  logits = np.array([[[1.0, 2.0, 0.5, 3.0], [9.0, 0.0, 0.0, 0.0]]], np.float32)
  targets = np.array([[3, 0]])
  eps, v = 0.1, 4
  z = np.log(np.sum(np.exp(logits[0, 0])))
  logp = logits[0, 0] - z
  q = np.full(v, eps / (v - 1))
  q[3] = 1 - eps
  entropy = -(0.9 * math.log(0.9) + 3 * (eps / 3) * math.log(eps / 3))
  expected = -np.sum(q * logp) - entropy
  loss_sum, weight_sum = metrics.cross_entropy(jnp.asarray(logits), jnp.asarray(targets), label_smoothing=eps)
  assert float(weight_sum) == 1.0  # the PAD target does not count
  np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-6)


def test_loss_is_zero_when_predicting_the_smoothed_targets_and_plain_ce_without_smoothing():
  targets = jnp.array([[4, 2, 0]])
  for eps in (0.0, 0.1, 0.3):
    q = metrics.smoothed_targets(targets, 6, eps)
    logits = jnp.log(jnp.maximum(q, 1e-30))  # eps = 0: one-hot, as good as it gets in float32
    loss_sum, n = metrics.cross_entropy(logits, targets, label_smoothing=eps)
    assert float(n) == 2.0
    assert abs(float(loss_sum)) < 1e-5
  logits = jnp.array([[[0.0, 1.0, 2.0]]])
  loss_sum, _ = metrics.cross_entropy(logits, jnp.array([[1]]))
  np.testing.assert_allclose(float(loss_sum), -(1.0 - math.log(1 + math.e + math.e ** 2)), rtol=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_the_fused_loss_and_its_gradient_equal_the_explicit_smoothed_distribution(eps):
  import jax

  rng = np.random.default_rng(int(eps * 10))
  logits = jnp.asarray(rng.normal(size=(3, 5, 11)) * 3, jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, size=(3, 5)))

  def explicit(z):  # -sum_v q_v log p_v - H(q), with q formed
    q = metrics.smoothed_targets(targets, 11, eps)
    loss = -jnp.sum(q * jax.nn.log_softmax(z), axis=-1) - metrics.smoothing_entropy(11, eps)
    return jnp.sum(loss * (targets != 0))

  fused = lambda z: metrics.cross_entropy(z, targets, label_smoothing=eps)[0]
  np.testing.assert_allclose(float(fused(logits)), float(explicit(logits)), rtol=2e-6)
  np.testing.assert_allclose(np.asarray(jax.grad(fused)(logits)), np.asarray(jax.grad(explicit)(logits)),
                             rtol=1e-5, atol=1e-6)


def test_token_accuracy_is_argmax_accuracy_and_counts_a_gold_id_tied_for_the_top_as_correct():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 6, 9)).astype(np.float32)  # no ties
  targets = rng.integers(1, 9, size=(4, 6))
  targets[:, 0] = logits[:, 0].argmax(-1)  # some certainly right
  correct, _ = metrics.token_accuracy(jnp.asarray(logits), jnp.asarray(targets))
  assert float(correct) == np.sum(logits.argmax(-1) == targets) > 4
  tied = np.array([[[2.0, 5.0, 5.0, 1.0]]], np.float32)
  assert float(metrics.token_accuracy(jnp.asarray(tied), jnp.asarray([[2]]))[0]) == 1.0  # argmax says 1


def test_token_accuracy_counts_non_pad_tokens_only():
  logits = jnp.asarray(np.eye(5)[[3, 4, 2, 1]][None] * 5.0)  # argmax 3, 4, 2, 1
  targets = jnp.array([[3, 5, 2, 0]])  # right, wrong, right (EOS), PAD
  correct, n = metrics.token_accuracy(logits, targets)
  assert (float(correct), float(n)) == (2.0, 3.0)


def test_exact_match_up_to_eos_with_padding():
  targets = np.array([
      [5, 6, 2, 0],  # "ab" EOS
      [5, 6, 2, 0],
      [5, 6, 2, 0],
      [7, 2, 0, 0],
      [0, 0, 0, 0],  # padding row of the last eval batch
  ])
  predictions = np.array([
      [5, 6, 2, 9, 9],  # matches: anything after EOS is ignored
      [5, 6, 7, 2, 0],  # one token too many
      [5, 6, 0, 0, 0],  # no EOS
      [7, 2, 0, 0, 0],
      [0, 0, 0, 0, 0],
  ])
  match, valid = metrics.exact_match(predictions, targets)
  assert valid.tolist() == [True, True, True, True, False]
  assert match.tolist() == [True, False, False, True, False]


def test_bleu_of_identical_text_is_100_and_of_disjoint_text_is_0():
  refs = ["the cat sat on the mat today", "a quick brown fox jumps over the dog"]
  assert metrics.bleu(refs, refs) == pytest.approx(100.0)
  assert metrics.bleu(["zz yy xx ww vv", "qq rr ss tt uu"], refs) == pytest.approx(0.0)
  with pytest.raises(ValueError, match="hypotheses"):
    metrics.bleu(refs[:1], refs)


def test_chrf_scores_characters_and_gives_partial_credit_bleu_does_not():
  refs = ["the cat sat on the mat today"]
  assert metrics.chrf(refs, refs) == pytest.approx(100.0)
  # Misspelt words share character n-grams with the reference: chrF gives credit, BLEU's word 4-grams none.
  near = ["teh cta sta no hte mta todya"]
  assert metrics.bleu(near, refs) == pytest.approx(0.0) and 10.0 < metrics.chrf(near, refs) < 60.0
  with pytest.raises(ValueError, match="hypotheses"):
    metrics.chrf(refs + refs, refs)


def test_mean_by_length_averages_each_length_separately():
  values = np.array([1, 0, 1, 1, 0, 0], bool)
  lengths = np.array([3, 3, 5, 1, 5, 5])
  assert metrics.mean_by_length(values, lengths) == {1: 1.0, 3: 0.5, 5: pytest.approx(1 / 3)}
  assert list(metrics.mean_by_length(values, lengths)) == [1, 3, 5]
  with pytest.raises(ValueError, match="equal 1-D shapes"):
    metrics.mean_by_length(values, lengths[:-1])


def test_exact_match_is_token_for_token():
  # A PAD written mid-sequence is a wrong token, not a gap to close.
  match, _ = metrics.exact_match(np.array([[5, 0, 6, 2]]), np.array([[5, 6, 2, 0]]))
  assert not match[0]
  match, _ = metrics.exact_match(np.array([[5, 6, 2, 7]]), np.array([[5, 6, 2, 0, 0]]))
  assert match[0]  # what follows EOS is ignored
