"""Peak memory of a whole training step against sequence length: dense vs chunked attention.

For each position scheme, attention implementation (``dense``, ``chunked``)
and length L, one training step (:func:`rpr.train.train_step`, Adam) of the
encoder-decoder Transformer on ``batch`` rows of L source and L target tokens
is jitted, lowered and compiled, but never run: the state and batch are
``jax.ShapeDtypeStruct`` s from ``jax.eval_shape``, so nothing of size L is
allocated (:func:`measure`). The number is
:func:`experiments.machine.peak_bytes`. Every compiled step's optimised HLO is
searched for arrays with two axes of length L, i.e. O(q k) tensors
(:mod:`experiments.bench.hlo`).

The target: with chunked attention the model holds no O(q k) tensor, so its
step's peak grows about linearly, ``peak(2L) / peak(L) <= 2.3``
(:func:`check_targets`); dense attention holds ``[batch, heads, L, L]``
weights per layer and grows about 4x.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import engine
from experiments import machine
from experiments.bench import hlo
from experiments.settings import knob

IMPLEMENTATIONS = ("dense", "chunked")
TARGET_RATIO = 2.3  # chunked peak(2L) / peak(L)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The benchmark's knobs (``python -m experiments bench memory``'s flags)."""
  lengths: tuple[int, ...] = knob((4096, 8192), "source = target lengths")
  positions: tuple[str, ...] = knob(("shaw",), "position schemes, e.g. shaw,t5,none")
  implementations: tuple[str, ...] = knob(IMPLEMENTATIONS, "attention implementations (dense, chunked)")
  batch: int = knob(1, "rows per step")
  d_model: int = knob(64, "model width")
  num_heads: int = knob(4, "attention heads")
  encoder_layers: int = knob(1, "encoder depth; 0: the decoder-only language model")
  decoder_layers: int = knob(1, "decoder depth")
  d_ff: int = knob(128, "feed-forward width")
  vocab_size: int = knob(1000, "vocabulary size")
  max_distance: int = knob(16, "Shaw's clipping distance k")
  dropout_rate: float = knob(0.1, "dropout rate")
  label_smoothing: float = knob(0.1, "label smoothing of the loss")
  skip_dense_above: int = knob(0, "do not compile dense steps longer than this (0: compile all)")
  fast_compile: bool = knob(False, "compile with xla_backend_optimization_level 0 (about half the compile time, "
                            "same estimate)")
  top_arrays: int = knob(6, "largest HLO arrays recorded per chunked step")

  def __post_init__(self):
    unknown = set(self.implementations) - set(IMPLEMENTATIONS)
    if unknown:
      raise ValueError(f"--implementations: {sorted(unknown)} not in {IMPLEMENTATIONS}")


def key(position: str, implementation: str, length: int) -> str:
  return f"{position}/{implementation}/{length}"


def model_config(s: Settings, position: str, implementation: str, length: int):
  """The ``rpr.model.ModelConfig`` of one measurement."""
  options = {"max_distance": s.max_distance} if position == "shaw" else {}
  return engine.model_config(
      vocab_size=s.vocab_size, d_model=s.d_model, num_heads=s.num_heads, d_ff=s.d_ff,
      num_encoder_layers=s.encoder_layers, num_decoder_layers=s.decoder_layers,
      dropout_rate=s.dropout_rate, position=position, position_options=options,
      max_length=max(length, 1), attention_implementation=implementation)


def chunk_block() -> int:
  """The chunked layers' block size: ``chunked_attention``'s default ``block_q`` (the model passes none)."""
  import inspect

  from rpr.attention.chunked import chunked_attention

  params = inspect.signature(chunked_attention).parameters
  return max(params["block_q"].default, params["block_k"].default)


def measure(s: Settings, position: str, implementation: str, length: int, top: int = 0) -> dict:
  """Compiles (without running) one training step at ``length``; its memory estimate and O(q k) arrays."""
  import optax

  config = model_config(s, position, implementation, length)
  model = engine.build(config)  # encoder_layers 0: the decoder-only language model, no inputs
  tx = optax.adam(1e-3)
  source = length if config.num_encoder_layers else 0
  state = jax.eval_shape(lambda rng: engine.init_state(rng, model, tx, source, length),
                         jax.ShapeDtypeStruct((2,), jnp.uint32))
  batch = {"inputs": jax.ShapeDtypeStruct((s.batch, source), jnp.int32),
           "targets": jax.ShapeDtypeStruct((s.batch, length), jnp.int32)}

  def step(state, batch):
    return engine.train_step(state, batch, model=model, tx=tx, schedule=lambda i: 1e-3,
                                label_smoothing=s.label_smoothing)

  t0 = time.perf_counter()
  lowered = jax.jit(step, donate_argnums=0).lower(state, batch)  # donated as in rpr.train
  # LLVM's optimisation level only changes the machine code; the HLO passes and the buffer assignment
  # behind memory_analysis() are the same, so the estimate does not depend on --fast_compile.
  compiled = lowered.compile({"xla_backend_optimization_level": 0} if s.fast_compile else None)
  entry = {"position": position, "implementation": implementation, "length": length, "batch": s.batch,
           "compile_s": round(time.perf_counter() - t0, 2), "memory": machine.peak_bytes(compiled),
           "params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(state.params)))}
  arrays = hlo.hlo_arrays(compiled.as_text())
  # An O(q k) tensor has two axes of length L (L + the chunk padding at most): [b, h, q, k] and its relatives.
  # (A vocabulary or d_ff of the same size as L would be miscounted; the defaults keep clear of that.)
  block = chunk_block()
  quadratic = [a for a in arrays if sum(length <= d < length + block for d in a["dims"]) >= 2]
  entry["quadratic_arrays"] = {"count": len(quadratic), "largest": quadratic[:3]}
  if top:
    entry["largest_arrays"] = arrays[:top]
  return entry


def add_ratios(data: dict) -> None:
  """Growth ``peak(2L) / peak(L)`` per scheme and implementation, and ``chunked / dense`` per length."""
  res = data["results"]
  growth, versus = [], []
  for position in data["positions"]:
    for impl in IMPLEMENTATIONS:
      for n in data["lengths"]:
        a, b = res.get(key(position, impl, n)), res.get(key(position, impl, 2 * n))
        if a and b and "memory" in a and "memory" in b:
          growth.append({"position": position, "implementation": impl, "from": n, "to": 2 * n,
                         "ratio": b["memory"]["peak"] / a["memory"]["peak"]})
    for n in data["lengths"]:
      c, d = res.get(key(position, "chunked", n)), res.get(key(position, "dense", n))
      if c and d and "memory" in c and "memory" in d:
        versus.append({"position": position, "length": n, "ratio": c["memory"]["peak"] / d["memory"]["peak"]})
  data["growth"], data["chunked_vs_dense"] = growth, versus


def check_targets(data: dict) -> list[dict]:
  """The target on every measured doubling of the chunked model: ``peak(2L) / peak(L) <= 2.3``.

  Doublings from L below the chunk block are listed but not judged: there a
  block is the whole L x L square, so the chunked path is quadratic by design.
  """
  block = data.get("chunk_block", 0)
  out = []
  for g in data["growth"]:
    if g["implementation"] == "chunked":
      judged = g["from"] >= block
      out.append({**g, "target": TARGET_RATIO, "judged": judged, "pass": g["ratio"] <= TARGET_RATIO})
  return out


def verdict(targets: list[dict]) -> str:
  """PASS, FAIL, or NOT EVALUATED when no judged doubling was measured."""
  judged = [t for t in targets if t.get("judged", True)]
  if not judged:
    return "NOT EVALUATED (no chunked length pair L, 2L with L >= the chunk block measured)"
  return "PASS" if all(t["pass"] for t in judged) else "FAIL"
