"""Encoder self-attention maps of a trained run, as in seed 002: every layer and head, for given inputs.

``encoder_attention(config, workdir, text)`` restores the run's final
parameters and returns the attention weights that
:class:`rpr.layers.MultiHeadAttention` sows in ``intermediates``,
``[layers, heads, q, k]`` over the characters of ``text`` (padding dropped).
``row_difference`` is the measured max abs difference between the attention
rows of two query positions: for "12+1" the tens-place "1" (index 0) and the
units-place "1" (index 3). Without position information the encoder is
permutation-equivariant, so two equal characters get equal states and
exactly equal rows in every layer and head; any position scheme makes them
differ.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from rpr import run_config
from rpr.data import arithmetic
from rpr.data.task import CharVocab
from rpr.model import Transformer


def load_params(workdir: str):
  """The parameters of the newest checkpoint in ``workdir/checkpoints``."""
  import orbax.checkpoint as ocp

  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  steps = [int(s) for s in os.listdir(directory) if s.isdigit()]
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  tree = ocp.StandardCheckpointer().restore(os.path.join(directory, str(max(steps)), "default"))
  return tree["params"]


def require_run_workdirs(workdirs) -> None:
  """A usage error naming the first of ``workdirs`` without ``config.json`` and ``checkpoints/``."""
  from absl import app

  if not workdirs:
    raise app.UsageError("name one or more workdirs, each holding config.json and checkpoints/")
  for w in workdirs:
    if not (os.path.isfile(os.path.join(w, "config.json")) and os.path.isdir(os.path.join(w, "checkpoints"))):
      raise app.UsageError(f"{w!r} is not a run's workdir: it needs config.json and checkpoints/ (the committed "
                           "results keep no checkpoints: train the run again to have them)")


def write_and_print(text: str, out_file) -> None:
  """Prints ``text``, and writes it to ``out_file`` too unless that is None."""
  if out_file:
    with open(out_file, "w", encoding="utf-8") as f:
      f.write(text)
  print(text)


def encoder_attention(config, params, text: str) -> np.ndarray:
  """Encoder self-attention weights ``[layers, heads, len(text), len(text)]`` for one input."""
  vocab = CharVocab(arithmetic.VOCAB_CHARS)
  model = Transformer(run_config.model_config(config, vocab.size).replace(deterministic=True))
  length = arithmetic.config_by_name(config.arithmetic_config).max_input_length
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
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

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
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)

