"""A run's memory, estimated from its config before any work, and held to the machine's (issue 71).

Each size of the config has its own bound (:mod:`rpr.config`, :mod:`rpr.fields`), but values within their
bounds can still make a run that no machine holds: a width of 65,536 with 256 layers, or a million rows of a
thousand tokens. :func:`check` refuses such a run in one line before the workdir is made or JAX allocates
anything, naming the estimate and what to lower; ``run.py --skip_memory_check`` goes on regardless.

The estimate is a lower bound, so that it never refuses a run that fits:

- parameters: the embeddings, each block's attention (4 d^2, twice in a decoder block with cross-attention)
  and feed-forward (2 d d_ff) weights, and a relative scheme's tables ((2k + 1) rows of head_dim per head, for
  keys and values); held 4 times in float32 for training (the parameters, their gradients, Adam's two moments);
- activations of one training step: per token and layer, ``4 d + d_ff`` values kept for the backward pass, and
  with dense attention one score per query, key and head; in the model's dtype.

Biases, layer norms, the optimiser's temporaries, XLA's buffers and the copies of data parallelism come on
top. The machine's memory is the host's physical memory (``os.sysconf``): on accelerators, where a device may
hold less, this only catches what no host could hold either.
"""

from __future__ import annotations

import os
from typing import Optional

GIB = 1 << 30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TRAINING_COPIES = 4  # parameters, gradients and Adam's two moments, in float32


def machine_bytes() -> Optional[int]:
  """The host's physical memory, or None where the system does not say."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def parameters(model, vocab_size: int) -> int:
  """A lower bound of the parameter count of ``model`` (a :class:`rpr.model_config.ModelConfig`) over ``vocab_size``."""
  d, f = model.d_model, model.d_ff
  attention, feed_forward = 4 * d * d, 2 * d * f
  tables = _tables(model.position_options, model.num_heads, model.head_dim)
  cross = _tables(model.cross_position_options, model.num_heads, model.head_dim)
  embeddings = vocab_size * d * (1 if model.share_embeddings else 2)
  encoder = model.num_encoder_layers * (attention + feed_forward + tables)
  decoder = model.num_decoder_layers * (attention + feed_forward + tables
                                        + (attention + cross if model.num_encoder_layers else 0))
  return embeddings + encoder + decoder


def _tables(options, heads: int, head_dim: int) -> int:
  """The parameters of a scheme's per-layer tables, as its options count them (Shaw's); 0 for the others."""
  count = getattr(options, "table_parameters", None)
  return count(heads, head_dim) if count else 0


def activations(config) -> int:
  """A lower bound of the bytes one training step of ``config`` (a :class:`rpr.config.RunConfig`) keeps for its
  backward pass; 0 where the config does not say its sequence length."""
  m, d = config.model, config.data
  length = d.get("lm_context_length") or d.get("max_length")
  if not isinstance(length, int):
    return 0
  length = min(length + 1, m.max_length)  # + BOS or EOS
  tokens = d.get("tokens_per_batch") or d.get("tokens_per_device") or (d.batch_size or 0) * length
  rows = max(tokens // length, 1)
  layers = m.num_encoder_layers + m.num_decoder_layers  # each over one side's tokens
  per_token = 4 * m.d_model + m.d_ff
  scores = rows * m.num_heads * length * length if m.attention_implementation == "dense" else 0
  return BYTES.get(m.dtype, 4) * layers * (tokens * per_token + scores)


def vocabulary(config) -> int:
  """The vocabulary size the config names (0 where the data set picks its own, small for the synthetic ones)."""
  return config.data.get("vocab_size") or config.model.vocab_size or 0


def check(config, available: Optional[int] = None) -> None:
  """Raises :class:`rpr.config.ConfigError` if the estimate for ``config`` exceeds ``available`` bytes (default:
  the machine's memory)."""
  from rpr.config import ConfigError

  available = machine_bytes() if available is None else available
  n = parameters(config.model, vocabulary(config))
  weights, steps = n * 4 * TRAINING_COPIES, activations(config)
  if available is None or weights + steps <= available:
    return
  raise ConfigError(
      f"the run needs at least {(weights + steps) / GIB:,.1f} GiB of memory ({n:,} parameters: "
      f"{weights / GIB:,.1f} GiB with their gradients and Adam's moments; one training step's activations: "
      f"{steps / GIB:,.1f} GiB), more than this machine's {available / GIB:,.1f} GiB; allowed: a smaller "
      "model (d_model, d_ff, layers, the clipping distance) or batch (batch_size, tokens_per_batch, the "
      "sequence length), or --skip_memory_check if the estimate is wrong here (rpr/memory.py)")
