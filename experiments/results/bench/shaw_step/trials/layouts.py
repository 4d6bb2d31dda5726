import functools, os
import numpy as np
import jax, jax.numpy as jnp
from rpr.attention import dense as D, layer as LY, relative as R
from rpr.attention import masks as masks_lib

PERM_K = tuple(int(c) for c in os.environ.get("PERM_K", "1023"))  # bucket tensor axes as (b=0,h=1,q=2,r=3)
PERM_V = tuple(int(c) for c in os.environ.get("PERM_V", "1023"))
LETTERS = "bhqr"

def _gather_perm(x, perm, k_len, kk, offset):
  """out[b,h,q,j] = x_perm[..., bucket(q, j)] where x is the [b,h,q,R] tensor transposed by perm."""
  shp = [None] * 4
  for i, p in enumerate(perm):
    shp[p] = x.shape[i]
  b, h, q, r = shp
  out_shape = (b, h, q, k_len)
  strides = [0] * 4
  s = 1
  for i in reversed(range(4)):
    strides[perm[i]] = s
    s *= x.shape[i]
  cols = R.bucket_ids(q, k_len, kk, offset)
  idx = (jax.lax.broadcasted_iota(jnp.int32, out_shape, 0) * strides[0]
         + jax.lax.broadcasted_iota(jnp.int32, out_shape, 1) * strides[1]
         + jax.lax.broadcasted_iota(jnp.int32, out_shape, 2) * strides[2]
         + jnp.broadcast_to(cols, out_shape) * strides[3])
  dims = jax.lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
  return jax.lax.gather(x.reshape(-1), idx[..., None], dims, slice_sizes=(1,),
                        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)

@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def expand_perm(x, perm, k_len, kk, offset):
  return _gather_perm(x, perm, k_len, kk, offset)
def _ef(x, perm, k_len, kk, offset):
  return _gather_perm(x, perm, k_len, kk, offset), None
def _eb(perm, k_len, kk, offset, _, g):
  return (jnp.transpose(R.bucket_reduce(g, kk, offset), perm),)
expand_perm.defvjp(_ef, _eb)

@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def reduce_perm(p, perm, kk, offset):
  return jnp.transpose(R.bucket_reduce(p, kk, offset), perm)
def _rf(p, perm, kk, offset):
  return reduce_perm(p, perm, kk, offset), p.shape[-1]
def _rb(perm, kk, offset, k_len, g):
  return (_gather_perm(g, perm, k_len, kk, offset),)
reduce_perm.defvjp(_rf, _rb)

def _spec(perm):
  return "".join(LETTERS[p] for p in perm)

def _heads(t, h):
  return jnp.broadcast_to(t, (h,) + t.shape[-2:]) if t.ndim == 2 else t

def weighted_values(logits, value, mask, relative, rate, rng):
  weights = D.softmax(logits, mask, value.dtype)
  probs = D.dropout(weights, rate, rng)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
  if relative is not None and relative.value_table is not None:
    h = value.shape[2]
    buckets = reduce_perm(probs, PERM_V, relative.max_distance, relative.offset)
    out = out + jnp.einsum(f"{_spec(PERM_V)},hrd->bqhd", buckets, _heads(relative.value_table, h).astype(out.dtype))
  return out, weights

def dot_product_attention(query, key, value, *, mask=None, bias=None, relative=None, q_offset=0,
                          dropout_rate=0.0, dropout_rng=None, return_weights=False):
  D.check_qkv(query, key, value)
  b, q_len, h, d = query.shape
  k_len = key.shape[1]
  mask = D.as_mask(mask)
  masks_lib.check_offset(q_offset)
  mask.check(b, h, q_len, k_len)
  query = query / jnp.sqrt(jnp.asarray(d, query.dtype))
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
  if relative is not None:
    relative.check(h, d)
    relative = relative.within(q_len, k_len)
    if relative.key_table is not None:
      qw = jnp.einsum(f"bqhd,hrd->{_spec(PERM_K)}", query, _heads(relative.key_table, h).astype(query.dtype))
      logits = logits + expand_perm(qw, PERM_K, k_len, relative.max_distance, relative.offset)
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  out, weights = weighted_values(logits, value, mask.dense(q_len, k_len, q_offset), relative, dropout_rate,
                                 dropout_rng)
  return (out, weights) if return_weights else out

ORIG = LY.dot_product_attention
def use(on):
  LY.dot_product_attention = dot_product_attention if on else ORIG
