"""rpr.attention.relative: the two linear maps between [.., q, 2k+1] and [.., q, k_len], checked against loops."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr.attention import relative as rel


def clip_id(i, j, k, offset):
  """Shaw's bucket: clip(j - i, k) + k, with query i at position i + offset."""
  return min(max(j - (i + offset), -k), k) + k


def expand_loop(x, k_len, k, offset):
  """out[..., i, j] = x[..., i, clip(j - i - offset, k) + k]."""
  x = np.asarray(x)
  q = x.shape[-2]
  out = np.zeros(x.shape[:-1] + (k_len,), x.dtype)
  for i in range(q):
    for j in range(k_len):
      out[..., i, j] = x[..., i, clip_id(i, j, k, offset)]
  return out


def reduce_loop(p, k, offset):
  """out[..., i, r] = sum of p[..., i, j] over the keys j whose bucket is r."""
  p = np.asarray(p)
  q, k_len = p.shape[-2:]
  out = np.zeros(p.shape[:-1] + (2 * k + 1,), p.dtype)
  for i in range(q):
    for j in range(k_len):
      out[..., i, clip_id(i, j, k, offset)] += p[..., i, j]
  return out


# (q_length, k_length, k, offset): square, decoder step (q < k, offset > 0),
# negative offset, k larger than both lengths, k = 0.
CASES = [(4, 4, 2, 0), (3, 7, 2, 4), (5, 3, 1, -2), (1, 9, 3, 8), (4, 6, 0, 1), (3, 5, 10, 0)]


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def maps_and_vjps(x, p, k_len, k, offset):
  """expand(x), reduce(p) and each map's VJP, the cotangents being p and x.

  One jit per case: compiling the whole check once is ~10x faster than
  running its primitives eagerly on fresh shapes.
  """
  e, expand_vjp = jax.vjp(lambda x: rel.expand(x, k_len, offset), x)
  r, reduce_vjp = jax.vjp(lambda p: rel.reduce(p, 2 * k + 1, offset), p)
  return e, r, expand_vjp(p)[0], reduce_vjp(x)[0]


@pytest.mark.parametrize("q,k_len,k,offset", CASES)
def test_expand_reduce_and_their_gradients_match_loops(x64, rng, q, k_len, k, offset):
  x = rng.normal(size=(2, 3, q, 2 * k + 1))
  p = rng.normal(size=(2, 3, q, k_len))
  e, r, gx, gp = maps_and_vjps(jnp.asarray(x), jnp.asarray(p), k_len, k, offset)
  np.testing.assert_array_equal(np.asarray(e), expand_loop(x, k_len, k, offset))
  np.testing.assert_allclose(np.asarray(r), reduce_loop(p, k, offset), rtol=1e-12, atol=1e-12)
  # The custom VJPs: expand's gradient is the bucket sum of the cotangent and
  # reduce's is its expansion, i.e. the maps are each other's transpose.
  np.testing.assert_allclose(np.asarray(gx), reduce_loop(p, k, offset), rtol=1e-12, atol=1e-12)
  np.testing.assert_array_equal(np.asarray(gp), expand_loop(x, k_len, k, offset))
  # <expand(x), p> = <x, reduce(p)>.
  np.testing.assert_allclose(np.sum(np.asarray(e) * p), np.sum(x * np.asarray(r)), rtol=1e-12)


def test_traced_offset_matches_static(rng):
  # A decoder passes its step index as a traced offset under jit.
  x = jnp.asarray(rng.normal(size=(1, 2, 2, 5)), jnp.float32)
  p = jnp.asarray(rng.normal(size=(1, 2, 2, 7)), jnp.float32)
  f = jax.jit(lambda x, p, o: (rel.expand(x, 7, o), rel.reduce(p, 5, o),
                               jax.grad(lambda x: jnp.sum(rel.expand(x, 7, o) ** 2))(x)))
  for offset in (0, 3, 6):
    e, r, g = f(x, p, jnp.int32(offset))
    np.testing.assert_array_equal(np.asarray(e), expand_loop(x, 7, 2, offset))
    np.testing.assert_allclose(np.asarray(r), reduce_loop(p, 2, offset), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g), reduce_loop(2 * expand_loop(x, 7, 2, offset), 2, offset),
                               rtol=1e-5, atol=1e-6)


def test_clipping_keys_beyond_k_use_the_distance_k_bucket():
  k = 2

  @jax.jit
  def run(x, p):
    # One query at key positions' start (offset 0) and one at their end (offset 7).
    return (rel.bucket_ids(1, 8, 2 * k + 1), rel.bucket_ids(1, 8, 2 * k + 1, offset=7), rel.expand(x, 8, 0),
            rel.reduce(p, 2 * k + 1, 0))

  x = jnp.arange(10.0, 15.0)[None, :]  # bucket r holds 10 + r
  p = jnp.asarray([[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]])
  ids_first, ids_last, row, buckets = (np.asarray(a)[0] for a in run(x, p))
  # Keys at distances 3, 4, ... land in the distance-2 bucket 2k ...
  np.testing.assert_array_equal(ids_first, [2, 3, 4, 4, 4, 4, 4, 4])
  # ... and at distances -3, -4, ... in the distance -2 bucket 0.
  np.testing.assert_array_equal(ids_last, [0, 0, 0, 0, 0, 0, 1, 2])
  # expand hands every far key exactly the distance-2 entry.
  np.testing.assert_array_equal(row, [12.0, 13.0, 14.0, 14.0, 14.0, 14.0, 14.0, 14.0])
  # reduce gathers their weights into that one bucket.
  np.testing.assert_array_equal(buckets, [0.0, 0.0, 1.0, 2.0, 252.0])


def test_max_distance_zero_sees_no_order():
  # k = 0: a single bucket, so every pair gets the same entry.
  ids, summed = jax.jit(lambda p: (rel.bucket_ids(3, 5, 1, offset=1), rel.reduce(p, 1, 0)))(
      jnp.arange(15.0).reshape(3, 5))
  np.testing.assert_array_equal(np.asarray(ids), np.zeros((3, 5)))
  np.testing.assert_array_equal(np.asarray(summed), np.arange(15.0).reshape(3, 5).sum(-1, keepdims=True))


def ids_loop_expand(x, ids):
  x, ids = np.asarray(x), np.asarray(ids)
  b, h, q, _ = x.shape
  out = np.zeros((b, h, q, ids.shape[-1]), x.dtype)
  for bi in range(b):
    idb = ids if ids.ndim == 2 else ids[bi]
    for i in range(q):
      for j in range(ids.shape[-1]):
        out[bi, :, i, j] = x[bi, :, i, idb[i, j]]
  return out


def ids_loop_reduce(p, ids, num_relations):
  p, ids = np.asarray(p), np.asarray(ids)
  b, h, q, k = p.shape
  out = np.zeros((b, h, q, num_relations), p.dtype)
  for bi in range(b):
    idb = ids if ids.ndim == 2 else ids[bi]
    for i in range(q):
      for j in range(k):
        out[bi, :, i, idb[i, j]] += p[bi, :, i, j]
  return out


@pytest.mark.parametrize("per_batch", [False, True])
def test_explicit_ids_match_loops(x64, rng, per_batch):
  r, q, k = 4, 3, 5
  ids = rng.integers(0, r, size=(2, q, k) if per_batch else (q, k))
  x = rng.normal(size=(2, 3, q, r))
  p = rng.normal(size=(2, 3, q, k))
  np.testing.assert_array_equal(np.asarray(rel.expand_ids(jnp.asarray(x), jnp.asarray(ids))), ids_loop_expand(x, ids))
  np.testing.assert_allclose(np.asarray(rel.reduce_ids(jnp.asarray(p), jnp.asarray(ids), r)),
                             ids_loop_reduce(p, ids, r), rtol=1e-12, atol=1e-12)


def test_the_clipping_distance_is_read_from_the_tables_rows():
  table = jnp.zeros((2, 7, 3))  # per head, 2k+1 = 7 rows
  assert rel.Relative(table, table).max_distance == 3 and rel.Relative(None, table[0]).max_distance == 3
  assert rel.Relative().max_distance == 0  # no tables: no terms to clip
