"""Per-op profile of one attention layer (layer_ab.SHAPES): jax.profiler trace of N calls, op times summed by name.

    taskset -c 0 .venv/bin/python experiments/results/bench/shaw_step/layer_profile.py t16x64 shaw 300
"""
import sys, os, glob, gzip, json, collections
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.getcwd())
import jax
import layer_ab as mb
pass
import profile_step as ps
shape, pos, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
variant = sys.argv[4] if len(sys.argv) > 4 else ""
if variant:
  import importlib; importlib.import_module(variant).use(True)
import numpy as np, jax.numpy as jnp
from rpr.attention.layer import MultiHeadAttention
b, L, impl, causal, D, H = (mb.SHAPES[shape] + (128, 4))[:6]
layer = MultiHeadAttention(num_heads=H, position=pos, implementation=impl, causal=causal,
                           position_options={"max_distance": 16} if pos == "shaw" else None)
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(b, L, D)), jnp.float32); g = jnp.asarray(rng.normal(size=(b, L, D)), jnp.float32)
params = layer.init(jax.random.PRNGKey(0), x)
f = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(layer.apply(p, x) * g), argnums=(0, 1)))
c = f.lower(params, x).compile()
text = c.as_text(); open(f"/tmp/mb_{shape}_{pos}.hlo", "w").write(text)
ops = ps.hlo_ops(text)
for _ in range(20): jax.block_until_ready(c(params, x))
out = f"/tmp/mbp_{shape}_{pos}"
os.system(f"rm -rf {out}")
with jax.profiler.trace(out):
  for _ in range(n): jax.block_until_ready(c(params, x))
path = sorted(glob.glob(os.path.join(out, "**", "*.trace.json.gz"), recursive=True))[-1]
tot = collections.Counter()
for e in json.load(gzip.open(path))["traceEvents"]:
  if e.get("ph") == "X" and "hlo_op" in e.get("args", {}):
    tot[e["name"]] += e["dur"] / 1000
print(f"{shape} {pos} {variant}: sum {sum(tot.values())/n:.3f} ms/call")
for name, ms in tot.most_common(40):
  shp, op, src, _ = ops.get(name, ["?", "?", set(), None])
  print(f"  {ms/n:6.3f} {name:30s} {shp:20s} {op.replace('jit(<lambda>)/','')[-60:]:60s} {sorted(src)[:3]}")
