"""Encoder-decoder Transformer with a position scheme chosen by name.

One frozen :class:`ModelConfig` describes the model; the train, eval and
decode variants are derived from it::

  config = preset("base", vocab_size=32768)
  eval_config = config.replace(deterministic=True)
  decode_config = config.replace(decode=True, deterministic=True)

:class:`Transformer` has ``encode``, ``decode`` and ``__call__``. Shaw et al.
(2018) replace self-attention with relation-aware self-attention in encoder
and decoder and keep the encoder-decoder attention plain (``cross_position``
``"none"``). In decode mode the decoder runs one token per call; its
self-attention keys and values and the current position live in the
``cache`` collection, initialised by ``model.init`` on a full-length dummy
target (see :func:`init_cache`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rpr import blocks
from rpr import layers
from rpr import positions
from rpr.attention import causal_mask, combine_masks, padding_mask
from rpr.data.task import BOS, EOS, PAD

Array = jax.Array

# Schemes whose parameters one module holds for a whole stack (T5 shares its
# bias across layers); every other scheme is created per layer, so Shaw's
# tables are unique per layer as in the paper.
SHARED_ACROSS_LAYERS = ("t5",)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the Transformer; defaults are Shaw et al.'s base model.

  Attributes:
    vocab_size: shared source/target vocabulary (PAD=0, BOS=1, EOS=2 included).
    d_model: model width; ``num_heads`` heads of ``d_model // num_heads``.
    num_heads: attention heads.
    d_ff: inner width of the feed-forward sub-layers.
    num_encoder_layers, num_decoder_layers: stack depths.
    dropout_rate: on embeddings and on every sub-layer output before the residual sum.
    attention_dropout_rate: on the attention weights.
    encoder_position: scheme name (:data:`rpr.positions.SCHEMES`) of the
      encoder, used at the embedding (absolute schemes) and in self-attention.
    decoder_position: the same for the decoder (its self-attention is causal).
    cross_position: scheme of the encoder-decoder attention; ``"none"`` as in
      Shaw et al. Only schemes acting inside attention are allowed here.
    position_config: the schemes' hyper-parameters (its ``max_length`` is
      replaced by ``max_length`` below, its ``causal`` set per attention kind).
    pre_layer_norm: False for post-LN (Vaswani, Shaw), True for pre-LN.
    share_embeddings: one embedding matrix for source, target and output logits.
    max_length: longest sequence: learned position tables and decode caches.
    deterministic: no dropout (eval and decode).
    decode: the decoder runs one token per call against the ``cache`` collection.
    dtype: activation dtype (parameters stay float32).
    attention_implementation: ``"dense"`` or ``"chunked"`` (linear memory in
      the lengths, :mod:`rpr.chunked`) for every attention layer in training
      and full forward passes; cached decoding always runs dense. Both have
      the same parameters, so a checkpoint serves either.
  """

  vocab_size: int = 32768
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  encoder_position: str = "shaw"
  decoder_position: str = "shaw"
  cross_position: str = "none"
  position_config: positions.PositionConfig = positions.PositionConfig(max_distance=16, share_heads=False)
  pre_layer_norm: bool = False
  share_embeddings: bool = True
  max_length: int = 256
  deterministic: bool = False
  decode: bool = False
  dtype: Any = jnp.float32
  attention_implementation: str = "dense"

  def replace(self, **changes) -> "ModelConfig":
    """A copy with ``changes`` (unknown keys raise naming the allowed ones)."""
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
    if unknown:
      raise ValueError(f"unknown ModelConfig key(s) {unknown}; allowed: {[f.name for f in dataclasses.fields(self)]}")
    return dataclasses.replace(self, **changes)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  def to_dict(self) -> dict:
    """Plain JSON-able values (for ``config.json``)."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["position_config"] = dataclasses.asdict(self.position_config)
    d["dtype"] = np.dtype(self.dtype).name
    return d

  def validate(self) -> "ModelConfig":
    """Raises ``ValueError`` naming the bad key and what is allowed; returns ``self``."""
    def need(ok, key, allowed, value=None):
      if not ok:
        value = getattr(self, key) if value is None else value
        raise ValueError(f"ModelConfig.{key} = {value!r} is not allowed; allowed: {allowed}")

    for key in ("vocab_size", "d_model", "num_heads", "d_ff", "num_encoder_layers", "num_decoder_layers",
                "max_length"):
      v = getattr(self, key)
      need(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1, key, "an int >= 1")
    need(self.vocab_size > max(PAD, BOS, EOS), "vocab_size", "> 2 (ids 0, 1, 2 are PAD, BOS, EOS)")
    need(self.d_model % self.num_heads == 0, "num_heads", f"a divisor of d_model = {self.d_model}")
    for key in ("dropout_rate", "attention_dropout_rate"):
      v = getattr(self, key)
      need(isinstance(v, (int, float)) and 0.0 <= v < 1.0, key, "a rate in [0, 1)")
    for key in ("pre_layer_norm", "share_embeddings", "deterministic", "decode"):
      need(isinstance(getattr(self, key), bool), key, "True or False")
    need(isinstance(self.position_config, positions.PositionConfig), "position_config",
         "an rpr.positions.PositionConfig")
    names = sorted(positions.SCHEMES)
    for key in ("encoder_position", "decoder_position"):
      need(getattr(self, key) in positions.SCHEMES, key, names)
    cross = cross_schemes()
    need(self.cross_position in cross, "cross_position",
         f"{cross} (absolute schemes act at the embeddings, not in encoder-decoder attention)")
    try:
      np.dtype(self.dtype)
      floating = jnp.issubdtype(self.dtype, jnp.floating)
    except TypeError:
      floating = False
    need(floating, "dtype", "a floating dtype such as jnp.float32 or jnp.bfloat16")
    need(self.attention_implementation in layers.IMPLEMENTATIONS, "attention_implementation",
         list(layers.IMPLEMENTATIONS))
    for scheme in {self.encoder_position, self.decoder_position, self.cross_position}:
      try:
        blocks.position_config(self, causal=False).validate(scheme)
      except (TypeError, ValueError) as e:
        raise ValueError(f"ModelConfig.position_config is not allowed for scheme {scheme!r}: {e}") from None
      if scheme == "rope" and self.head_dim % 2:
        raise ValueError(f"ModelConfig: 'rope' needs an even head_dim, got d_model {self.d_model} / num_heads "
                         f"{self.num_heads} = {self.head_dim}")
    return self


def cross_schemes() -> list[str]:
  """Scheme names that do something inside attention, plus ``none``."""
  return sorted(n for n, cls in positions.SCHEMES.items()
                if n == "none" or cls.attend is not positions.Scheme.attend)


# ----------------------------------------------------------------------------
# Presets.

_PRESETS = {
    # Seconds on a CPU: for tests and the arithmetic task.
    "tiny": dict(vocab_size=16, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
                 dropout_rate=0.1, position_config=positions.PositionConfig(max_distance=8), max_length=64),
    # Shaw et al. base: 6+6 layers, d_model 512, 8 heads of 64, dropout 0.1,
    # k = 16, tables per layer and head. The paper's text says d_ff 1024; we
    # keep 2048 of the Transformer base (Vaswani et al.; tensor2tensor's
    # transformer_base) that its experiments build on.
    "base": dict(),
    # Shaw et al. big: d_model 1024, 16 heads, d_ff 4096, dropout 0.3 (EN-DE),
    # k = 8, tables per layer and shared across heads.
    "big": dict(d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3,
                position_config=positions.PositionConfig(max_distance=8, share_heads=True)),
}
PRESETS = tuple(_PRESETS)


def preset(name: str, **overrides) -> ModelConfig:
  """The named config with ``overrides`` applied and validated.

  Presets use relative positions (``shaw``) in encoder and decoder
  self-attention and none elsewhere; Shaw's absolute baseline is
  ``preset("base", encoder_position="sinusoidal", decoder_position="sinusoidal")``.
  Attention dropout is 0 as in the papers (only residual and embedding dropout).
  """
  if name not in _PRESETS:
    raise ValueError(f"unknown model preset {name!r}; allowed: {list(PRESETS)}")
  return ModelConfig().replace(**{**_PRESETS[name], **overrides}).validate()


# ----------------------------------------------------------------------------
# The model.


def shift_right(targets: Array, bos_id: int = BOS) -> Array:
  """``[b, L]`` targets -> decoder inputs ``[BOS, t_0, ..., t_{L-2}]`` (teacher forcing)."""
  return jnp.concatenate([jnp.full_like(targets[:, :1], bos_id), targets[:, :-1]], axis=1)


def _embedding(config: ModelConfig) -> nn.Embed:
  # Variance 1/d_model so that the sqrt(d_model)-scaled inputs have unit
  # variance and the tied output logits start small.
  return nn.Embed(config.vocab_size, config.d_model, embedding_init=nn.initializers.normal(config.d_model ** -0.5),
                  dtype=config.dtype)


def _stack_scheme(config: ModelConfig, name: str, causal: bool, key: str) -> nn.Module:
  """The scheme module of one stack: absolute encodings at the embeddings, shared attention terms."""
  return positions.make(name, config.num_heads, config.head_dim, blocks.position_config(config, causal), name=key)


def _embed(config: ModelConfig, embedding: nn.Module, scheme: nn.Module, ids: Array, offset=0) -> Array:
  """``ids [b, L]`` -> ``[b, L, d]``: ``sqrt(d) E[ids]`` plus any absolute encoding, then dropout."""
  x = embedding(ids) * jnp.sqrt(jnp.asarray(config.d_model, config.dtype))
  x = scheme.embed(x, offset)
  return nn.Dropout(config.dropout_rate)(x, deterministic=config.deterministic)


class Encoder(nn.Module):
  """``inputs [batch, L_in] int32 -> [batch, L_in, d_model]``."""

  config: ModelConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    c = self.config
    scheme = _stack_scheme(c, c.encoder_position, False, "position")
    shared = scheme if c.encoder_position in SHARED_ACROSS_LAYERS else None
    valid = inputs != PAD
    mask = padding_mask(valid, valid)
    x = _embed(c, self.embedding, scheme, inputs)
    for i in range(c.num_encoder_layers):
      x = blocks.EncoderBlock(c, scheme=shared, name=f"layer_{i}")(x, mask)
    if c.pre_layer_norm:
      x = nn.LayerNorm(dtype=c.dtype, name="final_norm")(x)
    return x


class Decoder(nn.Module):
  """``(encoded [b, L_in, d], inputs [b, L_in], decoder_inputs [b, L_out]) -> logits [b, L_out, vocab]``."""

  config: ModelConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, encoded: Array, inputs: Array, decoder_inputs: Array) -> Array:
    c = self.config
    offset = self._position(decoder_inputs.shape[1]) if c.decode else 0
    self_scheme = _stack_scheme(c, c.decoder_position, True, "position")
    cross_scheme = None
    if c.cross_position in SHARED_ACROSS_LAYERS:
      cross_scheme = _stack_scheme(c, c.cross_position, False, "cross_position")
    cross_mask = padding_mask(None, inputs != PAD)
    if c.decode:
      self_mask = None  # the cache masks the keys not yet written
    else:
      valid = decoder_inputs != PAD
      self_mask = combine_masks(padding_mask(valid, valid), causal_mask(valid.shape[1], valid.shape[1]))
    y = _embed(c, self.embedding, self_scheme, decoder_inputs, offset)
    shared = self_scheme if c.decoder_position in SHARED_ACROSS_LAYERS else None
    for i in range(c.num_decoder_layers):
      y = blocks.DecoderBlock(c, self_scheme=shared, cross_scheme=cross_scheme, name=f"layer_{i}")(
          y, encoded, self_mask, cross_mask, offset)
    if c.pre_layer_norm:
      y = nn.LayerNorm(dtype=c.dtype, name="final_norm")(y)
    if c.share_embeddings:
      logits = self.embedding.attend(y)
    else:
      logits = nn.Dense(c.vocab_size, dtype=c.dtype, name="logits")(y)
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
    c = self.config.validate()
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
    return self.decoder(encoded, inputs, decoder_inputs)

  def __call__(self, inputs: Array, targets: Array) -> Array:
    """Teacher-forced logits ``[batch, L_out, vocab]`` for ``targets [batch, L_out]``."""
    return self.decode(self.encode(inputs), inputs, shift_right(targets))


def init_cache(config: ModelConfig, batch_size: int, max_decode_len: int, input_length: int = 1):
  """An empty decode cache for ``batch_size`` rows and up to ``max_decode_len`` steps.

  Flax's cache pattern: ``init`` in decode mode on a full-length dummy target
  sizes the cached keys/values; its ``cache`` collection is the empty cache.
  """
  if max_decode_len > config.max_length:
    raise ValueError(f"max_decode_len {max_decode_len} exceeds ModelConfig.max_length {config.max_length}")
  model = Transformer(config.replace(decode=True, deterministic=True))
  inputs = jnp.ones((batch_size, input_length), jnp.int32)
  targets = jnp.ones((batch_size, max_decode_len), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), inputs, targets))
  # Only the shapes come from init (no parameter is computed); the cache starts at zeros.
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])
