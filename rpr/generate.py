"""Translate with a :class:`rpr.model.Transformer`: its cached decoder as ``tokens_to_logits`` for :mod:`rpr.decode`."""

from __future__ import annotations

import jax

from rpr import decode
from rpr import model as model_lib

Array = jax.Array


def generate(params, config: model_lib.ModelConfig, inputs: Array, max_decode_len: int, *, beam_size: int = 4,
             alpha: float = 0.6, return_all: bool = False) -> tuple[Array, Array]:
  """Output ids for ``inputs [batch, L_in]``: greedy for ``beam_size == 1``, else beam search.

  ``config`` may be the training config: the decode variant is derived here.
  Jit with ``config``, ``max_decode_len``, ``beam_size``, ``alpha`` static.

  Returns:
    ``sequences [batch, max_decode_len]`` (EOS, then PAD) and ``scores [batch]``:
    log-probabilities for greedy, ``log P / lp`` for beam search (see
    :func:`rpr.decode.beam_search`, also for ``return_all``).
  """
  config = config.replace(decode=True, deterministic=True)
  model = model_lib.Transformer(config)
  batch = inputs.shape[0]
  encoded = model.apply({"params": params}, inputs, method="encode")
  cache = model_lib.init_cache(config, batch, max_decode_len)
  if beam_size > 1:
    # The decoder reads these per row, so each example's beams need a copy.
    encoded, inputs = decode.tile_beams((encoded, inputs), beam_size)

  def tokens_to_logits(ids, cache):
    logits, variables = model.apply({"params": params, "cache": cache}, encoded, inputs, ids, method="decode",
                                    mutable=["cache"])
    return logits[:, 0], variables["cache"]

  if beam_size == 1:
    return decode.greedy_search(tokens_to_logits, cache, batch, max_decode_len)
  return decode.beam_search(tokens_to_logits, cache, batch, max_decode_len, beam_size=beam_size, alpha=alpha,
                            return_all=return_all)
