"""Encoder and decoder blocks of the Transformer (Vaswani et al. 2017).

Each sub-layer (self-attention, cross-attention, feed-forward) is wrapped in a
residual connection with dropout and layer normalisation, either

* post-LN (Vaswani, Shaw): ``x = LayerNorm(x + Dropout(Sublayer(x)))``, or
* pre-LN: ``x = x + Dropout(Sublayer(LayerNorm(x)))`` (the stack then ends
  with a final LayerNorm, see :mod:`rpr.model`).

The blocks read every hyper-parameter from a :class:`rpr.model_config.ModelConfig`
(imported by the model, not here: blocks sit below it).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.linen as nn
import jax

from rpr.attention import MultiHeadAttention

Array = jax.Array


class FeedForward(nn.Module):
  """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``: ``[batch, length, d_model] -> same``."""

  config: Any

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    h = nn.Dense(c.d_ff, dtype=c.compute_dtype, name="inner")(x)
    return nn.Dense(c.d_model, dtype=c.compute_dtype, name="outer")(nn.relu(h))


def residual(config, x: Array, sublayer: Callable[[Array], Array], norm: nn.Module) -> Array:
  """One sub-layer with its residual connection, dropout and LayerNorm (post or pre).

  Call from inside a compact method: the dropout module is created there.
  """
  drop = nn.Dropout(config.dropout_rate)
  if config.pre_layer_norm:
    return x + drop(sublayer(norm(x)), deterministic=config.deterministic)
  return norm(x + drop(sublayer(x), deterministic=config.deterministic))


def _norm(config, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(dtype=config.compute_dtype, name=name)


def _attention(config, scheme: nn.Module, causal: bool, name: str, decode: bool = False) -> MultiHeadAttention:
  """The block's attention layer with the stack's ``scheme``: shared if the scheme says so, else its own copy."""
  c = config
  if not scheme.shared_across_layers:
    scheme = scheme.clone(parent=None)  # unbound: the layer adopts it as its own "position" submodule
  return MultiHeadAttention(
      num_heads=c.num_heads, position=scheme, max_length=c.max_length, causal=causal,
      dropout_rate=c.attention_dropout_rate, decode=decode, dtype=c.compute_dtype,
      implementation=c.attention_implementation, name=name)


class EncoderBlock(nn.Module):
  """Self-attention + feed-forward on ``[batch, length, d_model]``.

  Attributes:
    config: the model config.
    scheme: the stack's scheme module (:func:`rpr.attention.positions.make`):
      shared by all layers if its class says so (T5), else copied into each
      layer (Shaw's tables are unique per layer).
  """

  config: Any
  scheme: nn.Module

  @nn.compact
  def __call__(self, x: Array, key_valid: Optional[Array]) -> Array:
    """``key_valid [batch, length]``: False at padding."""
    c = self.config
    attention = _attention(c, self.scheme, False, "self_attention")
    x = residual(c, x, lambda y: attention(y, key_valid=key_valid, deterministic=c.deterministic),
                 _norm(c, "self_attention_norm"))
    return residual(c, x, FeedForward(c, name="feed_forward"), _norm(c, "feed_forward_norm"))


class DecoderBlock(nn.Module):
  """Causal self-attention (+ encoder-decoder attention) + feed-forward on ``[batch, length, d_model]``.

  Attributes:
    config: the model config (``decode`` caches the self-attention keys and values).
    self_scheme, cross_scheme: the stack's scheme modules of the self- and
      encoder-decoder attention (shared or copied, as in :class:`EncoderBlock`).
  """

  config: Any
  self_scheme: nn.Module
  cross_scheme: Optional[nn.Module] = None

  @nn.compact
  def __call__(self, y: Array, self_valid: Optional[Array], encoded: Optional[Array] = None,
               encoded_valid: Optional[Array] = None, q_offset=0) -> Array:
    """``y [batch, q, d_model]``, ``encoded [batch, k, d_model]``; ``q_offset`` is the position of ``y[:, 0]``.

    ``self_valid [batch, q]`` and ``encoded_valid [batch, k]`` are False at
    padding. Without ``encoded`` (a decoder-only model) there is no
    encoder-decoder attention. In decode mode the self-attention takes its
    query position from its cache; the encoder-decoder attention needs
    ``q_offset`` for relative schemes.
    """
    c = self.config
    self_attention = _attention(c, self.self_scheme, True, "self_attention", c.decode)
    y = residual(c, y, lambda z: self_attention(z, key_valid=self_valid, deterministic=c.deterministic),
                 _norm(c, "self_attention_norm"))
    if encoded is not None:
      cross_attention = _attention(c, self.cross_scheme, False, "cross_attention")
      y = residual(c, y, lambda z: cross_attention(z, encoded, key_valid=encoded_valid,
                                                   deterministic=c.deterministic, q_offset=q_offset),
                   _norm(c, "cross_attention_norm"))
    return residual(c, y, FeedForward(c, name="feed_forward"), _norm(c, "feed_forward_norm"))
