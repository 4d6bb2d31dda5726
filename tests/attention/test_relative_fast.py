"""rpr.attention.relative's fused formulations (flat gathers, one-pass masked sums) against float64 loops.

The fast maps must be exactly the old ones: same values, same gradients, for
every clipping distance, offset sign and shape, including the int32-overflow
fallback and traced offsets.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr.attention import dense_terms
from rpr.attention import relative as rel


# Programs compiled as one LLVM module (see tests/attention/test_chunked.py).


def bucket(i, j, k, offset):
  return min(max(j - (i + offset), -k), k) + k


def expand_loop(x, k_len, k, offset):
  q = x.shape[-2]
  out = np.zeros(x.shape[:-1] + (k_len,), np.float64)
  for i, j in itertools.product(range(q), range(k_len)):
    out[..., i, j] = x[..., i, bucket(i, j, k, offset)]
  return out


def reduce_loop(p, k, offset):
  q, k_len = p.shape[-2:]
  out = np.zeros(p.shape[:-1] + (2 * k + 1,), np.float64)
  for i, j in itertools.product(range(q), range(k_len)):
    out[..., i, bucket(i, j, k, offset)] += p[..., i, j]
  return out


@functools.partial(jax.jit, static_argnums=(2, 3))
def maps_and_grads(x, p, k_len, k, offset):
  """expand, reduce and the gradients of <expand(x), p> and <reduce(p), x> (offset traced)."""
  e = rel.expand(x, k_len, offset)
  r = rel.reduce(p, 2 * k + 1, offset)
  gx = jax.grad(lambda x: jnp.sum(rel.expand(x, k_len, offset) * p))(x)
  gp = jax.grad(lambda p: jnp.sum(rel.reduce(p, 2 * k + 1, offset) * x))(p)
  return e, r, gx, gp


SHAPES = [  # (q_len, k_len): square, fewer queries (decoder), more queries, single query
    (6, 6), (3, 8), (7, 4), (1, 5)]
OFFSETS = [0, 2, -3, 9, -9]


# Offsets are traced: every offset runs through one compilation per (k, shape), in one test.
@pytest.mark.parametrize("k", [0, 1, 2, 5])
@pytest.mark.parametrize("q_len,k_len", SHAPES)
def test_expand_reduce_gradients_match_loops(x64, rng, k, q_len, k_len):
  for offset in OFFSETS:
    x = rng.normal(size=(2, 3, q_len, 2 * k + 1))
    p = rng.normal(size=(2, 3, q_len, k_len))
    e, r, gx, gp = maps_and_grads(jnp.asarray(x), jnp.asarray(p), k_len, k, jnp.int32(offset))
    np.testing.assert_array_equal(np.asarray(e), expand_loop(x, k_len, k, offset), err_msg=f"offset {offset}")
    np.testing.assert_allclose(np.asarray(r), reduce_loop(p, k, offset), rtol=1e-12, atol=1e-12,
                               err_msg=f"offset {offset}")
    np.testing.assert_allclose(np.asarray(gx), reduce_loop(p, k, offset), rtol=1e-12, atol=1e-12,
                               err_msg=f"offset {offset}")
    np.testing.assert_array_equal(np.asarray(gp), expand_loop(x, k_len, k, offset), err_msg=f"offset {offset}")


@pytest.mark.parametrize("k", [5, 40])
def test_k_larger_than_both_lengths(x64, rng, k):
  # Every key is inside the band: no row has a left or right clipped region.
  x, p = rng.normal(size=(1, 2, 4, 2 * k + 1)), rng.normal(size=(1, 2, 4, 3))
  e, r, gx, gp = maps_and_grads(jnp.asarray(x), jnp.asarray(p), 3, k, jnp.int32(1))
  np.testing.assert_array_equal(np.asarray(e), expand_loop(x, 3, k, 1))
  np.testing.assert_allclose(np.asarray(r), reduce_loop(p, k, 1), rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(gx), reduce_loop(p, k, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batch", [(), (3,), (2, 2, 2)])
def test_any_number_of_leading_dims(x64, rng, batch):
  k, q_len, k_len = 2, 4, 6
  x, p = rng.normal(size=batch + (q_len, 2 * k + 1)), rng.normal(size=batch + (q_len, k_len))
  e, r = jax.jit(lambda x, p: (rel.expand(x, k_len, 1), rel.reduce(p, 2 * k + 1, 1)))(jnp.asarray(x), jnp.asarray(p))
  np.testing.assert_array_equal(np.asarray(e), expand_loop(x, k_len, k, 1))
  np.testing.assert_allclose(np.asarray(r), reduce_loop(p, k, 1), rtol=1e-12)


def test_int32_overflow_fallback_is_the_same_map(x64, rng, monkeypatch):
  # Past 2^31 flat elements the maps fall back to a per-axis gather; force it on a small shape.
  k, q_len, k_len = 2, 5, 7
  x, p = rng.normal(size=(2, q_len, 2 * k + 1)), rng.normal(size=(2, q_len, k_len))
  monkeypatch.setattr(rel, "INT32_LIMIT", 8)  # read when the maps are traced
  e, r = jax.jit(lambda x, p: (rel.bucket_expand(x, k_len, -1), rel.bucket_reduce(p, 2 * k + 1, -1)))(
      jnp.asarray(x), jnp.asarray(p))
  np.testing.assert_array_equal(np.asarray(e), expand_loop(x, k_len, k, -1))
  np.testing.assert_allclose(np.asarray(r), reduce_loop(p, k, -1), rtol=1e-12)


def test_bfloat16_reduce_accumulates_in_float32(rng):
  # 512 weights of 1/512 sum to exactly 1 in float32; bfloat16 running sums would drift.
  p = jnp.full((1, 1, 512), 1 / 512, jnp.bfloat16)
  r = jax.jit(lambda p: rel.reduce(p, 3, 700))(p)  # every key is left of the band: one bucket holds all
  assert r.dtype == jnp.bfloat16
  assert float(r[0, 0, 0]) == 1.0


def test_no_index_tensor_is_materialised():
  # The old take_along_axis version built int32 [b, h, q, k, 4] index tensors
  # (4x the logits each) and a masked copy of the weights per boundary bucket:
  # 7.5 logits-sized scratch buffers for this softmax round trip. The flat
  # gather computes its index inside the fusion and the masked sums are one
  # fused pass: what remains is the softmax's own buffers.
  x = jnp.zeros((8, 8, 256, 33))
  s = jnp.zeros((8, 8, 256, 256))

  def f(x, s):
    p = jax.nn.softmax(s + rel.expand(x, 256, 0))
    return jnp.sum(rel.reduce(p, 33, 0) ** 2)

  temp = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, s).compile().memory_analysis().temp_size_in_bytes
  assert temp < 3 * s.size * 4, temp / (s.size * 4)


@jax.jit
def head_major_terms(query, weights, kt, vt, gk, gv, offset):
  """``sum(relative_logits * gk) + sum(relative_values * gv)`` and its gradients for the query, the weights and both
  tables (offset traced)."""
  def loss(query, weights, kt, vt):
    terms = rel.Relative(kt, vt, offset=offset)
    return (jnp.sum(dense_terms.relative_logits(query, terms, weights.shape[-1]) * gk)
            + jnp.sum(dense_terms.relative_values(weights, terms) * gv))

  return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(query, weights, kt, vt)


def basis(shape):
  """Every one-hot array of ``shape``, stacked: ``[prod(shape), *shape]``."""
  return np.eye(int(np.prod(shape))).reshape((-1,) + tuple(shape))


# Every k, shape and layout, and every pair of them (a pairwise cover of the 24 combinations: each k meets each
# shape once, and each k and each shape meets both layouts); every offset sign in each, traced through one
# compilation.
HEAD_MAJOR_CASES = [(k, q_len, k_len, (i + j) % 2 == 1)
                    for i, k in enumerate([0, 2, 5]) for j, (q_len, k_len) in enumerate(SHAPES)]


@pytest.mark.parametrize("k,q_len,k_len,shared", HEAD_MAJOR_CASES)
def test_head_major_terms_match_loops(x64, rng, k, q_len, k_len, shared):
  """The dense path's head-major a^K and a^V terms (hand-written table gradients) against the loops, in float64:
  values and the gradients for the query, the weights and both tables (offset traced)."""
  b, h, d = 2, 3, 4
  for offset in (0, 2, -3):
    query = rng.normal(size=(b, q_len, h, d))
    weights = rng.normal(size=(b, h, q_len, k_len))
    table_shape = (2 * k + 1, d) if shared else (h, 2 * k + 1, d)
    kt, vt = rng.normal(size=table_shape), rng.normal(size=table_shape)
    gk, gv = rng.normal(size=(b, h, q_len, k_len)), rng.normal(size=(b, q_len, h, d))
    got = head_major_terms(*(jnp.asarray(a) for a in (query, weights, kt, vt, gk, gv)), jnp.int32(offset))

    def loop_loss(query, weights, kt, vt):
      """The loss from the loops; arguments with a leading axis of points give the loss at each point."""
      def per_head(t):  # [..., h, rows, d]: the shared table repeated for every head
        t = t[..., None, :, :] if shared else t
        return np.broadcast_to(t, t.shape[:-3] + (h,) + t.shape[-2:])

      qw = np.einsum("...bqhd,...hrd->...bhqr", query, per_head(kt))
      buckets = reduce_loop(weights, k, offset)
      return (np.sum(expand_loop(qw, k_len, k, offset) * gk, axis=(-4, -3, -2, -1))
              + np.sum(np.einsum("...bhqr,...hrd->...bqhd", buckets, per_head(vt)) * gv, axis=(-4, -3, -2, -1)))

    np.testing.assert_allclose(float(got[0]), loop_loss(query, weights, kt, vt), rtol=1e-12)
    # The loss is linear in each argument given the others: the gradients are the loss's own coefficients, the loss
    # at each one-hot point of the argument with the other argument of its term zero.
    zero = lambda a: np.zeros_like(a)
    want = (loop_loss(basis(query.shape), zero(weights), kt, vt), loop_loss(zero(query), basis(weights.shape), kt, vt),
            loop_loss(query, weights, basis(kt.shape), zero(vt)), loop_loss(query, weights, zero(kt), basis(vt.shape)))
    for name, a, g, w in zip(("query", "weights", "key_table", "value_table"), (query, weights, kt, vt), got[1],
                             want):
      np.testing.assert_allclose(np.asarray(g), w.reshape(a.shape), rtol=1e-10, atol=1e-12,
                                 err_msg=f"{name}, offset {offset}")
