"""Issue 69's attention-layer figure: one self-attention layer with q/k/v/out projections, forward + backward,
B = 8, d_model 512, 8 heads, L = 512, float32, as a share of the machine's matmul peak measured in the same process.

    GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647 \
    PYTHONPATH=. .venv/bin/python experiments/results/bench/attention_layer/bench_layer.py --rounds 7 \
        --out experiments/results/bench/attention_layer

Each configuration is ``jax.value_and_grad`` of ``sum(layer(x) * g)`` with respect to the parameters and ``x``,
jitted; they are timed in interleaved rounds (a fresh random order each round), each sample at least 0.5 s, and
the peak (``jnp.dot`` of two [n, n] float32 matrices, the best of 10) is taken before and after, in the same
process, with the same threads. Model FLOPs are counted: 4 projections (2 B L D^2 each) and the two attention
matmuls (2 B h L^2 d each), times 3 for forward + backward (Shaw's table products not counted: the share is of
the work plain attention needs).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.getcwd())
from rpr.attention.layer import MultiHeadAttention  # noqa: E402

B, L, D, H = 8, 512, 512, 8


def model_flops() -> float:
  d = D // H
  return 3 * (4 * 2 * B * L * D * D + 2 * 2 * B * H * L * L * d)


def peak(n=4096, repeats=10) -> float:
  x = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
  dot = jax.jit(lambda a, b: a @ b)
  dot(x, x).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    dot(x, x).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best


def make(position, implementation, **layer_options):
  layer = MultiHeadAttention(num_heads=H, position=position, implementation=implementation,
                             position_options={"max_distance": 16} if position == "shaw" else None, **layer_options)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  params = layer.init(jax.random.PRNGKey(0), x)
  step = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(layer.apply(p, x) * g), argnums=(0, 1)))
  compiled = step.lower(params, x).compile()
  return compiled, (params, x), float(compiled.cost_analysis()["flops"])


CONFIGS = {"plain/dense": ("none", "dense"), "shaw/dense": ("shaw", "dense"),
           "plain/chunked": ("none", "chunked"), "shaw/chunked": ("shaw", "chunked")}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--configs", default=",".join(CONFIGS))
  ap.add_argument("--min_sample_s", type=float, default=0.5)
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  names = a.configs.split(",")
  built = {n: make(*CONFIGS[n]) for n in names}
  for n, (c, args, _) in built.items():
    jax.block_until_ready(c(*args))
  peaks = [peak()]
  times = {n: [] for n in names}
  order = np.random.default_rng(0)
  for _ in range(a.rounds):
    for n in order.permutation(names):
      c, args, _ = built[n]
      calls, t0 = 0, time.perf_counter()
      while True:
        jax.block_until_ready(c(*args))
        calls += 1
        if time.perf_counter() - t0 >= a.min_sample_s:
          break
      times[n].append((time.perf_counter() - t0) / calls)
  peaks.append(peak())
  pk = statistics.median(peaks)
  flops = model_flops()
  rows = []
  for n in names:
    med = statistics.median(times[n])
    share = [flops / t / p for t, p in ((min(times[n]), max(peaks)), (med, pk))]
    rows.append({"config": n, "ms_median": med * 1e3, "ms_all": [t * 1e3 for t in times[n]],
                 "xla_flops": built[n][2], "model_flops": flops, "gflops_per_s": flops / med / 1e9,
                 "share_of_peak_median": flops / med / pk, "share_of_peak_best": share[0]})
    print(f"{n:14s} {med * 1e3:7.1f} ms  {flops / med / 1e9:6.1f} GFLOP/s  {flops / med / pk:.2f} of peak "
          f"(XLA counts {built[n][2] / 1e9:.1f} GFLOP)", flush=True)
  print(f"peak {[round(p / 1e9, 1) for p in peaks]} GFLOP/s; model {flops / 1e9:.1f} GFLOP")
  if a.out:
    os.makedirs(a.out, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    data = {"command": " ".join(sys.argv), "date": datetime.datetime.utcnow().isoformat(timespec="seconds"),
            "commit": commit, "peaks": peaks, "rows": rows, "rounds": a.rounds, "jax": jax.__version__}
    with open(os.path.join(a.out, "results.json"), "w") as f:
      json.dump(data, f, indent=1)


if __name__ == "__main__":
  main()
