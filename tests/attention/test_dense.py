"""rpr.attention (dense, chunked) and rpr.attention.reference against float64 loops written from the equations.

Shaw et al. (2018), for heads of size d:

    e_ij = q_i (k_j + a^K_ij)^T / sqrt(d),  alpha = softmax_j(e_ij),  z_i = sum_j alpha_ij (v_j + a^V_ij)
    a^K_ij = w^K_{clip(j - i, k)},  a^V_ij = w^V_{clip(j - i, k)}

Computations under test are jitted once per case: compiling a whole check is
about ten times faster than running its primitives eagerly on fresh shapes.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import attention as attn
from rpr.attention import reference
from rpr.attention.dense_terms import relative_logits

# Programs compiled as one LLVM module (see tests/attention/test_chunked.py).

# ----------------------------------------------------------------------------
# Oracles: one scalar at a time, straight from the equations.


def shaw_loop(q, k, v, key_table, value_table, max_distance, offset=0, mask=None, ids=None):
  """Per-element Shaw attention in float64 numpy; returns (z [b, q, h, d], alpha [b, h, q, k]).

  Query ``i`` sits at position ``i + offset``; masked keys get weight exactly 0,
  and a row without any visible key attends to nothing (zero weights, zero output).
  """
  b, nq, h, d = q.shape
  nk = k.shape[1]
  visible = np.ones((b, h, nq, nk), bool) if mask is None else np.broadcast_to(np.asarray(mask), (b, h, nq, nk))

  def relation(bi, i, j):
    if ids is None:
      return min(max(j - (i + offset), -max_distance), max_distance) + max_distance
    return ids[i, j] if ids.ndim == 2 else ids[bi, i, j]

  def row(table, hi, r):
    if table is None:
      return np.zeros(d)
    return table[r] if table.ndim == 2 else table[hi, r]

  z = np.zeros((b, nq, h, d))
  alpha = np.zeros((b, h, nq, nk))
  for bi in range(b):
    for hi in range(h):
      for i in range(nq):
        if not visible[bi, hi, i].any():
          continue
        e = np.full(nk, -np.inf)
        for j in range(nk):
          if visible[bi, hi, i, j]:
            a_k = row(key_table, hi, relation(bi, i, j))
            e[j] = np.dot(q[bi, i, hi], k[bi, j, hi] + a_k) / math.sqrt(d)
        w = np.exp(e - e.max())
        w /= w.sum()
        alpha[bi, hi, i] = w
        for j in range(nk):
          a_v = row(value_table, hi, relation(bi, i, j))
          z[bi, i, hi] += w[j] * (v[bi, j, hi] + a_v)
  return z, alpha


def additive_loop(q, k, v, score, mask=None):
  """Bahdanau: e_ij = score_h^T tanh(q_i + k_j), alpha = softmax_j(e), z_i = sum_j alpha_ij v_j (0 if no key)."""
  b, nq, h, _ = q.shape
  nk = k.shape[1]
  score = np.broadcast_to(score, (h, q.shape[-1]))
  visible = np.ones((b, h, nq, nk), bool) if mask is None else np.broadcast_to(np.asarray(mask), (b, h, nq, nk))
  z = np.zeros((b, nq, h, v.shape[-1]))
  for bi in range(b):
    for hi in range(h):
      for i in range(nq):
        if not visible[bi, hi, i].any():
          continue
        e = np.array([np.dot(score[hi], np.tanh(q[bi, i, hi] + k[bi, j, hi])) if visible[bi, hi, i, j] else -np.inf
                      for j in range(nk)])
        w = np.exp(e - e.max())
        w /= w.sum()
        z[bi, i, hi] = w @ v[bi, :, hi]
  return z


# ----------------------------------------------------------------------------
# Inputs.

B, H, D = 2, 2, 3


def qkv(rng, nq=4, nk=4, d=D):
  return (rng.normal(size=(B, nq, H, d)), rng.normal(size=(B, nk, H, d)), rng.normal(size=(B, nk, H, d)))


def tables(rng, layout, terms, rows, d=D):
  """(key_table, value_table) in the ``shared`` [rows, d] or ``per_head`` [H, rows, d] layout."""
  shape = (rows, d) if layout == "shared" else (H, rows, d)
  kt = rng.normal(size=shape) if terms in ("both", "keys") else None
  vt = rng.normal(size=shape) if terms in ("both", "values") else None
  return kt, vt


def padding(nq, nk, k_lengths=(4, 2)):
  """[B, 1, q, k]: batch element b sees its first k_lengths[b] keys."""
  valid = np.arange(nk)[None, :] < np.asarray(k_lengths)[:, None]
  return np.broadcast_to(valid[:, None, None, :], (B, 1, nq, nk))


def tree_relations(parents):
  """Relation ids of a rooted tree: 0 self, 1 j is i's parent, 2 j is i's child, 3 sibling, 4 other."""
  n = len(parents)
  ids = np.full((n, n), 4)
  for i in range(n):
    for j in range(n):
      if i == j:
        ids[i, j] = 0
      elif parents[i] == j:
        ids[i, j] = 1
      elif parents[j] == i:
        ids[i, j] = 2
      elif parents[i] == parents[j]:
        ids[i, j] = 3
  return ids


def as_jnp(x):
  return None if x is None else jnp.asarray(x)


@functools.partial(jax.jit, static_argnames=("offset",))
def fast_and_reference(q, k, v, table_pairs, mask, ids, *, offset):
  """(fast, reference) outputs and weights for each (key_table, value_table) pair, in one compilation."""
  results = []
  for kt, vt in table_pairs:
    relative = attn.Relative(kt, vt, offset, ids)
    results.append((attn.dot_product_attention(q, k, v, mask=mask, relative=relative, return_weights=True),
                    reference.shaw_attention_reference(q, k, v, kt, vt, offset, mask, ids,
                                                       return_weights=True)))
  return results


def check_against_loop(q, k, v, table_pairs, max_distance, offset=0, mask=None, ids=None):
  """Fast path, reference and loop agree on outputs and weights (float64) for every table pair."""
  pairs = [(as_jnp(kt), as_jnp(vt)) for kt, vt in table_pairs]
  results = fast_and_reference(*map(as_jnp, (q, k, v)), pairs, as_jnp(mask), as_jnp(ids), offset=offset)
  for (kt, vt), ((fast, fast_w), (ref, ref_w)) in zip(table_pairs, results):
    assert fast.dtype == jnp.float64
    z, alpha = shaw_loop(q, k, v, kt, vt, max_distance, offset, mask, ids)
    terms = f"a^K {'on' if kt is not None else 'off'}, a^V {'on' if vt is not None else 'off'}"
    for name, got, want in (("fast", fast, z), ("fast weights", fast_w, alpha), ("reference", ref, z),
                            ("reference weights", ref_w, alpha)):
      np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12, err_msg=f"{name}, {terms}")


# ----------------------------------------------------------------------------
# 1. Shaw attention equals the loop.

TERMS = ("both", "keys", "values", "neither")


@pytest.mark.parametrize("mask", ["padding", "causal"])
@pytest.mark.parametrize("layout", ["shared", "per_head"])
def test_shaw_matches_loop_every_term_combination(x64, rng, layout, mask):
  # a^K and a^V each on or off: both, keys only, values only, neither.
  q, k, v = qkv(rng, nq=5, nk=5)
  pairs = [tables(rng, layout, terms, rows=5) for terms in TERMS]
  # Both masks [B, 1, 5, 5]: the two cases of a layout share fast_and_reference's compilation.
  mask = padding(5, 5, (5, 3)) if mask == "padding" else np.broadcast_to(attn.causal_mask(5, 5), (B, 1, 5, 5))
  check_against_loop(q, k, v, pairs, 2, mask=mask)


def test_shaw_matches_loop_unmasked_clipped(x64, rng):
  # Length 6 with k = 1: most pairs are clipped.
  q, k, v = qkv(rng, nq=6, nk=6)
  check_against_loop(q, k, v, [tables(rng, "per_head", "both", rows=3)], 1)


@pytest.mark.parametrize("layout,offset,nq", [("shared", 4, 1), ("per_head", 2, 3)])
def test_shaw_matches_loop_decoder_offset(x64, rng, layout, offset, nq):
  # Decoder steps: nq queries at positions offset..offset+nq-1 over 5 cached keys, causal.
  q, k, v = qkv(rng, nq=nq, nk=5)
  pairs = [tables(rng, layout, "both", rows=5)]
  check_against_loop(q, k, v, pairs, 2, offset=offset, mask=np.asarray(attn.causal_mask(nq, 5, offset)))


@pytest.mark.parametrize("offset,nq,nk", [(0, 5, 5), (2, 3, 6), (-3, 4, 2)])
def test_shaw_matches_loop_when_k_exceeds_every_distance(x64, rng, offset, nq, nk):
  # k = 9 on a few positions: only the rows the lengths can reach are used (the tables get cut).
  q, k, v = qkv(rng, nq=nq, nk=nk)
  reach = max(nq - 1 + offset, nk - 1 - offset)
  relative = attn.Relative(*map(as_jnp, tables(rng, "shared", "both", rows=19)), offset)
  cut = relative.within(nq, nk)
  assert cut.max_distance == reach < 9 and cut.key_table.shape[0] == cut.value_table.shape[0] == 2 * reach + 1
  np.testing.assert_array_equal(cut.key_table, relative.key_table[9 - reach:9 + reach + 1])
  check_against_loop(q, k, v, [tables(rng, layout, "both", rows=19) for layout in ("shared", "per_head")], 9,
                     offset=offset, mask=padding(nq, nk))


def test_within_keeps_the_tables_when_the_lengths_reach_k_or_the_offset_is_traced():
  table = jnp.ones((11, 4))
  relative = attn.Relative(table, table)
  assert relative.within(6, 6) is relative  # distance 5 is reachable
  assert relative.within(4, 4).max_distance == 3
  traced = jax.jit(lambda t: attn.Relative(table, table, t).within(4, 4).max_distance)
  assert traced(jnp.int32(0)) == 5
  ids = attn.Relative(jnp.ones((3, 4)), None, 0, jnp.zeros((2, 2), jnp.int32))
  assert ids.within(2, 2) is ids


@pytest.mark.parametrize("layout,per_batch", [("shared", False), ("per_head", True)])
def test_shaw_matches_loop_explicit_tree_ids(x64, rng, layout, per_batch):
  # Relations of a tree instead of distances: [q, k] shared by the batch or [batch, q, k].
  trees = [tree_relations([-1, 0, 0, 1, 1]), tree_relations([-1, 0, 1, 2, 2])]
  ids = np.stack(trees) if per_batch else trees[0]
  assert len(np.unique(ids)) == 5
  q, k, v = qkv(rng, nq=5, nk=5)
  pairs = [tables(rng, layout, "both", rows=5)]
  check_against_loop(q, k, v, pairs, 0, ids=ids, mask=padding(5, 5, (5, 4)))


GRAD_CASES = {
    "shared-padding": dict(layout="shared", nq=4, nk=4, max_distance=2, offset=0, mask="padding", ids=False),
    "per_head-causal-offset": dict(layout="per_head", nq=2, nk=5, max_distance=1, offset=3, mask="causal", ids=False),
    "shared-k0": dict(layout="shared", nq=3, nk=3, max_distance=0, offset=0, mask=None, ids=False),
    "per_head-tree-ids": dict(layout="per_head", nq=5, nk=5, max_distance=0, offset=0, mask=None, ids=True),
    # k beyond every reachable distance: the tables are cut to rows k-3 .. k+3 (Relative.within).
    "per_head-k-beyond-reach": dict(layout="per_head", nq=3, nk=4, max_distance=6, offset=1, mask="padding",
                                    ids=False),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gradients_match_reference(x64, rng, case):
  c = GRAD_CASES[case]
  q, k, v = qkv(rng, c["nq"], c["nk"])
  rows = 5 if c["ids"] else 2 * c["max_distance"] + 1
  kt, vt = tables(rng, c["layout"], "both", rows)
  mask = {None: None, "padding": padding(c["nq"], c["nk"]),
          "causal": np.asarray(attn.causal_mask(c["nq"], c["nk"], c["offset"]))}[c["mask"]]
  ids = np.stack([tree_relations([-1, 0, 0, 1, 1]), tree_relations([-1, 0, 1, 2, 2])]) if c["ids"] else None
  cotangent = rng.normal(size=q.shape)
  kd, off = c["max_distance"], c["offset"]

  def loss(fn):
    return lambda *a: jnp.sum(fn(*a) * cotangent)

  fast = loss(lambda q, k, v, kt, vt: attn.dot_product_attention(
      q, k, v, mask=as_jnp(mask), relative=attn.Relative(kt, vt, off, as_jnp(ids))))
  slow = loss(lambda q, k, v, kt, vt: reference.shaw_attention_reference(
      q, k, v, kt, vt, off, as_jnp(mask), as_jnp(ids)))
  args = tuple(map(jnp.asarray, (q, k, v, kt, vt)))
  grads = jax.jit(lambda *a: (jax.grad(fast, argnums=range(5))(*a), jax.grad(slow, argnums=range(5))(*a)))(*args)
  for name, g_fast, g_slow in zip(("query", "key", "value", "key_table", "value_table"), *grads):
    assert np.any(np.asarray(g_slow) != 0), name  # the comparison must be able to fail
    np.testing.assert_allclose(np.asarray(g_fast), np.asarray(g_slow), rtol=1e-9, atol=1e-12, err_msg=name)


# ----------------------------------------------------------------------------
# 2. Clipping.


@functools.partial(jax.jit, static_argnames=("offset",))
def shaw(q, k, v, kt, vt, mask=None, *, offset=0):
  return attn.dot_product_attention(q, k, v, mask=mask, relative=attn.Relative(kt, vt, offset))


@pytest.mark.parametrize("offset,nq", [(0, 7), (6, 1)])
def test_clipped_tables_equal_unclipped_tables_with_edges_repeated(x64, rng, offset, nq):
  # Keys at distance 3, 4, ... must get exactly the distance-2 vectors: a k = 2
  # layer equals a k = 6 (no clipping on 7 keys) layer whose rows for
  # |distance| > 2 are copies of the distance +-2 rows.
  q, k, v = qkv(rng, nq=nq, nk=7)
  kt, vt = tables(rng, "per_head", "both", rows=5)
  edge = np.clip(np.arange(-6, 7), -2, 2) + 2
  wide_kt, wide_vt = kt[:, edge], vt[:, edge]
  clipped = shaw(*map(jnp.asarray, (q, k, v, kt, vt)), offset=offset)
  wide = shaw(*map(jnp.asarray, (q, k, v, wide_kt, wide_vt)), offset=offset)
  np.testing.assert_allclose(np.asarray(clipped), np.asarray(wide), rtol=1e-12, atol=1e-12)
  # And the far rows matter: changing a wide table's outer rows changes the output.
  wide_kt[:, 0] += 1.0
  moved = shaw(*map(jnp.asarray, (q, k, v, wide_kt, wide_vt)), offset=offset)
  assert np.max(np.abs(np.asarray(moved) - np.asarray(wide))) > 1e-3


def test_clipped_key_contribution_is_the_distance_2_vector(x64, rng):
  # The a^K logits term directly: q_0 . w^K_{clip(j)} / sqrt(d) for keys j = 0..6.
  q = rng.normal(size=(1, 1, 1, D))
  kt = rng.normal(size=(5, D))
  scaled = q / math.sqrt(D)
  got = np.asarray(jax.jit(lambda q, t: relative_logits(q, attn.Relative(t), 7))(
      jnp.asarray(scaled), jnp.asarray(kt)))[0, 0, 0]
  want = [scaled[0, 0, 0] @ kt[min(j, 2) + 2] for j in range(7)]
  np.testing.assert_allclose(got, want, rtol=1e-12)
  assert np.all(got[3:] == got[2])


def test_shaw_offset_is_translation_invariant(x64, rng):
  # Queries at offset 1 over keys 0..3, versus the same queries at offset 4
  # over the same keys moved to 3..6 (three masked keys in front): every
  # j - i is unchanged, so the output must be too.
  q, k, v = qkv(rng, nq=2, nk=4)
  kt, vt = tables(rng, "per_head", "both", rows=5)
  junk = rng.normal(size=(B, 3, H, D))
  k2, v2 = np.concatenate([junk, k], 1), np.concatenate([junk, v], 1)
  mask = (np.arange(7) >= 3)[None, None, None, :]
  base = shaw(*map(jnp.asarray, (q, k, v, kt, vt)), offset=1)
  moved = shaw(*map(jnp.asarray, (q, k2, v2, kt, vt, mask)), offset=4)
  np.testing.assert_allclose(np.asarray(moved), np.asarray(base), rtol=1e-12, atol=1e-12)
  # Moving only the keys changes every distance, and the output.
  unmoved = shaw(*map(jnp.asarray, (q, k2, v2, kt, vt, mask)), offset=1)
  assert np.max(np.abs(np.asarray(unmoved) - np.asarray(base))) > 1e-3


@jax.jit
def shaw_self(x, wq, wk, wv, kt, vt):
  """Self-attention with projections, so permuting the input permutes q, k and v together."""
  proj = lambda w: jnp.einsum("bnf,fhd->bnhd", x, w)
  return attn.dot_product_attention(proj(wq), proj(wk), proj(wv),
                                    relative=attn.Relative(kt, vt))


def test_k0_is_blind_to_order(x64, rng):
  q, k, v = qkv(rng, nq=5, nk=6)
  kt, vt = tables(rng, "per_head", "both", rows=1)
  perm = rng.permutation(6)
  args = lambda k, v: tuple(map(jnp.asarray, (q, k, v, kt, vt)))
  base = shaw(*args(k, v))
  permuted = shaw(*args(k[:, perm], v[:, perm]))
  np.testing.assert_allclose(np.asarray(permuted), np.asarray(base), rtol=1e-12, atol=1e-12)
  # The same permutation is visible with k = 1 (so the check above can fail).
  kt1, vt1 = tables(rng, "per_head", "both", rows=3)
  base1 = shaw(*map(jnp.asarray, (q, k, v, kt1, vt1)))
  permuted1 = shaw(*map(jnp.asarray, (q, k[:, perm], v[:, perm], kt1, vt1)))
  assert np.max(np.abs(np.asarray(permuted1) - np.asarray(base1))) > 1e-3


@pytest.mark.parametrize("max_distance,equivariant", [(0, True), (1, False)])
def test_k0_self_attention_is_permutation_equivariant(x64, rng, max_distance, equivariant):
  x = rng.normal(size=(B, 6, 4))
  w = [rng.normal(size=(4, H, D)) for _ in range(3)]
  kt, vt = tables(rng, "shared", "both", rows=2 * max_distance + 1)
  perm = rng.permutation(6)
  f = lambda x: np.asarray(shaw_self(*map(jnp.asarray, (x, *w, kt, vt))))
  gap = np.max(np.abs(f(x[:, perm]) - f(x)[:, perm]))
  assert (gap < 1e-12) == equivariant, gap


# ----------------------------------------------------------------------------
# 5. Masks.


def test_padded_keys_get_zero_weight_and_their_values_do_not_matter(rng):
  q, k, v = qkv(rng, nq=4, nk=5)
  kt, vt = tables(rng, "per_head", "both", rows=5)
  mask = padding(4, 5, (5, 3))
  run = jax.jit(lambda q, k, v, kt, vt, m: attn.dot_product_attention(
      q, k, v, mask=m, relative=attn.Relative(kt, vt), return_weights=True))
  args = lambda k, v: tuple(jnp.asarray(a, jnp.float32) for a in (q, k, v, kt, vt)) + (jnp.asarray(mask),)
  out, weights = run(*args(k, v))
  assert np.all(np.asarray(weights)[1, :, :, 3:] == 0.0)  # exactly zero, not just small
  assert np.all(np.asarray(weights)[0] > 0.0)
  k2, v2 = k.copy(), v.copy()
  k2[1, 3:] = 1e3 * rng.normal(size=k2[1, 3:].shape)
  v2[1, 3:] = 1e3 * rng.normal(size=v2[1, 3:].shape)
  out2, _ = run(*args(k2, v2))
  np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))


def test_causal_mask_positions():
  m = np.asarray(attn.causal_mask(2, 5, offset=2))[0, 0]
  np.testing.assert_array_equal(m, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])


def _empty_row_mask(case, nq, nk):
  """(Mask, q_offset) leaving some query rows without any key, three ways."""
  if case == "key_valid":  # batch element 1 has no valid key
    return attn.Mask(key_valid=jnp.asarray(np.arange(nk)[None, :] < np.array([[nk - 1], [0]]))), 0
  if case == "causal_negative_offset":  # queries at -3..nq-4: the first three precede every key
    return attn.Mask(causal=True), -3
  # window 1 around each query, and an array that forbids exactly those keys for rows 1 and 4 (batch 0)
  # and row 2 (batch 1)
  near = np.abs(np.arange(nk)[None, :] - np.arange(nq)[:, None]) <= 1
  rows = np.zeros((B, nq), bool)
  rows[0, [1, 4]] = rows[1, 2] = True
  array = ~(near[None] & rows[:, :, None])[:, None]  # [B, 1, nq, nk]
  return attn.Mask(window=1, array=jnp.asarray(array)), 0


@pytest.mark.parametrize("case", ["key_valid", "causal_negative_offset", "window_and_array"])
def test_rows_without_a_key_are_zero_with_zero_gradient(x64, rng, case):
  # A query that the mask leaves without any key attends to nothing: dense,
  # chunked and the float64 reference output exactly zero there and pass no
  # gradient from it to q, k, v or Shaw's tables; every other row is the
  # ordinary attention, in all three and in the loop.
  nq, nk, kd = 6, 7, 2
  q, k, v = qkv(rng, nq, nk)
  kt, vt = tables(rng, "per_head", "both", rows=2 * kd + 1)
  mask, off = _empty_row_mask(case, nq, nk)
  dense_mask = np.broadcast_to(np.asarray(mask.dense(nq, nk, off)), (B, H, nq, nk))
  empty = ~dense_mask.any(-1)  # [B, H, nq]
  assert empty.any() and not empty.all()
  empty_rows = np.transpose(empty, (0, 2, 1))[..., None]  # [B, nq, H, 1], as the output
  cotangents = (rng.normal(size=q.shape), rng.normal(size=q.shape) * empty_rows)  # everywhere; empty rows only

  fns = {
      "dense": lambda q, k, v, kt, vt: attn.dot_product_attention(
          q, k, v, mask=mask, q_offset=off, relative=attn.Relative(kt, vt, off)),
      "chunked": lambda q, k, v, kt, vt: attn.chunked_attention(
          q, k, v, mask=mask, q_offset=off, relative=attn.Relative(kt, vt, off), block_q=3, block_k=4),
      "reference": lambda q, k, v, kt, vt: reference.shaw_attention_reference(
          q, k, v, kt, vt, off, jnp.asarray(dense_mask)),
  }

  @jax.jit
  def run(*args):
    results = {}
    for name, f in fns.items():
      out, vjp = jax.vjp(f, *args)
      grads = jax.vmap(vjp)(jnp.asarray(np.stack(cotangents)))  # one backward pass for both cotangents
      results[name] = out, [jax.tree.map(lambda g: g[i], grads) for i in range(len(cotangents))]
    _, weights = attn.dot_product_attention(*args[:3], mask=mask, q_offset=off,
                                            relative=attn.Relative(*args[3:], off), return_weights=True)
    return results, weights

  results, weights = run(*map(jnp.asarray, (q, k, v, kt, vt)))
  z, alpha = shaw_loop(q, k, v, kt, vt, kd, off, dense_mask)
  assert np.all(np.asarray(weights)[empty] == 0)
  np.testing.assert_allclose(np.asarray(weights), alpha, rtol=1e-10, atol=1e-12)
  names = ("query", "key", "value", "key_table", "value_table")
  want_grads = results["reference"][1][0]
  for name, (out, (grads, grads_from_empty)) in results.items():
    out = np.asarray(out)
    assert np.all(out[np.broadcast_to(empty_rows, out.shape)] == 0), name  # exactly zero
    np.testing.assert_allclose(out, z, rtol=1e-10, atol=1e-12, err_msg=name)
    for arg, g in zip(names, grads_from_empty):
      assert np.all(np.asarray(g) == 0), f"{name}: gradient reaches {arg} from a row without keys"
    for arg, g, want in zip(names, grads, want_grads):
      assert np.all(np.isfinite(np.asarray(g))), (name, arg)
      assert np.any(np.asarray(want) != 0), arg  # the comparison must be able to fail
      np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-9, atol=1e-12, err_msg=f"{name}, {arg}")


# ----------------------------------------------------------------------------
# 9. Restricted (local-window) attention and additive attention.
#
# Restricted attention is Mask(window=r): query i (at q_offset + i) sees keys
# |j - (q_offset + i)| <= r. Dense masks it; chunked evaluates it per block.
# Both must equal dot_product_attention with the window_mask array.


@pytest.mark.parametrize("nq,nk,window,causal,padded,q_offset", [
    (7, 7, 2, False, True, 0), (7, 7, 2, True, True, 0), (8, 8, 3, False, False, 0), (8, 8, 3, True, True, 0),
    (5, 5, 1, False, True, 0), (5, 5, 1, True, False, 0),
    (3, 3, 4, False, True, 0),  # window longer than the sequence
    (6, 6, 0, False, True, 0),  # window 0: each query sees its own position only
    (4, 9, 2, True, True, 3),  # a decoder chunk at positions 3..6 over 9 keys
    (5, 7, 1, False, True, -2),  # queries before the keys: the first ones see no key at all
])
def test_window_mask_equals_windowed_dot_product(rng, nq, nk, window, causal, padded, q_offset):
  q, k, v = (a.astype(np.float32) for a in qkv(rng, nq=nq, nk=nk))
  k_valid = np.arange(nk)[None, :] < np.asarray([nk, nk - 2 if padded else nk])[:, None]

  @jax.jit
  def run(q, k, v, k_valid):
    mask = attn.Mask(key_valid=k_valid, causal=causal, window=window)
    array = attn.combine(attn.window_mask(nq, nk, window, offset=q_offset, causal=causal),
                         attn.padding_mask(None, k_valid))
    return (attn.dot_product_attention(q, k, v, mask=mask, q_offset=q_offset),
            attn.chunked_attention(q, k, v, mask=mask, q_offset=q_offset, block_q=3, block_k=2),
            attn.dot_product_attention(q, k, v, mask=array), array)

  dense, chunked, want, array = map(np.asarray, run(q, k, v, k_valid))
  visible = array[:, 0]  # [B, nq, nk]: the window mask of the query's position and the valid keys
  assert visible.any(-1).sum() >= nq  # the comparison covers real rows
  # Every row, including rows with no visible key (a padded query whose
  # whole window is padding, a query before every key): those output zero.
  np.testing.assert_allclose(dense, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(chunked, want, rtol=1e-5, atol=1e-6)
  empty = ~visible.any(-1)  # [B, nq]
  assert np.all(dense[empty] == 0) and np.all(chunked[empty] == 0)
  assert np.all(np.any(want[~empty] != 0, axis=-1))


def test_window_mask_positions():
  m = np.asarray(attn.window_mask(3, 6, 1, offset=2))[0, 0]
  np.testing.assert_array_equal(m, [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]])
  # The Mask's dense form is the same array, and with causal only the past half of it.
  np.testing.assert_array_equal(np.asarray(attn.Mask(window=1).dense(3, 6, 2))[0, 0], m)
  causal = np.asarray(attn.Mask(window=1, causal=True).dense(3, 6, 2))[0, 0]
  np.testing.assert_array_equal(causal, [[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0]])


# Second case: batch element 1 has no valid key at all, so its rows are zero.
@pytest.mark.parametrize("shared_score,k_lengths", [(False, (5, 2)), (True, (5, 0))])
def test_additive_attention_matches_loop(x64, rng, shared_score, k_lengths):
  q, k, v = qkv(rng, nq=3, nk=5)
  score = rng.normal(size=(D,) if shared_score else (H, D))
  mask = padding(3, 5, k_lengths)
  got = jax.jit(lambda *a: attn.additive_attention(*a[:4], mask=a[4]))(*map(jnp.asarray, (q, k, v, score, mask)))
  want = additive_loop(q, k, v, score, mask)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)
  assert np.all(np.asarray(got)[1] == 0) == (k_lengths[1] == 0)


# ----------------------------------------------------------------------------
# 8. Bad arguments fail naming the value and what is allowed.


def _qkv32(nq=4, nk=4, dq=D, dk=D):
  z = lambda n, d: jnp.zeros((B, n, H, d))
  return z(nq, dq), z(nk, dk), z(nk, dk)


# Every implementation runs check_qkv and Mask.check before any work.
ATTENTION = {"dense": attn.dot_product_attention, "chunked": attn.chunked_attention,
             "additive": lambda q, k, v, **kw: attn.additive_attention(q, k, v, jnp.zeros(q.shape[-1:], q.dtype), **kw)}


@pytest.mark.parametrize("relative,match", [
    (attn.Relative(jnp.zeros((4, D))), r"key_table has shape \(4, 3\); allowed: \[2k\+1, 3\] or \[2, 2k\+1, 3\] "
                                       r"\(an odd count: it gives the clipping distance k\)"),
    (attn.Relative(jnp.zeros((3, D)), jnp.zeros((H, 5, D))),
     r"value_table has shape \(2, 5, 3\); allowed: \[3, 3\] or \[2, 3, 3\] \(the rows of key_table\)"),
    (attn.Relative(jnp.zeros((D,))), r"key_table has shape \(3,\); allowed: \[2k\+1, 3\]"),
    (attn.Relative(jnp.zeros((3, 2, 3, D)), ids=jnp.zeros((4, 4), jnp.int32)),
     r"key_table has shape \(3, 2, 3, 3\); allowed: \[R, 3\] or \[2, R, 3\]$"),
    (attn.Relative(jnp.zeros((3, D + 1))), r"key_table head_dim is 4, but the heads have head_dim 3"),
    (attn.Relative(jnp.zeros((H + 1, 3, D))), r"key_table has 3 head tables, but attention has 2 heads"),
])
def test_bad_relative_tables_raise(relative, match):
  with pytest.raises(ValueError, match=match):
    attn.dot_product_attention(*_qkv32(), relative=relative)


def test_query_key_head_dim_mismatch_raises():
  q, _, _ = _qkv32(dq=4)
  _, k, v = _qkv32()
  with pytest.raises(ValueError, match=r"query and key head_dim differ: query \(2, 4, 2, 4\) vs key \(2, 4, 2, 3\)"):
    attn.dot_product_attention(q, k, v)


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("mask", [jnp.ones((4, 4), bool), jnp.ones((B, 1, 4, 5), bool), jnp.ones((3, 1, 1, 4), bool)])
def test_mask_of_wrong_shape_raises(mask, wrap):
  # A bare array is taken as Mask(array=...): the same check, the same message.
  with pytest.raises(ValueError, match=rf"Mask\.array has shape {re_shape(mask.shape)}; it must broadcast to "
                                       r"\[batch, heads, q_length, k_length\] = \(2, 2, 4, 4\)"):
    attn.dot_product_attention(*_qkv32(), mask=attn.Mask(array=mask) if wrap else mask)


@pytest.mark.parametrize("fn", ["dense", "chunked"])
def test_mask_key_valid_of_wrong_shape_raises(fn):
  with pytest.raises(ValueError, match=r"Mask\.key_valid has shape \(2, 3\); allowed: \[batch, k_length\] = "
                                       r"\(2, 4\) \(or \[1, k_length\]\)"):
    ATTENTION[fn](*_qkv32(), mask=attn.Mask(key_valid=jnp.ones((B, 3), bool)))


def re_shape(shape):
  return r"\(" + ", ".join(map(str, shape)) + r"\)"


@pytest.mark.parametrize("fn", ["dense", "chunked"])
@pytest.mark.parametrize("window", [-1, 1.5, True])
def test_mask_bad_window_raises(fn, window):
  with pytest.raises(ValueError, match=rf"window must be None or an int >= 0, got {re.escape(repr(window))}"):
    ATTENTION[fn](*_qkv32(), mask=attn.Mask(window=window))


@pytest.mark.parametrize("fn", sorted(ATTENTION))
@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_non_floating_inputs_raise(fn, name):
  args = dict(zip(("query", "key", "value"), _qkv32()))
  args[name] = args[name].astype(jnp.int32)
  with pytest.raises(TypeError, match=rf"{name} has dtype int32; allowed: a floating dtype"):
    ATTENTION[fn](*args.values())


@pytest.mark.parametrize("fn", sorted(ATTENTION))
def test_empty_axis_raises(fn):
  with pytest.raises(ValueError, match=r"key has shape \(2, 0, 2, 3\); every axis must be >= 1"):
    ATTENTION[fn](*_qkv32(nk=0))


@pytest.mark.parametrize("window", [-2, 1.5, True])
def test_window_mask_bad_window_raises(window):
  with pytest.raises(ValueError, match=r"window must be None or an int >= 0, got"):
    attn.window_mask(4, 4, window)


@pytest.mark.parametrize("key_rows,value_rows", [(4, 4), (3, 5)])
def test_reference_rejects_tables_that_give_no_clipping_distance(key_rows, value_rows):
  with pytest.raises(ValueError, match=r"the tables have \[.*\] rows; allowed: one odd count, 2k\+1"):
    reference.shaw_attention_reference(*_qkv32(), jnp.zeros((key_rows, D)), jnp.zeros((value_rows, D)))
