import os, sys, time, statistics, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, os.getcwd())
from rpr.attention.dense import dot_product_attention
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))); import layer_ab as mb
B, L, D, H = 8, 512, 512, 8
d = D // H
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32); g = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
W = {n: jnp.asarray(rng.normal(size=(D, H, d)) / np.sqrt(D), jnp.float32) for n in "qkvo"}
def sep(W, x):
  q, k, v = (jnp.einsum("bld,dhe->blhe", x, W[n]) for n in "qkv")
  o = dot_product_attention(q, k, v)
  return jnp.sum(jnp.einsum("blhe,dhe->bld", o, W["o"]) * g)
def fused(W, x):
  w = jnp.stack([W["q"], W["k"], W["v"]], axis=1)  # [D, 3, H, d]
  qkv = jnp.einsum("bld,dshe->blshe", x, w)
  o = dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
  return jnp.sum(jnp.einsum("blhe,dhe->bld", o, W["o"]) * g)
fns = {}
for n, f in (("sep", sep), ("fused", fused)):
  c = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(W, x).compile()
  fns[n] = (lambda c=c: jax.block_until_ready(c(W, x)))
a = jax.jit(jax.grad(sep))(W, x); b = jax.jit(jax.grad(fused))(W, x)
print("maxdiff", max(float(jnp.max(jnp.abs(a[k] - b[k]))) for k in a))
t = mb.bench(fns, rounds=7, min_s=0.5)
print({k: round(statistics.median(v) * 1e3, 1) for k, v in t.items()}, "fused/sep", statistics.median([p / q for p, q in zip(t["fused"], t["sep"])]))
