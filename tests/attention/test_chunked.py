"""rpr.attention.chunked (with chunked_plan and chunked_kernel): the linear-memory path equals
dot_product_attention, values and gradients, for every scheme.

Blocks are chosen small and not dividing the lengths (block_q=3, block_k=4 on
lengths 7..11), so every case crosses block boundaries, pads, and (with Shaw
terms) has key blocks left of, across and right of the band. The chunked path
takes a :class:`~rpr.attention.Mask` (key validity, causal, window); the dense
path it is held to takes the same mask as a boolean array built by
``padding_mask``, ``causal_mask`` and ``window_mask``. Rows that the mask
leaves without a key are zero in both, so every row is compared.
"""



import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import attention as attn
from rpr.attention import positions, reference
from rpr.attention.chunked import BAND, LEFT, Corner, band_plan, chunked_attention
from rpr.attention.chunked_plan import RIGHT, Plan
from rpr.attention import MultiHeadAttention

BLOCKS = dict(block_q=3, block_k=4)


def qkv(rng, b=2, nq=7, nk=9, h=3, d=4):
  return tuple(jnp.asarray(rng.normal(size=(b, n, h, d))) for n in (nq, nk, nk))


def tables(rng, k, h=3, d=4, shared=False):
  shape = (2 * k + 1, d) if shared else (h, 2 * k + 1, d)
  return jnp.asarray(rng.normal(size=shape)), jnp.asarray(rng.normal(size=shape))


def dense_mask(b, nq, nk, key_valid=None, causal=False, q_offset=0, window=None):
  """The boolean array for dot_product_attention, built from the mask helpers (None: no mask)."""
  mask = None
  if key_valid is not None:
    mask = attn.padding_mask(None, key_valid)
  if causal:
    mask = attn.combine(mask, attn.causal_mask(nq, nk, q_offset))
  if window is not None:
    mask = attn.combine(mask, attn.window_mask(nq, nk, window, q_offset))
  return mask


def compare(dense_fn, chunked_fn, args, cotangent, rtol=1e-10, atol=1e-10):
  """Outputs and gradients (w.r.t. every argument) of the two functions agree, on every row."""
  def both(*args):
    outs = []
    for f in (dense_fn, chunked_fn):
      out, vjp = jax.vjp(f, *args)
      outs.append((out, vjp(cotangent)))
    return outs

  (o1, g1), (o2, g2) = jax.jit(both)(*args)
  np.testing.assert_allclose(np.asarray(o2), np.asarray(o1), rtol=rtol, atol=atol)
  for a, b_ in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(b_), np.asarray(a), rtol=rtol, atol=atol)


def compare_at_offsets(dense_at, chunked_at, args, cotangent, offsets, rtol=1e-10, atol=1e-10):
  """``compare(dense_at(offset), chunked_at(offset), ...)`` at each offset: the dense path with the offset static,
  the chunked path with it traced, one compilation for every offset.

  Only for blocks that are not square: there the plan reads no static offset (its corners need square blocks), so a
  static offset runs this same program with the offset a constant. Static offsets on square blocks:
  test_shaw_band_edges_match_dense, test_shaw_corner_blocks_match_dense.
  """
  def out_and_grads(f, *args):
    out, vjp = jax.vjp(f, *args)
    return out, vjp(cotangent)

  chunked = jax.jit(lambda offset, *args: out_and_grads(chunked_at(offset), *args))
  for offset in offsets:
    o1, g1 = jax.jit(lambda *args: out_and_grads(dense_at(offset), *args))(*args)
    o2, g2 = chunked(jnp.int32(offset), *args)
    np.testing.assert_allclose(np.asarray(o2), np.asarray(o1), rtol=rtol, atol=atol, err_msg=f"offset {offset}")
    for a, b_ in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
      np.testing.assert_allclose(np.asarray(b_), np.asarray(a), rtol=rtol, atol=atol, err_msg=f"offset {offset}")


# ----------------------------------------------------------------------------
# Shaw.


# Every k with every offset sign once (k = 20 is wider than the 10 keys: no clipping); random k, offsets
# and terms are drawn by tests/test_properties.py as well. The offsets of one k and terms run in one test.
SHAW_CASES = ([(0, "kv", (4,)), (1, "kv", (0, -3)), (3, "kv", (0, 4)), (20, "kv", (-3,))]
              + [(3, "k", (4,)), (3, "v", (-3,))])


@pytest.mark.parametrize("k,terms,offsets", SHAW_CASES)
def test_shaw_matches_dense(x64, rng, k, terms, offsets):
  q, kk, v = qkv(rng)
  kt, vt = tables(rng, k)
  g = jnp.asarray(rng.normal(size=q.shape))

  def relative(kt, vt, offset):
    return attn.Relative(kt if "k" in terms else None, vt if "v" in terms else None, offset=offset)

  dense_at = lambda o: lambda q, kk, v, kt, vt: attn.dot_product_attention(q, kk, v, relative=relative(kt, vt, o))
  chunked_at = lambda o: lambda q, kk, v, kt, vt: chunked_attention(q, kk, v, relative=relative(kt, vt, o), **BLOCKS)
  compare_at_offsets(dense_at, chunked_at, (q, kk, v, kt, vt), g, offsets)


# The window (restricted attention) is evaluated per block; window 1 at offset -3 or 9 leaves the first or
# the last queries without any key. Each mask at q_offset 0 and 2 (one test, one chunked compilation).
@pytest.mark.parametrize("causal,padded,shared,window,q_offsets", [
    *[(causal, padded, shared, None, (0, 2)) for causal, padded, shared in
      [(True, False, False), (False, True, True), (True, True, False)]],
    (False, True, False, 1, (-3,)), (False, False, True, 1, (9,)), (True, True, False, 3, (2,))])
def test_shaw_with_masks_matches_dense(x64, rng, causal, padded, shared, window, q_offsets):
  b, nq, nk, h = 2, 7, 11, 3
  q, kk, v = qkv(rng, b, nq, nk, h)
  kt, vt = tables(rng, 2, h, shared=shared)
  key_valid = jnp.asarray(np.arange(nk)[None, :] < np.array([[nk], [6]])) if padded else None
  g = jnp.asarray(rng.normal(size=q.shape))
  rel = lambda kt, vt, o: attn.Relative(kt, vt, offset=o)
  dense_at = lambda o: lambda q, kk, v, kt, vt: attn.dot_product_attention(
      q, kk, v, relative=rel(kt, vt, o), mask=dense_mask(b, nq, nk, key_valid, causal, o, window))
  chunked_at = lambda o: lambda q, kk, v, kt, vt: chunked_attention(
      q, kk, v, relative=rel(kt, vt, o), mask=attn.Mask(key_valid=key_valid, causal=causal, window=window),
      q_offset=o, **BLOCKS)
  compare_at_offsets(dense_at, chunked_at, (q, kk, v, kt, vt), g, q_offsets)


# Where the band |j - i - offset| < k (k = 5) starts and ends relative to the
# key blocks: on and off block edges, meeting either end of the keys, with
# negative and positive offsets, with and without the causal cut.
@pytest.mark.parametrize("nq,nk,block_q,block_k,offset,causal", [
    (13, 29, 4, 8, 0, False), (13, 29, 4, 8, 3, True), (11, 16, 4, 4, -2, False), (11, 16, 4, 4, -2, True),
    (9, 31, 5, 6, 7, False), (12, 24, 4, 8, -9, True)])
def test_shaw_band_edges_match_dense(x64, rng, nq, nk, block_q, block_k, offset, causal):
  b, h = 2, 2
  q, kk, v = qkv(rng, b, nq, nk, h)
  kt, vt = tables(rng, 5, h)
  g = jnp.asarray(rng.normal(size=q.shape))
  rel = lambda kt, vt: attn.Relative(kt, vt, offset=offset)
  dense = lambda q, kk, v, kt, vt: attn.dot_product_attention(  # the mask built in the compiled function
      q, kk, v, relative=rel(kt, vt), mask=dense_mask(b, nq, nk, causal=causal, q_offset=offset))
  chunked = lambda q, kk, v, kt, vt: chunked_attention(q, kk, v, relative=rel(kt, vt), mask=attn.Mask(causal=causal),
                                                       q_offset=offset, block_q=block_q, block_k=block_k)
  compare(dense, chunked, (q, kk, v, kt, vt), g)


def test_shaw_with_a_bias_closure_matches_dense(x64, rng):
  # Shaw terms and an additive bias together; the slopes bias_fn closes over get their gradient.
  b, nq, nk, h = 2, 10, 14, 3
  q, kk, v = qkv(rng, b, nq, nk, h)
  kt, vt = tables(rng, 3, h)
  slopes = jnp.asarray(rng.uniform(0.1, 1.0, size=(h,)))
  g = jnp.asarray(rng.normal(size=q.shape))
  dist = lambda qp, kp: jnp.abs(kp[None, :] - qp[:, None]).astype(slopes.dtype)
  rel = lambda kt, vt: attn.Relative(kt, vt)
  dense = lambda q, kk, v, kt, vt, s: attn.dot_product_attention(
      q, kk, v, relative=rel(kt, vt), bias=-s[None, :, None, None] * dist(jnp.arange(nq), jnp.arange(nk))[None, None])
  chunked = lambda q, kk, v, kt, vt, s: chunked_attention(
      q, kk, v, relative=rel(kt, vt), bias_fn=lambda qp, kp: -s[:, None, None] * dist(qp, kp)[None],
      block_q=4, block_k=4)
  compare(dense, chunked, (q, kk, v, kt, vt, slopes), g)


def test_dense_mask_argument_matches_dense(x64, rng):
  b, nq, nk, h = 2, 7, 9, 3
  q, kk, v = qkv(rng, b, nq, nk, h)
  mask = jnp.asarray(rng.random((b, 1, nq, nk)) < 0.7).at[..., 0].set(True)
  kt, vt = tables(rng, 2, h)
  g = jnp.asarray(rng.normal(size=q.shape))
  rel = lambda kt, vt: attn.Relative(kt, vt)
  dense = lambda q, kk, v, kt, vt: attn.dot_product_attention(q, kk, v, relative=rel(kt, vt), mask=mask)
  chunked = lambda q, kk, v, kt, vt: chunked_attention(q, kk, v, relative=rel(kt, vt), mask=mask, **BLOCKS)
  compare(dense, chunked, (q, kk, v, kt, vt), g)


@pytest.mark.parametrize("block_q,block_k", [(1, 1), (2, 16), (16, 2), (7, 9)])
def test_block_sizes_do_not_change_the_result(x64, rng, block_q, block_k):
  q, kk, v = qkv(rng)
  kt, vt = tables(rng, 2)
  g = jnp.asarray(rng.normal(size=q.shape))
  rel = lambda kt, vt: attn.Relative(kt, vt, offset=1)
  dense = lambda q, kk, v, kt, vt: attn.dot_product_attention(q, kk, v, relative=rel(kt, vt))
  chunked = lambda q, kk, v, kt, vt: chunked_attention(q, kk, v, relative=rel(kt, vt), block_q=block_q,
                                                       block_k=block_k)
  compare(dense, chunked, (q, kk, v, kt, vt), g)


@pytest.mark.parametrize("block,k,offset", [(8, 3, 0), (8, 3, 4), (8, 3, -11), (8, 3, 13), (128, 16, 0), (16, 16, 0),
                                            (6, 2, -1), (4, 5, 2), (1, 2, 1)])
def test_band_plan_classifies_every_block(block, k, offset):
  # Against the bucket of every cell of query block I = 2 with key blocks
  # J = I - 4 .. I + 4: blocks before the plan's first diagonal hold only
  # bucket 0, after its last only bucket 2k; a corner block holds its side's
  # bucket outside its box and the exact buckets inside it.
  plan = band_plan(block, k, offset)
  i = 2 * block + np.arange(block)[:, None]
  sides = dict(plan)
  for delta in range(-4, 5):
    buckets = np.clip(((2 + delta) * block + np.arange(block))[None, :] - i - offset, -k, k) + k
    if delta < plan[0][0]:
      assert (buckets == 0).all(), delta
    elif delta > plan[-1][0]:
      assert (buckets == 2 * k).all(), delta
    elif isinstance(sides[delta], Corner):
      corner = sides[delta]
      outside = np.ones_like(buckets, bool)
      outside[corner.rows, corner.cols] = False
      assert (buckets[outside] == (0 if corner.side == LEFT else 2 * k)).all(), delta
      box = buckets[corner.rows, corner.cols]
      j = np.arange(box.shape[1])[None, :] - np.arange(box.shape[0])[:, None] - corner.offset
      np.testing.assert_array_equal(box, np.clip(j, -k, k) + k)
    else:
      assert sides[delta] == BAND
  if (block, k, offset) == (128, 16, 0):  # the benchmark's case: a corner either side of the diagonal block
    assert [type(side) for _, side in plan] == [Corner, str, Corner]


# Square blocks with a static offset take the planned path (band_plan): the
# blocks beside each query block's diagonal block are edge blocks with a
# corner of the band corrected, in both passes.
# Each shape with two of the term / mask combinations, so that every combination meets two shapes.
@pytest.mark.parametrize("nq,nk,offset,terms,causal,padded", [
    (29, 29, 0, "kv", False, False), (29, 29, 0, "kv", True, True), (21, 30, 3, "kv", True, True),
    (21, 30, 3, "k", False, True), (24, 19, -11, "k", False, True), (24, 19, -11, "v", True, False),
    (16, 40, -16, "v", True, False), (16, 40, -16, "kv", False, False)])
def test_shaw_corner_blocks_match_dense(x64, rng, nq, nk, offset, terms, causal, padded):
  block, k, b, h = 8, 3, 2, 2
  assert any(isinstance(side, Corner) for _, side in band_plan(block, k, offset))
  q, kk, v = qkv(rng, b, nq, nk, h)
  kt, vt = tables(rng, k, h)
  key_valid = jnp.asarray(np.arange(nk)[None, :] < np.array([[nk], [nk - 7]])) if padded else None
  g = jnp.asarray(rng.normal(size=q.shape))

  def rel(kt, vt):
    return attn.Relative(kt if "k" in terms else None, vt if "v" in terms else None, offset=offset)

  dense = lambda q, kk, v, kt, vt: attn.dot_product_attention(  # the mask built in the compiled function
      q, kk, v, relative=rel(kt, vt), mask=dense_mask(b, nq, nk, key_valid, causal, offset))
  chunked = lambda q, kk, v, kt, vt: chunked_attention(q, kk, v, relative=rel(kt, vt),
                                                       mask=attn.Mask(key_valid=key_valid, causal=causal),
                                                       q_offset=offset, block_q=block, block_k=block)
  compare(dense, chunked, (q, kk, v, kt, vt), g)


def test_decoder_step_with_traced_offset(x64, rng):
  # One query at a traced position t over a cache of 9 keys, as in cached decoding.
  q, kk, v = qkv(rng, nq=1)
  kt, vt = tables(rng, 2)

  @jax.jit
  def both(t):
    rel = attn.Relative(kt, vt, offset=t)
    mask = attn.causal_mask(1, 9, t)
    return (attn.dot_product_attention(q, kk, v, relative=rel, mask=mask),
            chunked_attention(q, kk, v, relative=rel, mask=attn.Mask(causal=True), q_offset=t, **BLOCKS))

  for t in (0, 4, 8):
    dense, chunked = both(jnp.int32(t))
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(dense), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------
# Local windows: key blocks outside the window are skipped, not only masked.


# Windows smaller than, equal to and larger than a block; square blocks (the
# planned band with corners) and not; q_offset shifting the window, q and k
# lengths that differ; padding; causal with a negative offset leaving the
# first rows empty; and no Shaw terms (max_distance None).
@pytest.mark.parametrize("nq,nk,block_q,block_k,window,causal,padded,q_offset,k", [
    (24, 24, 4, 4, 2, False, False, 0, 2),
    (24, 24, 4, 4, 4, True, True, 0, 3),
    (19, 30, 4, 4, 9, False, True, 5, 2),
    (30, 19, 3, 5, 3, True, False, -4, 2),
    (16, 40, 8, 8, 0, False, False, 12, 3),
    (21, 33, 5, 4, 6, True, True, 9, 20),
    (26, 23, 4, 6, 5, False, True, -2, None),
])
def test_window_matches_reference(x64, rng, nq, nk, block_q, block_k, window, causal, padded, q_offset, k):
  b, h = 2, 2
  q, kk, v = qkv(rng, b, nq, nk, h)
  kt, vt = tables(rng, k or 0, h)
  key_valid = jnp.asarray(np.arange(nk)[None, :] < np.array([[nk], [nk - 6]])) if padded else None
  mask = attn.Mask(key_valid=key_valid, causal=causal, window=window)
  dense = np.broadcast_to(np.asarray(mask.dense(nq, nk, q_offset)), (b, h, nq, nk))
  empty_rows = np.transpose(~dense.any(-1), (0, 2, 1))[..., None]  # [b, nq, h, 1], as the output
  g = jnp.asarray(rng.normal(size=q.shape))
  shaw = lambda kt, vt: None if k is None else attn.Relative(kt, vt, offset=q_offset)
  fns = (lambda q, kk, v, kt, vt: reference.shaw_attention_reference(
             q, kk, v, *((kt, vt) if k is not None else (None, None)), q_offset, jnp.asarray(dense)),
         lambda q, kk, v, kt, vt: chunked_attention(q, kk, v, relative=shaw(kt, vt), mask=mask, q_offset=q_offset,
                                                    block_q=block_q, block_k=block_k))

  @jax.jit
  def run(*args):
    (want, want_vjp), (got, vjp) = (jax.vjp(f, *args) for f in fns)
    if not empty_rows.any():
      return want, want_vjp(g), got, vjp(g), None
    # And the chunked gradient from the rows without a key, where there are some (else its cotangent is zero, and
    # so is the gradient: nothing to check); both cotangents in one backward pass.
    both = jax.vmap(vjp)(jnp.stack([g, g * empty_rows]))
    return want, want_vjp(g), got, jax.tree.map(lambda x: x[0], both), jax.tree.map(lambda x: x[1], both)

  want, want_grads, got, grads, grads_from_empty = run(q, kk, v, kt, vt)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-10)
  assert np.all(np.asarray(got)[np.broadcast_to(empty_rows, got.shape)] == 0)
  used = 3 if k is None else 5  # without Shaw terms the tables get no gradient
  for i, (a, b_) in enumerate(list(zip(want_grads, grads))[:used]):
    np.testing.assert_allclose(np.asarray(b_), np.asarray(a), rtol=1e-10, atol=1e-10)
    if grads_from_empty is not None:
      assert np.all(np.asarray(grads_from_empty[i]) == 0)


def test_window_with_a_traced_offset_matches_dense(x64, rng):
  # Cached decoding: a few queries at a traced position t over 40 keys; the
  # visited blocks follow t at run time.
  q, kk, v = qkv(rng, nq=3, nk=40)
  kt, vt = tables(rng, 2)

  @jax.jit
  def both(t):
    rel = attn.Relative(kt, vt, offset=t)
    mask = attn.Mask(causal=True, window=5)
    return (attn.dot_product_attention(q, kk, v, relative=rel, mask=mask, q_offset=t),
            chunked_attention(q, kk, v, relative=rel, mask=mask, q_offset=t, block_q=4, block_k=4))

  for t in (0, 6, 17, 37):
    dense, chunked = both(jnp.int32(t))
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(dense), rtol=1e-10, atol=1e-10)


def visited(plan: Plan, q_blocks: int, q_offset=0, rel_offset=0) -> dict:
  """``{(I, J): case}`` for every tile the plan visits; no tile twice."""
  tiles = {}
  for i in range(q_blocks):
    for v in plan.visits(i, q_offset, rel_offset):
      for j in range(int(v.first), int(v.last) + 1):
        assert (i, j) not in tiles, (i, j)
        tiles[i, j] = v.case
  return tiles


def block_pairs_with_a_visible_key(nq, nk, block_q, block_k, window, causal, q_offset) -> set:
  """The tiles holding at least one (query, key) pair that the mask allows."""
  allowed = np.asarray(attn.Mask(causal=causal, window=window).dense(nq, nk, q_offset))[0, 0]
  i, j = np.nonzero(allowed)
  return set(zip((i // block_q).tolist(), (j // block_k).tolist()))


def shaw_terms(k, offset=0):
  """What a plan reads of Shaw's terms: k from tables of 2k+1 rows (their values unused) and the offset; None: no
  terms."""
  return None if k is None else attn.Relative(jnp.zeros((2 * k + 1, 1)), offset=offset)


# Each length and window, causal or not, with and without Shaw terms, and every pair of those (a pairwise cover
# of the 12 combinations).
@pytest.mark.parametrize("length,block,window,causal,max_distance", [
    (1024, 64, 32, False, None), (1024, 64, 32, True, 16), (4096, 64, 32, False, 16), (4096, 64, 32, True, None),
    (1024, 64, 100, False, None), (1024, 64, 100, True, 16)])
def test_window_plan_visits_o_length_times_window_tiles(length, block, window, causal, max_distance):
  # Time is linear in the length: about (2 window / block + 2) key blocks
  # per query block, not all length / block of them, and exactly the tiles
  # that hold a visible key.
  n = length // block
  plan = Plan.make(block, block, length, causal, window, shaw_terms(max_distance))
  tiles = visited(plan, n)
  assert set(tiles) == block_pairs_with_a_visible_key(length, length, block, block, window, causal, 0)
  assert len(tiles) <= n * (2 * window // block + 2)
  assert len(visited(Plan.make(block, block, length, causal, None, shaw_terms(max_distance)), n)) == (
      n * (n + 1) // 2 if causal else n * n)


# Square and non-square blocks, Shaw offsets that are static (corners) and
# traced (band only), the window shifted past either end of the keys.
@pytest.mark.parametrize("nq,nk,block_q,block_k,window,causal,q_offset,static", [
    (64, 64, 8, 8, 3, False, 0, True), (64, 64, 8, 8, 8, True, 5, True), (48, 80, 8, 8, 13, False, -20, True),
    (48, 80, 6, 8, 10, False, 30, False), (40, 40, 4, 4, 0, True, -3, False), (40, 24, 8, 8, 2, False, 30, True)])
def test_window_plan_visits_exactly_the_visible_tiles_with_the_right_shaw_case(nq, nk, block_q, block_k, window,
                                                                              causal, q_offset, static):
  k = 5
  plan = Plan.make(block_q, block_k, nk, causal, window, shaw_terms(k, q_offset if static else jnp.int32(q_offset)))
  assert (plan.diagonals is not None) == (static and block_q == block_k)
  tiles = visited(plan, nq // block_q, q_offset, q_offset)
  assert set(tiles) == block_pairs_with_a_visible_key(nq, nk, block_q, block_k, window, causal, q_offset)
  for (i, j), case in tiles.items():  # an edge tile holds one bucket, outside a corner's box
    buckets = np.clip((j * block_k + np.arange(block_k))[None, :] - (i * block_q + np.arange(block_q))[:, None]
                      - q_offset, -k, k) + k
    outside = np.ones_like(buckets, bool)
    if isinstance(case, Corner):
      outside[case.rows, case.cols] = False
    side = case.side if isinstance(case, Corner) else case
    if side == LEFT:
      assert (buckets[outside] == 0).all(), (i, j)
    elif side == RIGHT:
      assert (buckets[outside] == 2 * k).all(), (i, j)


# ----------------------------------------------------------------------------
# The other schemes: plain, T5 and ALiBi biases, RoPE.


def test_plain_matches_dense(x64, rng):
  q, kk, v = qkv(rng)
  g = jnp.asarray(rng.normal(size=q.shape))
  compare(lambda q, kk, v: attn.dot_product_attention(q, kk, v),
          lambda q, kk, v: chunked_attention(q, kk, v, **BLOCKS), (q, kk, v), g)


T5_OPTIONS = dict(num_buckets=8, horizon=16)


@pytest.mark.parametrize("scheme,options,causal", [
    ("t5", T5_OPTIONS, False),
    ("t5", T5_OPTIONS, True),
    ("alibi_directional", {}, False),
    ("rope", {}, False),
])
def test_bias_and_rotary_schemes_match_dense_with_parameter_gradients(x64, rng, scheme, options, causal):
  b, nq, nk, h, d = 2, 7, 9, 3, 4
  q, kk, v = qkv(rng, b, nq, nk, h, d)
  q_offset = 2
  module = positions.make(scheme, h, d, causal=causal, options=options)
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), q, kk, q_offset, method=module.terms))
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape)), shapes)  # not all zeros
  mask = dense_mask(b, nq, nk, causal=causal, q_offset=q_offset)
  g = jnp.asarray(rng.normal(size=q.shape))

  def run(implementation):
    def f(params, q, kk, v):
      def body(mdl, q, kk, v):
        terms = mdl.terms(q, kk, q_offset)
        if implementation == "dense":
          return attn.dot_product_attention(terms.query, terms.key, v, bias=terms.bias(nq, nk, q_offset), mask=mask)
        return chunked_attention(terms.query, terms.key, v, bias_fn=terms.bias_fn, mask=attn.Mask(causal=causal),
                                 q_offset=q_offset, **BLOCKS)
      return module.apply(params, q, kk, v, method=body)
    return f

  compare(run("dense"), run("chunked"), (params, q, kk, v), g)


# ----------------------------------------------------------------------------
# Dropout, dtypes, memory, errors.


# Blocks (3, 4) take the general band loops; square blocks (5, 5) with k = 2
# the planned path, whose off-diagonal blocks have a one-cell corner.
@pytest.mark.parametrize("n,k,blocks", [(6, 1, BLOCKS), (11, 2, dict(block_q=5, block_k=5))])
def test_dropout_is_deterministic_per_rng_and_its_gradient_matches_finite_differences(x64, rng, n, k, blocks):
  q, kk, v = qkv(rng, b=1, nq=n - 1, nk=n, h=2, d=3)
  kt, vt = tables(rng, k, h=2, d=3)
  rel = attn.Relative(kt, vt)
  g = jnp.asarray(rng.normal(size=q.shape))
  # f and its gradient from one compilation: f(x, key) is value_and_grad(x, key)[0].
  value_and_grad = jax.jit(jax.value_and_grad(lambda x, key: jnp.sum(g * chunked_attention(
      x[0], kk, v, relative=attn.Relative(x[1], x[2]), dropout_rate=0.4, dropout_rng=key, **blocks))))
  f = lambda x, key: value_and_grad(x, key)[0]
  x, key = (q, kt, vt), jax.random.PRNGKey(3)
  assert float(f(x, key)) == float(f(x, key))
  assert float(f(x, key)) != float(f(x, jax.random.PRNGKey(4)))
  # Without dropout (the dense path, held to the chunked one above): one compilation less.
  no_dropout = jax.jit(lambda q: jnp.sum(g * attn.dot_product_attention(q, kk, v, relative=rel)))(q)
  assert float(f(x, key)) != pytest.approx(float(no_dropout))
  # The keep-mask is a fixed function of the rng, so f(., key) is smooth: the
  # custom backward pass (query and both tables, whose edge buckets take the
  # dropped masses) must agree with central differences.
  direction = tuple(jnp.asarray(rng.normal(size=t.shape)) for t in x)
  eps = 1e-6
  step = lambda sign: tuple(t + sign * eps * u for t, u in zip(x, direction))
  numeric = (f(step(1), key) - f(step(-1), key)) / (2 * eps)
  analytic = sum(jnp.sum(a * u) for a, u in zip(value_and_grad(x, key)[1], direction))
  np.testing.assert_allclose(float(analytic), float(numeric), rtol=1e-6)


def test_float32_and_bfloat16_inputs(rng):
  q, kk, v = (x.astype(jnp.float32) for x in qkv(rng))
  kt, vt = (t.astype(jnp.float32) for t in tables(rng, 2))
  dense = jax.jit(lambda *a: attn.dot_product_attention(*a[:3], relative=attn.Relative(*a[3:])))(q, kk, v, kt, vt)
  attend = lambda *a: chunked_attention(*a[:3], relative=attn.Relative(*a[3:]), **BLOCKS)
  chunked = jax.jit(attend)
  out32 = chunked(q, kk, v, kt, vt)
  assert out32.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out32), np.asarray(dense), rtol=1e-5, atol=1e-5)
  bf = lambda x: x.astype(jnp.bfloat16)
  out16 = chunked(bf(q), bf(kk), bf(v), bf(kt), bf(vt))
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out16, np.float32), np.asarray(dense), rtol=0.05, atol=0.05)
  # The running max, normaliser and output accumulators of every loop stay float32 on bfloat16 inputs.
  carried = loop_carries(jax.make_jaxpr(attend)(bf(q), bf(kk), bf(v), bf(kt), bf(vt)).jaxpr)
  floats = {str(a.dtype) for a in carried if jnp.issubdtype(a.dtype, jnp.floating)}
  assert carried and floats == {"float32"}, floats


def loop_carries(jaxpr) -> list:
  """The avals every while or scan loop of ``jaxpr`` (at any depth) carries from one iteration to the next."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "while":
      out += [v.aval for v in eqn.outvars]
    elif eqn.primitive.name == "scan":
      out += [v.aval for v in eqn.outvars[:eqn.params["num_carry"]]]
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (list, tuple)) else [param]):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          out += loop_carries(getattr(inner, "jaxpr", inner))
  return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rows_without_a_visible_key_are_zero_and_finite(rng, dtype):
  # Causal with a negative offset: the first five queries precede every key.
  # In low precision too they output exactly zero and pass no gradient
  # (test_dense.py::test_rows_without_a_key_are_zero_with_zero_gradient
  # holds both paths to the float64 reference).
  q, kk, v = (x.astype(dtype) for x in qkv(rng))
  kt, vt = (t.astype(dtype) for t in tables(rng, 2))
  f = lambda q, kk, v, kt, vt: chunked_attention(q, kk, v, relative=attn.Relative(kt, vt, offset=-5),
                                                 mask=attn.Mask(causal=True), q_offset=-5, **BLOCKS)

  @jax.jit
  def run(*args):
    out, vjp = jax.vjp(f, *args)
    grads = jax.vmap(vjp)(jnp.stack([jnp.ones_like(out), jnp.ones_like(out).at[:, 5:].set(0)]))  # one backward pass
    return out, jax.tree.map(lambda x: x[0], grads), jax.tree.map(lambda x: x[1], grads)

  out, grads, grads_from_empty = run(q, kk, v, kt, vt)
  out = np.asarray(out, np.float32)
  assert np.all(np.isfinite(out)) and np.all(out[:, :5] == 0) and np.all(np.any(out[:, 5:] != 0, axis=-1))
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g, np.float32)))
  assert np.all(np.asarray(grads[0], np.float32)[:, :5] == 0)
  for g in grads_from_empty:
    assert np.all(np.asarray(g, np.float32) == 0)


def test_memory_grows_linearly_with_length():
  # Compiled scratch memory of forward + backward at L and 4L: dense attention
  # grows 16x, the chunked path about 4x (one block's scratch is constant).
  def temp_bytes(length):
    x = jnp.zeros((1, length, 2, 16))
    table = jnp.zeros((2, 2 * 16 + 1, 16))

    def loss(x, table):
      rel = attn.Relative(table, table)
      return jnp.sum(chunked_attention(x, x, x, relative=rel, block_q=64, block_k=64))

    return jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, table).compile().memory_analysis().temp_size_in_bytes

  ratio = temp_bytes(2048) / temp_bytes(512)
  assert ratio < 5, ratio


@pytest.mark.parametrize("kw,match", [
    (dict(relative=attn.Relative(ids=jnp.zeros((7, 9), jnp.int32), key_table=jnp.zeros((3, 4)))), "ids"),
    (dict(block_q=0), "block_q"),
    (dict(block_k=2.5), "block_k"),
    (dict(mask=attn.Mask(key_valid=jnp.ones((2, 7), bool))), "key_valid"),
    (dict(mask=attn.Mask(window=-1)), "window"),
    (dict(dropout_rate=0.1), "dropout_rng"),
    (dict(dropout_rate=1.0, dropout_rng=jax.random.PRNGKey(0)), "dropout_rate"),
    (dict(mask=jnp.ones((2, 3, 9, 9), bool)), "Mask.array"),
])
def test_bad_arguments_raise(rng, kw, match):
  q, kk, v = qkv(rng)
  with pytest.raises(ValueError, match=match):
    chunked_attention(q, kk, v, **kw)


# ----------------------------------------------------------------------------
# The layer: implementation="chunked" is a drop-in for "dense" with the same parameters.


OPTIONS = {"shaw": dict(max_distance=2), "t5": dict(num_buckets=8, horizon=16)}


# Every registered scheme the layer takes by name (those acting in attention, and none; the absolute ones act
# at the embeddings only, outside the layer), plain or causal in turn (both for Shaw: the causal corner blocks);
# and a window (restricted attention) with the schemes that act in attention in different ways (Shaw's tables,
# T5's bias, RoPE's rotation).
IN_ATTENTION = sorted(p for p, cls in positions.SCHEMES.items() if p == "none" or cls.acts_in_attention())
SCHEME_CASES = [(p, i % 2 == 1) for i, p in enumerate(IN_ATTENTION)]
SCHEME_CASES += [("shaw", not dict(SCHEME_CASES)["shaw"])]


@pytest.mark.parametrize("position,causal,window",
                         [(p, c, None) for p, c in SCHEME_CASES]
                         + [("shaw", True, 3), ("t5", False, 2), ("rope", False, 2)])
def test_layer_chunked_equals_dense_for_every_scheme(rng, position, causal, window):
  make = lambda implementation: MultiHeadAttention(num_heads=2, position=position,
                                                   position_options=OPTIONS.get(position), max_length=16,
                                                   causal=causal, window=window, implementation=implementation)
  x = jnp.asarray(rng.normal(size=(2, 11, 8)), jnp.float32)
  valid = jnp.asarray(np.arange(11)[None, :] < np.array([[11], [7]]))  # [b, k]
  shapes = jax.eval_shape(lambda: make("dense").init(jax.random.PRNGKey(0), x, key_valid=valid))  # nothing compiled
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 0.5, p.dtype), shapes)
  weights = jnp.asarray(rng.normal(size=x.shape), jnp.float32)

  @jax.jit
  def run(params):
    outs = []
    for implementation in ("dense", "chunked"):
      loss = lambda p: jnp.sum(make(implementation).apply(p, x, key_valid=valid) * weights)
      outs.append(jax.value_and_grad(loss)(params))
    return outs

  (v1, g1), (v2, g2) = run(params)
  np.testing.assert_allclose(float(v2), float(v1), rtol=1e-4)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-3, atol=2e-4)


def test_layer_rejects_bad_implementation():
  x = jnp.zeros((1, 3, 4))
  with pytest.raises(ValueError, match=r"unknown attention implementation 'flash'; allowed: "
                                       r"\['additive', 'chunked', 'dense'\]"):
    MultiHeadAttention(num_heads=2, implementation="flash").init(jax.random.PRNGKey(0), x)
