import sys, os, statistics, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))); sys.path.insert(0, os.getcwd())
import layer_ab as mb, importlib; v = importlib.import_module(os.environ.get("VAR", "layouts"))
# correctness vs original
for s in sys.argv[1].split(","):
  b, L, impl, causal, D, H = (mb.SHAPES[s] + (128, 4))[:6]
  from rpr.attention.layer import MultiHeadAttention
  layer = MultiHeadAttention(num_heads=H, position="shaw", implementation=impl, causal=causal, position_options={"max_distance": 16})
  x = jnp.asarray(np.random.default_rng(1).normal(size=(b, L, D)), jnp.float32)
  p = layer.init(jax.random.PRNGKey(0), x)
  f = lambda p, x: jnp.sum(jnp.sin(layer.apply(p, x)))
  g0 = jax.grad(f, argnums=(0, 1))(p, x)
  v.use(True); g1 = jax.grad(f, argnums=(0, 1))(p, x); v.use(False)
  err = max(float(jnp.max(jnp.abs(a - c)) / (jnp.max(jnp.abs(a)) + 1e-30)) for a, c in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)))
  fns = {"none": mb.make(s, "none"), "shaw": mb.make(s, "shaw")}
  v.use(True); fns["shaw_v"] = mb.make(s, "shaw"); v.use(False)
  t = mb.bench(fns)
  med = {k: statistics.median(x) * 1e3 for k, x in t.items()}
  r = lambda a, b: statistics.median([x / y for x, y in zip(t[a], t[b])])
  print(f"{s} {os.environ.get('VAR')} {os.environ.get('BAR')} relerr {err:.1e}: " + ", ".join(f"{k} {x:.2f}" for k, x in med.items()) +
        f" | shaw/none {r('shaw','none'):.3f} shaw_v/none {r('shaw_v','none'):.3f} shaw_v/shaw {r('shaw_v','shaw'):.3f}", flush=True)
