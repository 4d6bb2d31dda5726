import sys, os, statistics, functools, numpy as np, jax
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))); sys.path.insert(0, os.getcwd())
import layer_ab as mb
from rpr.attention import layer as LY, chunked as CH
orig = LY.chunked_attention
def with_blocks(bq, bk):
  LY.chunked_attention = functools.partial(orig, block_q=bq, block_k=bk)
fns = {}
for name, pos, blk in [("none128", "none", 128), ("shaw128", "shaw", 128), ("shaw64", "shaw", 64), ("shaw32", "shaw", 32)]:
  with_blocks(blk, blk); fns[name] = mb.make("lm8x256", pos)
LY.chunked_attention = orig
t = mb.bench(fns, rounds=9)
for k in fns:
  print(k, round(statistics.median(t[k]) * 1e3, 2), "vs none128", round(statistics.median([a / b for a, b in zip(t[k], t["none128"])]), 3))
