"""Encoder and decoder blocks of the Transformer (Vaswani et al. 2017).

Each sub-layer (self-attention, cross-attention, feed-forward) is wrapped in a
residual connection with dropout and layer normalisation, either

* post-LN (Vaswani, Shaw): ``x = LayerNorm(x + Dropout(Sublayer(x)))``, or
* pre-LN: ``x = x + Dropout(Sublayer(LayerNorm(x)))`` (the stack then ends
  with a final LayerNorm, see :mod:`rpr.model`).

The blocks read every hyper-parameter from a :class:`rpr.model.ModelConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import jax

from rpr import layers
from rpr import positions

Array = jax.Array


def position_config(config, causal: bool) -> positions.PositionConfig:
  """The scheme config of one attention kind; ``ModelConfig.max_length`` sizes learned tables."""
  return dataclasses.replace(config.position_config, max_length=config.max_length, causal=causal)


class FeedForward(nn.Module):
  """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``: ``[batch, length, d_model] -> same``."""

  config: Any

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    h = nn.Dense(c.d_ff, dtype=c.dtype, name="inner")(x)
    return nn.Dense(c.d_model, dtype=c.dtype, name="outer")(nn.relu(h))


def residual(config, x: Array, sublayer: Callable[[Array], Array], norm: nn.Module) -> Array:
  """One sub-layer with its residual connection, dropout and LayerNorm (post or pre).

  Call from inside a compact method: the dropout module is created there.
  """
  drop = nn.Dropout(config.dropout_rate)
  if config.pre_layer_norm:
    return x + drop(sublayer(norm(x)), deterministic=config.deterministic)
  return norm(x + drop(sublayer(x), deterministic=config.deterministic))


def _norm(config, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(dtype=config.dtype, name=name)


def _attention(config, position: str, causal: bool, scheme: Optional[nn.Module], name: str,
               decode: bool = False) -> layers.MultiHeadAttention:
  c = config
  return layers.MultiHeadAttention(
      num_heads=c.num_heads, position=position, position_config=position_config(c, causal), scheme=scheme,
      causal=causal, dropout_rate=c.attention_dropout_rate, decode=decode, dtype=c.dtype,
      implementation=c.attention_implementation, name=name)


class EncoderBlock(nn.Module):
  """Self-attention + feed-forward on ``[batch, length, d_model]``.

  Attributes:
    config: the model config (``encoder_position`` picks the scheme).
    scheme: a scheme module shared by all layers of the stack (T5), or None
      for a scheme owned by this layer (Shaw's tables are unique per layer).
  """

  config: Any
  scheme: Optional[nn.Module] = None

  @nn.compact
  def __call__(self, x: Array, mask: Optional[Array]) -> Array:
    """``mask``: boolean, broadcastable to ``[batch, heads, length, length]``."""
    c = self.config
    attention = _attention(c, c.encoder_position, False, self.scheme, "self_attention")
    x = residual(c, x, lambda y: attention(y, mask=mask, deterministic=c.deterministic),
                 _norm(c, "self_attention_norm"))
    return residual(c, x, FeedForward(c, name="feed_forward"), _norm(c, "feed_forward_norm"))


class DecoderBlock(nn.Module):
  """Causal self-attention + encoder-decoder attention + feed-forward on ``[batch, length, d_model]``.

  Attributes:
    config: the model config (``decoder_position`` for self-attention,
      ``cross_position`` for encoder-decoder attention; ``decode`` caches the
      self-attention keys and values).
    self_scheme, cross_scheme: scheme modules shared across the stack, or None.
  """

  config: Any
  self_scheme: Optional[nn.Module] = None
  cross_scheme: Optional[nn.Module] = None

  @nn.compact
  def __call__(self, y: Array, encoded: Array, self_mask: Optional[Array], cross_mask: Optional[Array],
               q_offset=0) -> Array:
    """``y [batch, q, d_model]``, ``encoded [batch, k, d_model]``; ``q_offset`` is the position of ``y[:, 0]``.

    In decode mode the self-attention takes its query position from its cache;
    the encoder-decoder attention needs ``q_offset`` for relative schemes.
    """
    c = self.config
    self_attention = _attention(c, c.decoder_position, True, self.self_scheme, "self_attention", c.decode)
    cross_attention = _attention(c, c.cross_position, False, self.cross_scheme, "cross_attention")
    y = residual(c, y, lambda z: self_attention(z, mask=self_mask, deterministic=c.deterministic),
                 _norm(c, "self_attention_norm"))
    y = residual(c, y, lambda z: cross_attention(z, encoded, mask=cross_mask, deterministic=c.deterministic,
                                                 q_offset=q_offset),
                 _norm(c, "cross_attention_norm"))
    return residual(c, y, FeedForward(c, name="feed_forward"), _norm(c, "feed_forward_norm"))
