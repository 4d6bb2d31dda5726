"""Decoding with a trained model (:func:`rpr.model.build`): glue between the model's decode cache and :mod:`rpr.decode`.

``predict(params, inputs, ...)`` encodes ``inputs [batch, L_in]`` once,
then runs greedy or beam search one decoder token per step against the
``cache`` collection and returns ``[batch, max_decode_len]`` ids laid out like
``targets`` (tokens up to and including EOS, then PAD).
"""

from __future__ import annotations

import jax

from rpr import decode
from rpr.model import build, init_cache
from rpr.model_config import ModelConfig

Array = jax.Array


def predict(params, inputs: Array, max_decode_len: int, *, model_config: ModelConfig, method: str = "greedy",
            beam_size: int = 4, alpha: float = 0.6) -> Array:
  """Decoded ids ``[batch, max_decode_len]`` for ``inputs [batch, L_in]`` (``method``: greedy or beam)."""
  model = build(model_config.replace(decode=True, deterministic=True))
  encoded = model.apply({"params": params}, inputs, method=type(model).encode)
  batch_size = inputs.shape[0]
  cache = init_cache(model_config, batch_size, max_decode_len, inputs.shape[1])
  if method == "beam":
    encoded, inputs = decode.tile_beams((encoded, inputs), beam_size)

  def tokens_to_logits(ids, cache):
    logits, variables = model.apply({"params": params, "cache": cache}, encoded, inputs, ids,
                                    method=type(model).decode, mutable=["cache"])
    return logits[:, -1], variables["cache"]

  if method == "greedy":
    sequences, _ = decode.greedy_search(tokens_to_logits, cache, batch_size, max_decode_len)
  elif method == "beam":
    sequences, _ = decode.beam_search(tokens_to_logits, cache, batch_size, max_decode_len, beam_size=beam_size,
                                      alpha=alpha)
  else:
    raise ValueError(f"unknown decode method {method!r}; allowed: ['greedy', 'beam']")
  return sequences
