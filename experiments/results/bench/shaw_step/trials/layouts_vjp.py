import functools, os
import jax, jax.numpy as jnp
import layouts as V2
from rpr.attention import dense as D, layer as LY
from rpr.attention import masks as masks_lib

BAR = os.environ.get("BAR", "1") == "1"
def _mat(x, perm):
  x = jnp.transpose(x, perm)
  return jax.lax.optimization_barrier(x) if BAR else x

OUTB = os.environ.get("OUTB", "0") == "1"
def _to_bqhd(x):  # [h,b,q,d] -> [b,q,h,d]
  if OUTB:
    x = jax.lax.optimization_barrier(x)
  return jnp.transpose(x, (1, 2, 0, 3))
@jax.custom_vjp
def table_product(buckets, table):  # [h,b,q,r] x [h,r,d] -> [b,q,h,d]
  return _to_bqhd(jnp.einsum("hbqr,hrd->hbqd", buckets, table))
def _tpf(buckets, table):
  return table_product(buckets, table), (buckets, table)
def _tpb(res, g):
  buckets, table = res
  g_h = _mat(g, (2, 0, 1, 3))
  db = jnp.einsum("hbqd,hrd->hbqr", g_h, table)
  dw = jnp.einsum("hrbq,hbqd->hrd", _mat(buckets, (0, 3, 1, 2)), g_h)
  return db, dw
table_product.defvjp(_tpf, _tpb)

@jax.custom_vjp
def query_product(q, table):  # [b,q,h,d] x [h,r,d] -> [h,b,q,r]
  return jnp.einsum("bqhd,hrd->hbqr", q, table)
def _qpf(q, table):
  return query_product(q, table), (q, table)
def _qpb(res, g):
  q, table = res
  dq = _to_bqhd(jnp.einsum("hbqr,hrd->hbqd", g, table))
  dw = jnp.einsum("hrbq,hbqd->hrd", _mat(g, (0, 3, 1, 2)), _mat(q, (2, 0, 1, 3)))
  return dq, dw
query_product.defvjp(_qpf, _qpb)

def _heads(t, h, dtype):
  return (jnp.broadcast_to(t, (h,) + t.shape[-2:]) if t.ndim == 2 else t).astype(dtype)

def weighted_values(logits, value, mask, relative, rate, rng):
  weights = D.softmax(logits, mask, value.dtype)
  probs = D.dropout(weights, rate, rng)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
  if relative is not None and relative.value_table is not None:
    buckets = V2.reduce_perm(probs, (1, 0, 2, 3), relative.max_distance, relative.offset)
    out = out + table_product(buckets, _heads(relative.value_table, value.shape[2], out.dtype))
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
      qw = query_product(query, _heads(relative.key_table, h, query.dtype))
      logits = logits + V2.expand_perm(qw, (1, 0, 2, 3), k_len, relative.max_distance, relative.offset)
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  out, weights = weighted_values(logits, value, mask.dense(q_len, k_len, q_offset), relative, dropout_rate,
                                 dropout_rng)
  return (out, weights) if return_weights else out

ORIG = LY.dot_product_attention
def use(on):
  LY.dot_product_attention = dot_product_attention if on else ORIG
