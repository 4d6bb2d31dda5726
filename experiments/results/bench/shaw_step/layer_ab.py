"""Micro A/B: one attention layer (d_model 128, 4 heads, k 16) fwd + bwd, Shaw vs none, at the configs' batch shapes; CPU time per call, interleaved.

    ROOT=<checkout> taskset -c 0 .venv/bin/python experiments/results/bench/shaw_step/layer_ab.py t16x64,t32x32,t10x96,t16x64c
"""
import os, sys, time, statistics, importlib
import numpy as np
import jax, jax.numpy as jnp
sys.path.insert(0, os.environ.get("ROOT", os.getcwd()))
from rpr.attention.layer import MultiHeadAttention

SHAPES = {"t16x64": (16, 64, "dense", False), "t32x32": (32, 32, "dense", False), "t21x48": (21, 48, "dense", False),
          "t10x96": (10, 96, "dense", False), "t16x64c": (16, 64, "dense", True), "lm8x256": (8, 256, "chunked", True),
          "a512": (8, 512, "dense", False, 512, 8), "a512c": (8, 512, "chunked", False, 512, 8)}

def make(shape, pos, impl_override=None):
  b, L, impl, causal, D, H = (SHAPES[shape] + (128, 4))[:6]
  impl = impl_override or impl
  layer = MultiHeadAttention(num_heads=H, position=pos, implementation=impl, causal=causal,
                             position_options={"max_distance": 16} if pos == "shaw" else None)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(b, L, D)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(b, L, D)), jnp.float32)
  params = layer.init(jax.random.PRNGKey(0), x)
  def loss(p, x):
    return jnp.sum(layer.apply(p, x) * g)
  f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  c = f.lower(params, x).compile()
  return lambda: jax.block_until_ready(c(params, x))

def bench(fns, rounds=15, min_s=0.15):
  inner = {}
  for k, f in fns.items():
    f(); t = time.perf_counter(); f(); once = time.perf_counter() - t
    inner[k] = max(1, int(min_s / once))
  times = {k: [] for k in fns}
  rng = np.random.default_rng(0)
  for _ in range(rounds):
    for k in rng.permutation(list(fns)):
      c0 = time.process_time()
      for _ in range(inner[k]):
        fns[k]()
      times[k].append((time.process_time() - c0) / inner[k])
  return times

if __name__ == "__main__":
  shapes = sys.argv[1].split(",")
  for s in shapes:
    fns = {"none": make(s, "none"), "shaw": make(s, "shaw")}
    t = bench(fns)
    r = [a / b for a, b in zip(t["shaw"], t["none"])]
    print(f"{s}: none {statistics.median(t['none'])*1e3:.2f} ms, shaw {statistics.median(t['shaw'])*1e3:.2f} ms, "
          f"ratio median {statistics.median(r):.3f} q {np.percentile(r,25):.3f}-{np.percentile(r,75):.3f}", flush=True)
