import os, sys, time, statistics, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, os.getcwd())
from rpr.attention import relative as rel

def skew_expand(x, k_len, kk, offset=0):
  # x [..., q, R=2kk+1] -> [..., q, k_len]: out[i, j] = x[i, clip(j - i - offset, kk) + kk]
  q = x.shape[-2]
  w = q + k_len - 1  # y[i, m]: m = j - i + (q - 1), distance d = m - (q - 1) - offset
  cols = np.clip(np.arange(w) - (q - 1) - offset, -kk, kk) + kk
  # y as a concat of the edge columns and the interior
  lo = int(np.searchsorted(cols, 1)) ; hi = int(np.searchsorted(cols, 2 * kk))  # cols[lo:hi] interior 1..2kk-1
  parts = []
  if lo > 0: parts.append(jnp.broadcast_to(x[..., :1], x.shape[:-1] + (lo,)))
  parts.append(x[..., cols[lo]:cols[hi - 1] + 1] if hi > lo else x[..., :0])
  if w - hi > 0: parts.append(jnp.broadcast_to(x[..., -1:], x.shape[:-1] + (w - hi,)))
  y = jnp.concatenate(parts, -1)
  assert y.shape[-1] == w
  flat = y.reshape(x.shape[:-2] + (q * w,))
  flat = flat[..., q - 1: q - 1 + q * (w - 1)]
  return flat.reshape(x.shape[:-2] + (q, w - 1))[..., :k_len]

def onehot_expand(x, k_len, kk, offset=0):
  q = x.shape[-2]
  ids = np.clip(np.arange(k_len)[None] - np.arange(q)[:, None] - offset, -kk, kk) + kk
  oh = jnp.asarray(np.eye(2 * kk + 1, dtype=np.float32)[ids])  # [q, k, R]
  return jnp.einsum("...qr,qkr->...qk", x, oh)

def where_expand(x, k_len, kk, offset=0):
  q = x.shape[-2]
  ids = jnp.asarray(np.clip(np.arange(k_len)[None] - np.arange(q)[:, None] - offset, -kk, kk) + kk)
  return jnp.take_along_axis(x, jnp.broadcast_to(ids, x.shape[:-1] + (k_len,)), -1)

def time_fn(f, *a, n=200):
  c = jax.jit(f).lower(*a).compile()
  for _ in range(5): jax.block_until_ready(c(*a))
  ts = []
  for _ in range(7):
    t = time.process_time()
    for _ in range(n): jax.block_until_ready(c(*a))
    ts.append((time.process_time() - t) / n)
  return statistics.median(ts) * 1e3

for (b, h, q, kk) in [(16, 4, 64, 16), (32, 4, 32, 16), (10, 4, 96, 16), (8, 4, 128, 16)]:
  x = jnp.asarray(np.random.default_rng(0).normal(size=(b, h, q, 2 * kk + 1)), jnp.float32)
  ref = rel.bucket_expand(x, q, kk, 0)
  for name, f in [("gather", lambda x: rel.bucket_expand(x, q, kk, 0)), ("skew", lambda x: skew_expand(x, q, kk)),
                  ("onehot", lambda x: onehot_expand(x, q, kk)), ("take", lambda x: where_expand(x, q, kk))]:
    err = float(jnp.max(jnp.abs(jax.jit(f)(x) - ref)))
    print(f"b{b} q{q}: {name:7s} {time_fn(f, x):.3f} ms  err {err:.1e}", flush=True)

print("reduce")
for (b, h, q, kk) in [(16, 4, 64, 16), (8, 4, 128, 16)]:
  p = jnp.asarray(np.random.default_rng(0).normal(size=(b, h, q, q)), jnp.float32)
  ids = np.clip(np.arange(q)[None] - np.arange(q)[:, None], -kk, kk) + kk
  oh = jnp.asarray(np.eye(2 * kk + 1, dtype=np.float32)[ids])
  for name, f in [("bucket_reduce", lambda p: rel.bucket_reduce(p, kk, 0)), ("rowsum", lambda p: p.sum(-1)),
                  ("onehot", lambda p: jnp.einsum("bhqk,qkr->bhqr", p, oh)),
                  ("exp+sum", lambda p: jnp.exp(p).sum(-1))]:
    print(f"b{b} q{q}: {name:14s} {time_fn(f, p):.3f} ms", flush=True)
