"""Encoder-decoder Transformer, and its decoder-only language model, with a position scheme chosen by name.

One frozen :class:`ModelConfig` describes the model; the train, eval and
decode variants are derived from it::

  config = preset("base", vocab_size=32768)
  eval_config = config.replace(deterministic=True)
  decode_config = config.replace(decode=True, deterministic=True)

:class:`Transformer` has ``encode``, ``decode`` and ``__call__``; :class:`LanguageModel`
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

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rpr import blocks
from rpr.attention import layer as attention_layer
from rpr.attention import positions
from rpr.fields import check, refuse, setting
from rpr.tokens import BOS, EOS, PAD

Array = jax.Array
DTYPES = ("float32", "bfloat16")
# Bounds of the sizes (issue 71: a huge value is refused in one line, before any allocation).
MAX_VOCAB, MAX_WIDTH, MAX_LAYERS, MAX_LENGTH = 2 ** 20, 2 ** 16, 256, 2 ** 20


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the Transformer; defaults are Shaw et al.'s base model.

  A run config's ``model`` sub-dict holds these fields by name (all but
  ``vocab_size``, which the data set sets, and ``deterministic`` / ``decode``,
  which the engine sets per use): ``ModelConfig(**config.model, vocab_size=...)``.

  Attributes:
    vocab_size: shared source/target vocabulary (PAD=0, BOS=1, EOS=2 included).
    d_model: model width; ``num_heads`` heads of ``d_model // num_heads``.
    num_heads: attention heads.
    d_ff: inner width of the feed-forward sub-layers.
    num_encoder_layers, num_decoder_layers: stack depths.
    dropout_rate: on embeddings and on every sub-layer output before the residual sum.
    attention_dropout_rate: on the attention weights.
    position: scheme name (:data:`rpr.attention.SCHEMES`) of the encoder and
      decoder, used at the embeddings (absolute schemes) and in self-attention.
    position_options: that scheme's ``Options`` (typed, checked; a mapping of
      their fields is converted, None gives the defaults), e.g. Shaw's
      clipping distance, ``use_keys``, ``use_values``, ``share_heads``, ``add_sinusoidal``.
    cross_position: scheme of the encoder-decoder attention; ``"none"`` as in
      Shaw et al. Only schemes acting inside attention are allowed here.
    cross_position_options: its ``Options``, as ``position_options``.
    pre_layer_norm: False for post-LN (Vaswani, Shaw), True for pre-LN.
    share_embeddings: one embedding matrix for source, target and output logits.
    max_length: longest sequence: learned position tables and decode caches.
    dtype: activation dtype name, ``float32`` or ``bfloat16`` (parameters stay float32).
    attention_implementation: ``dense`` or ``chunked`` (linear memory in the
      lengths) for every attention layer in training and full forward passes;
      cached decoding always runs dense. Both have the same parameters.
    deterministic: no dropout (eval and decode).
    decode: the decoder runs one token per call against the ``cache`` collection.
  """

  # Each field's default, type and range, declared once (rpr.fields): ModelConfig.validate holds a config to them.
  # The upper bounds stop a huge value before any allocation (issue 71); they are far above any model here.
  vocab_size: Optional[int] = setting(32768, int, lo=3, hi=MAX_VOCAB, optional=True,
                                      why=" (ids 0, 1, 2 are PAD, BOS, EOS; None: the data set's, set by the engine)")
  d_model: int = setting(512, int, lo=1, hi=MAX_WIDTH)
  num_heads: int = setting(8, int, lo=1, hi=MAX_WIDTH)
  d_ff: int = setting(2048, int, lo=1, hi=4 * MAX_WIDTH)
  num_encoder_layers: int = setting(6, int, lo=0, hi=MAX_LAYERS, why=" (0: a decoder-only language model)")
  num_decoder_layers: int = setting(6, int, lo=1, hi=MAX_LAYERS)
  dropout_rate: float = setting(0.1, float, lo=0.0, hi=1.0, hi_open=True)
  attention_dropout_rate: float = setting(0.0, float, lo=0.0, hi=1.0, hi_open=True)
  position: str = setting("shaw", str)  # its choices are the registry's: checked by validate
  position_options: Any = None
  cross_position: str = setting("none", str)
  cross_position_options: Any = None
  pre_layer_norm: bool = setting(False, bool)
  share_embeddings: bool = setting(True, bool)
  max_length: int = setting(256, int, lo=1, hi=MAX_LENGTH)
  dtype: str = setting("float32", str, choices=DTYPES)
  attention_implementation: str = setting("dense", str, choices=tuple(sorted(attention_layer.DOT_PRODUCT)))
  deterministic: bool = setting(False, bool)
  decode: bool = setting(False, bool)

  def __post_init__(self):
    # The typed options of each scheme (parse_options also checks them). An unknown scheme is left for validate.
    for name, key in ((self.position, "position_options"), (self.cross_position, "cross_position_options")):
      if isinstance(name, str) and name in positions.SCHEMES:
        try:
          object.__setattr__(self, key, positions.parse_options(name, getattr(self, key)))
        except ValueError as e:
          raise ValueError(f"model.{key}: {e}") from None

  def replace(self, **changes) -> "ModelConfig":
    """A copy with ``changes`` (unknown keys raise naming the allowed ones)."""
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
    if unknown:
      raise ValueError(f"unknown ModelConfig key(s) {unknown}; allowed: {[f.name for f in dataclasses.fields(self)]}")
    for scheme, key in (("position", "position_options"), ("cross_position", "cross_position_options")):
      if changes.get(scheme, getattr(self, scheme)) != getattr(self, scheme) and key not in changes:
        changes[key] = None  # options belong to their scheme: a new scheme starts from its own defaults
    return dataclasses.replace(self, **changes)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  def to_dict(self) -> dict:
    """Plain JSON-able values (for ``config.json``)."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    for key in ("position_options", "cross_position_options"):
      d[key] = dataclasses.asdict(d[key]) if dataclasses.is_dataclass(d[key]) else d[key]
    return d

  def validate(self) -> "ModelConfig":
    """Raises ``ValueError`` naming the bad key and what is allowed; returns ``self``.

    The fields' declarations (:func:`rpr.fields.check`), then the rules between fields. The run's
    :func:`rpr.config.validate` calls it once; a model built from an unchecked config is not checked again.
    """
    check(self, "model.", skip=("position", "cross_position"))
    return self

  def check(self) -> None:
    """The rules between fields, after each field's own (:func:`rpr.fields.check` calls it)."""
    need = lambda ok, key, allowed: ok or refuse(f"model.{key}", getattr(self, key), allowed)
    need(self.d_model % self.num_heads == 0, "num_heads", f"a divisor of d_model = {self.d_model}")
    need(isinstance(self.position, str) and self.position in positions.SCHEMES, "position", sorted(positions.SCHEMES))
    cross = cross_schemes()
    need(isinstance(self.cross_position, str) and self.cross_position in cross, "cross_position",
         f"{cross} (absolute schemes act at the embeddings, not in encoder-decoder attention)")
    for name, key in ((self.position, "position_options"), (self.cross_position, "cross_position_options")):
      try:  # the checks that depend on the width (RoPE's even head_dim)
        positions.parse_options(name, getattr(self, key), self.head_dim)
      except ValueError as e:
        raise ValueError(f"config.model.{key}: {e}") from None


def cross_schemes() -> list[str]:
  """Scheme names that do something inside attention, plus ``none``."""
  return sorted(n for n, cls in positions.SCHEMES.items() if n == "none" or cls.acts_in_attention())


# ----------------------------------------------------------------------------
# Presets.

PRESETS = {
    # Seconds on a CPU: for tests.
    "tiny": dict(vocab_size=16, d_model=32, num_heads=2, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
                 dropout_rate=0.1, position_options={"max_distance": 8}, max_length=64),
    # Shaw et al. base: 6+6 layers, d_model 512, 8 heads of 64, dropout 0.1,
    # Shaw's default clipping distance, tables per layer and head. The paper's text says d_ff 1024; we
    # keep 2048 of the Transformer base (Vaswani et al.; tensor2tensor's
    # transformer_base) that its experiments build on.
    "base": dict(d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6, num_decoder_layers=6, dropout_rate=0.1,
                 position_options={"share_heads": False}),
    # Shaw et al. big: d_model 1024, 16 heads, d_ff 4096, dropout 0.3 (EN-DE),
    # k = 8, tables per layer and shared across heads.
    "big": dict(d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=6, num_decoder_layers=6, dropout_rate=0.3,
                position_options={"max_distance": 8, "share_heads": True}),
}


def preset(name: str, **overrides) -> ModelConfig:
  """The named config (:data:`PRESETS`) with ``overrides`` applied, validated.

  Presets use relative positions (``shaw``) in encoder and decoder
  self-attention and none elsewhere; Shaw's absolute baseline is
  ``preset("base", position="sinusoidal")``.
  """
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; allowed: {list(PRESETS)}")
  settings = {**PRESETS[name], **overrides}
  if settings.get("position", "shaw") != "shaw" and "position_options" not in overrides:
    settings.pop("position_options")  # the preset's are Shaw's
  return ModelConfig().replace(**settings).validate()


# ----------------------------------------------------------------------------
# The model.


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
