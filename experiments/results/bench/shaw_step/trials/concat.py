import jax, jax.numpy as jnp
from rpr.attention import dense as D, layer as LY
from rpr.attention import masks as masks_lib

def _heads_table(t, h):  # [R,d] | [h,R,d] -> [h,R,d]
  return jnp.broadcast_to(t, (h,) + t.shape[-2:]) if t.ndim == 2 else t

def _as_keys(t, b, h, dtype):  # table -> [b, R, h, d]
  t = jnp.swapaxes(_heads_table(t, h), 0, 1).astype(dtype)
  return jnp.broadcast_to(t[None], (b,) + t.shape)

def weighted_values(logits, value, mask, relative, rate, rng):
  weights = D.softmax(logits, mask, value.dtype)
  probs = D.dropout(weights, rate, rng)
  if relative is not None and relative.value_table is not None and relative.ids is None:
    b, _, h, _ = value.shape
    p2 = jnp.concatenate([probs, relative.reduce(probs)], axis=-1)
    v2 = jnp.concatenate([value, _as_keys(relative.value_table, b, h, value.dtype)], axis=1)
    return jnp.einsum("bhqk,bkhd->bqhd", p2, v2), weights
  return D.weighted_values(logits, value, mask, relative, rate, rng)

def dot_product_attention(query, key, value, *, mask=None, bias=None, relative=None, q_offset=0,
                          dropout_rate=0.0, dropout_rng=None, return_weights=False):
  D.check_qkv(query, key, value)
  b, q_len, h, d = query.shape
  k_len = key.shape[1]
  mask = D.as_mask(mask)
  masks_lib.check_offset(q_offset)
  mask.check(b, h, q_len, k_len)
  query = query / jnp.sqrt(jnp.asarray(d, query.dtype))
  if relative is not None:
    relative.check(h, d)
    relative = relative.within(q_len, k_len)
  if relative is not None and relative.key_table is not None and relative.ids is None:
    keys = jnp.concatenate([key, _as_keys(relative.key_table, b, h, key.dtype)], axis=1)
    full = jnp.einsum("bqhd,bkhd->bhqk", query, keys)
    logits = full[..., :k_len] + relative.expand(full[..., k_len:], k_len)
  else:
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
    if relative is not None and relative.key_table is not None:
      logits = logits + D.relative_logits(query, relative, k_len)
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  out, weights = weighted_values(logits, value, mask.dense(q_len, k_len, q_offset), relative, dropout_rate,
                                 dropout_rng)
  return (out, weights) if return_weights else out

ORIG = LY.dot_product_attention
def use(on):
  LY.dot_product_attention = dot_product_attention if on else ORIG
