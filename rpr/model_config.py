"""The model's typed config: :class:`ModelConfig` (each field declared once, validated), its presets and variants.

One frozen :class:`ModelConfig` describes the model; the train, eval and
decode variants are derived from it::

  config = preset("base", vocab_size=32768)
  eval_config = config.replace(deterministic=True)
  decode_config = config.replace(decode=True, deterministic=True)

:mod:`rpr.model` builds the Flax modules a config describes (and re-exports
the names of this module, so ``rpr.model.ModelConfig`` and ``rpr.model.preset``
keep working).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp
from absl import logging

from rpr.attention import layer as attention_layer
from rpr.attention import positions
from rpr.fields import check, refuse, setting

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

  def validate(self, notes: bool = True) -> "ModelConfig":
    """Raises ``ValueError`` naming the bad key and what is allowed; returns ``self``.

    The fields' declarations (:func:`rpr.fields.check`), then the rules between fields, then (``notes``) the
    notes on valid values that may not do what they seem to (:meth:`log_notes`). The run's
    :func:`rpr.config.validate` calls it once, with ``notes=False``: it logs them once the whole tree has passed,
    so that a bad value elsewhere is still the only line. A model built from an unchecked config is not checked
    again.
    """
    check(self, "model.", skip=("position", "cross_position"))
    if notes:
      self.log_notes()
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

  def log_notes(self) -> None:
    """A log line for each valid value that may not do what it seems to: each scheme's ``note`` on its options
    (:meth:`rpr.attention.Scheme.note`; Shaw's: a clipping distance not below ``max_length``). A run config gives
    self- and cross-attention the same ``model.<scheme>``: the same options, one note naming both."""
    named = {}
    for name, key in ((self.position, "position_options"), (self.cross_position, "cross_position_options")):
      named.setdefault((name, getattr(self, key)), []).append(key)
    for (name, options), keys in named.items():
      note = positions.get(name).note(options, self.max_length, f"model.{name}; ModelConfig.{' and '.join(keys)}")
      if note:
        logging.info("Note: %s", note)


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
