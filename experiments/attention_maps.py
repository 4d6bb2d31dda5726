"""Encoder self-attention maps of a trained run, as in seed 002: every layer and head, for given inputs.

``encoder_attention(config, params, text)`` returns the attention weights that
:class:`rpr.attention.layer.MultiHeadAttention` sows in ``intermediates``,
``[layers, heads, q, k]`` over the characters of ``text`` (padding dropped).
``row_difference`` is the measured max abs difference between the attention
rows of two query positions: for "12+1" the tens-place "1" (index 0) and the
units-place "1" (index 3). Without position information the encoder is
permutation-equivariant, so two equal characters get equal states and
exactly equal rows in every layer and head; any position scheme makes them
differ.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from experiments import render
from rpr import config as config_lib
from rpr.data import arithmetic
from rpr.data.task import CharVocab
from rpr.model import Transformer


def encoder_attention(config, params, text: str) -> np.ndarray:
  """Encoder self-attention weights ``[layers, heads, len(text), len(text)]`` for one input."""
  vocab = CharVocab(arithmetic.VOCAB_CHARS)
  config = config_lib.parse(config)
  model = Transformer(config.model.replace(vocab_size=vocab.size, deterministic=True))
  length = arithmetic.config_by_name(config.data.arithmetic_config).max_input_length
  ids = np.zeros((1, max(length, len(text))), np.int32)  # right-padded with PAD (masked), as in training
  ids[0, :len(text)] = vocab.encode(text)
  _, state = model.apply({"params": params}, jnp.asarray(ids), method=Transformer.encode, mutable=["intermediates"])
  enc = state["intermediates"]["encoder"]
  layers = sorted((k for k in enc if k.startswith("layer_")), key=lambda k: int(k.split("_")[1]))
  weights = [np.asarray(enc[k]["self_attention"]["attention_weights"][0])[0] for k in layers]  # [h, q, k]
  return np.stack(weights)[:, :, :len(text), :len(text)]


def row_difference(weights: np.ndarray, i: int, j: int) -> float:
  """Max abs difference between query rows ``i`` and ``j`` over every layer and head of ``[l, h, q, k]``."""
  return float(np.max(np.abs(weights[:, :, i, :] - weights[:, :, j, :])))


def plot(maps: dict[str, np.ndarray], title: str, path: str) -> None:
  """One figure: a row per (input, layer), a column per head; query on y, key on x."""
  plt = render.pyplot()
  rows = [(text, layer) for text, w in maps.items() for layer in range(w.shape[0])]
  heads = next(iter(maps.values())).shape[1]
  fig, axes = plt.subplots(len(rows), heads, figsize=(2.1 * heads, 2.1 * len(rows)), squeeze=False)
  for r, (text, layer) in enumerate(rows):
    for h in range(heads):
      ax = axes[r, h]
      ax.imshow(maps[text][layer, h], vmin=0.0, vmax=1.0, cmap="viridis")
      ax.set_xticks(range(len(text)), list(text))
      ax.set_yticks(range(len(text)), list(text))
      ax.tick_params(length=0, labelsize=8)
      ax.set_title(f'"{text}" layer {layer} head {h}', fontsize=7)
  fig.suptitle(title, fontsize=9)
  render.save(fig, path, dpi=90)

