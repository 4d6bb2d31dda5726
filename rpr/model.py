"""Encoder-decoder Transformer, and its decoder-only language model, with a position scheme chosen by name.

The model is described by a frozen :class:`~rpr.model_config.ModelConfig` (its fields, checks and
presets live in :mod:`rpr.model_config`, whose names this module re-exports: a model and its config
are used together). :class:`Transformer` has ``encode``, ``decode`` and ``__call__``; :class:`LanguageModel`
(``num_encoder_layers = 0``) has the same three over an empty input, and
:func:`build` picks the one a config describes. Shaw et al.
(2018) replace self-attention with relation-aware self-attention in encoder
and decoder and keep the encoder-decoder attention plain (``cross_position``
``"none"``). In decode mode the decoder runs one token per call; its
self-attention keys and values and the current position live in the
``cache`` collection, initialised by ``model.init`` on a full-length dummy
target (see :func:`init_cache`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from rpr import blocks
from rpr.attention import positions
# Re-exported: rpr.model.ModelConfig, rpr.model.preset, ... are where callers have always found them.
from rpr.model_config import (DTYPES, MAX_LAYERS, MAX_LENGTH, MAX_VOCAB, MAX_WIDTH, PRESETS,  # noqa: F401
                              ModelConfig, cross_schemes, preset)
from rpr.tokens import BOS, PAD

Array = jax.Array


def shift_right(targets: Array, bos_id: int = BOS) -> Array:
  """``[b, L]`` targets -> decoder inputs ``[BOS, t_0, ..., t_{L-2}]`` (teacher forcing)."""
  return jnp.concatenate([jnp.full_like(targets[:, :1], bos_id), targets[:, :-1]], axis=1)


def _embedding(config: ModelConfig) -> nn.Embed:
  # Variance 1/d_model so that the sqrt(d_model)-scaled inputs have unit
  # variance and the tied output logits start small.
  return nn.Embed(config.vocab_size, config.d_model, embedding_init=nn.initializers.normal(config.d_model ** -0.5),
                  dtype=config.compute_dtype)


def _stack_scheme(config: ModelConfig, cross: bool, causal: bool) -> nn.Module:
  """The scheme module of one stack, built once for all its layers.

  Bound to the stack (as ``position`` or ``cross_position``) when the stack
  uses it itself (absolute encodings at the embeddings) or its layers share
  it (T5); else unbound, a template each layer copies.
  """
  name, options = ((config.cross_position, config.cross_position_options) if cross
                   else (config.position, config.position_options))
  bound = not cross or positions.get(name).shared_across_layers
  linen = {"name": "cross_position" if cross else "position"} if bound else {"parent": None}
  return positions.make(name, config.num_heads, config.head_dim, options=options, causal=causal,
                        max_length=config.max_length, **linen)


def _embed(config: ModelConfig, embedding: nn.Module, scheme: nn.Module, ids: Array, offset=0) -> Array:
  """``ids [b, L]`` -> ``[b, L, d]``: ``sqrt(d) E[ids]`` plus any absolute encoding, then dropout."""
  x = embedding(ids) * jnp.sqrt(jnp.asarray(config.d_model, config.compute_dtype))
  x = scheme.embed(x, offset)
  return nn.Dropout(config.dropout_rate)(x, deterministic=config.deterministic)


class Encoder(nn.Module):
  """``inputs [batch, L_in] int32 -> [batch, L_in, d_model]``."""

  config: ModelConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    c = self.config
    scheme = _stack_scheme(c, cross=False, causal=False)
    valid = inputs != PAD
    x = _embed(c, self.embedding, scheme, inputs)
    for i in range(c.num_encoder_layers):
      x = blocks.EncoderBlock(c, scheme=scheme, name=f"layer_{i}")(x, valid)
    if c.pre_layer_norm:
      x = nn.LayerNorm(dtype=c.compute_dtype, name="final_norm")(x)
    return x


class Decoder(nn.Module):
  """``(decoder_inputs [b, L_out], encoded [b, L_in, d] | None, inputs [b, L_in] | None) -> logits [b, L_out, vocab]``.

  Without ``encoded`` the blocks have no encoder-decoder attention (a decoder-only language model).
  """

  config: ModelConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, decoder_inputs: Array, encoded=None, inputs=None) -> Array:
    c = self.config
    offset = self._position(decoder_inputs.shape[1]) if c.decode else 0
    self_scheme = _stack_scheme(c, cross=False, causal=True)
    cross_scheme = _stack_scheme(c, cross=True, causal=False) if encoded is not None else None
    # Decode steps see the cache, whose unwritten keys the causal mask hides.
    self_valid = None if c.decode else decoder_inputs != PAD
    encoded_valid = None if inputs is None else inputs != PAD
    y = _embed(c, self.embedding, self_scheme, decoder_inputs, offset)
    for i in range(c.num_decoder_layers):
      y = blocks.DecoderBlock(c, self_scheme=self_scheme, cross_scheme=cross_scheme, name=f"layer_{i}")(
          y, self_valid, encoded, encoded_valid, offset)
    if c.pre_layer_norm:
      y = nn.LayerNorm(dtype=c.compute_dtype, name="final_norm")(y)
    if c.share_embeddings:
      logits = self.embedding.attend(y)
    else:
      logits = nn.Dense(c.vocab_size, dtype=c.compute_dtype, name="logits")(y)
    return logits.astype(jnp.float32)

  def _position(self, length: int):
    """Position of this call's first token: a counter in the ``cache`` collection.

    The init call (full-length dummy target) creates the counter at 0 and
    starts at 0; each decode step then reads it and advances it by one.
    """
    initialized = self.has_variable("cache", "decode_position")
    counter = self.variable("cache", "decode_position", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return 0
    offset = counter.value
    counter.value = offset + length
    return offset


class Transformer(nn.Module):
  """Encoder-decoder Transformer (Vaswani et al. 2017) with relative positions (Shaw et al. 2018).

  Sown attention weights (``mutable=["intermediates"]``) sit at
  ``intermediates/{encoder,decoder}/layer_i/{self,cross}_attention/attention_weights``,
  each ``[batch, heads, q, k]``.
  """

  config: ModelConfig

  def setup(self):
    c = self.config
    # setup() names submodules after the attributes they are assigned to.
    if c.share_embeddings:
      self.shared_embedding = _embedding(c)
      source = target = self.shared_embedding
    else:
      self.source_embedding, self.target_embedding = _embedding(c), _embedding(c)
      source, target = self.source_embedding, self.target_embedding
    self.encoder = Encoder(c, source)
    self.decoder = Decoder(c, target)

  def encode(self, inputs: Array) -> Array:
    """``inputs [batch, L_in] int32`` (PAD=0 masked) -> ``encoded [batch, L_in, d_model]``."""
    return self.encoder(inputs)

  def decode(self, encoded: Array, inputs: Array, decoder_inputs: Array) -> Array:
    """Logits ``[batch, L_out, vocab]`` (float32) of the next tokens.

    ``decoder_inputs [batch, L_out]`` are already shifted right (BOS first);
    in decode mode ``L_out == 1`` and the ``cache`` collection must be mutable.
    ``inputs`` supply the padding mask of the encoder-decoder attention.
    """
    return self.decoder(decoder_inputs, encoded, inputs)

  def __call__(self, inputs: Array, targets: Array) -> Array:
    """Teacher-forced logits ``[batch, L_out, vocab]`` for ``targets [batch, L_out]``."""
    return self.decode(self.encode(inputs), inputs, shift_right(targets))


class LanguageModel(nn.Module):
  """Decoder-only causal Transformer (``num_encoder_layers = 0``): :class:`Decoder` without cross-attention.

  The same interface as :class:`Transformer`, so the engine, the decode
  cache and :mod:`rpr.predict` take either: ``inputs`` must be empty
  (``[batch, 0]``, a language-model data set) and ``encode`` returns None.
  Every self-attention layer is causal; a trained model scores text longer
  than it was trained on wherever its scheme allows (learned tables stop
  at ``max_length``).
  """

  config: ModelConfig

  def setup(self):
    c = self.config
    if c.num_encoder_layers:
      raise ValueError(f"LanguageModel needs model.num_encoder_layers = 0, got {c.num_encoder_layers}")
    self.embedding = _embedding(c)
    self.decoder = Decoder(c, self.embedding)

  def encode(self, inputs: Array) -> None:
    if inputs.shape[1]:
      raise ValueError(f"a decoder-only model takes no inputs, got inputs of length {inputs.shape[1]}")
    return None

  def decode(self, encoded, inputs: Array, decoder_inputs: Array) -> Array:
    """Logits ``[batch, L, vocab]`` (float32) of the next tokens after ``decoder_inputs`` (BOS first)."""
    del encoded, inputs
    return self.decoder(decoder_inputs)

  def __call__(self, inputs: Array, targets: Array) -> Array:
    """Teacher-forced logits ``[batch, L, vocab]``: token t is predicted from BOS and ``targets[:t]``."""
    return self.decode(self.encode(inputs), inputs, shift_right(targets))


def build(config: ModelConfig) -> nn.Module:
  """The model ``config`` describes: :class:`LanguageModel` without encoder layers, else :class:`Transformer`."""
  return LanguageModel(config) if config.num_encoder_layers == 0 else Transformer(config)


def init_cache(config: ModelConfig, batch_size: int, max_decode_len: int, input_length: int = 1):
  """An empty decode cache for ``batch_size`` rows and up to ``max_decode_len`` steps.

  Flax's cache pattern: ``init`` in decode mode on a full-length dummy target
  sizes the cached keys/values; its ``cache`` collection is the empty cache.
  """
  if max_decode_len > config.max_length:
    raise ValueError(f"max_decode_len {max_decode_len} exceeds ModelConfig.max_length {config.max_length}")
  model = build(config.replace(decode=True, deterministic=True))
  inputs = jnp.ones((batch_size, 0 if config.num_encoder_layers == 0 else input_length), jnp.int32)
  targets = jnp.ones((batch_size, max_decode_len), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), inputs, targets))
  # Only the shapes come from init (no parameter is computed); the cache starts at zeros.
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])
