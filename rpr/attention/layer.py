"""Multi-head attention as a ``flax.linen`` module: a position scheme and an implementation, each by name."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from rpr.attention import positions
from rpr.attention.chunked import chunked_attention
from rpr.attention.dense import additive_attention, dot_product_attention
from rpr.attention.masks import Mask, check_offset

Array = jax.Array


# ----------------------------------------------------------------------------
# Implementations: one signature, (layer, terms, value, mask, q_offset, rate, rng) -> (out, weights | None).


def _dense(layer, terms: positions.Terms, value: Array, mask: Mask, q_offset, rate: float, rng):
  bias = terms.bias(terms.query.shape[1], terms.key.shape[1], q_offset)
  return dot_product_attention(terms.query, terms.key, value, mask=mask, bias=bias, relative=terms.relative,
                               q_offset=q_offset, dropout_rate=rate, dropout_rng=rng, return_weights=True)


def _chunked(layer, terms: positions.Terms, value: Array, mask: Mask, q_offset, rate: float, rng):
  out = chunked_attention(terms.query, terms.key, value, relative=terms.relative, bias_fn=terms.bias_fn,
                          mask=mask, q_offset=q_offset, dropout_rate=rate, dropout_rng=rng)
  return out, None


def _additive(layer, terms: positions.Terms, value: Array, mask: Mask, q_offset, rate: float, rng):
  if terms.relative is not None:
    raise ValueError("position 'shaw' adds Shaw relative terms, which implementation='additive' does not support; "
                     "use 'dense' or 'chunked'")
  head_dim = terms.query.shape[-1]
  v = layer.param("score_vector", nn.initializers.normal(head_dim ** -0.5), (layer.num_heads, head_dim),
                  layer.param_dtype)
  bias = terms.bias(terms.query.shape[1], terms.key.shape[1], q_offset)
  return additive_attention(terms.query, terms.key, value, v, mask=mask, bias=bias, q_offset=q_offset,
                            dropout_rate=rate, dropout_rng=rng, return_weights=True)


# dense: scaled dot-product, weights formed (and sown); chunked: the same in memory linear in the lengths,
# no weights; additive: Bahdanau scores (no Shaw terms).
IMPLEMENTATIONS: dict[str, Callable] = {"dense": _dense, "chunked": _chunked, "additive": _additive}
# The implementations of one scaled dot-product attention, with the same parameters: a model may use either.
DOT_PRODUCT = ("dense", "chunked")


def check_implementation(name: str) -> None:
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"unknown attention implementation {name!r}; allowed: {sorted(IMPLEMENTATIONS)}")


def in_attention_schemes() -> list[str]:
  """The scheme names this layer takes: those acting inside attention, and ``none``."""
  return sorted(n for n, cls in positions.SCHEMES.items() if n == "none" or cls.acts_in_attention())


def check_in_attention(scheme: positions.Scheme) -> None:
  """Raises ``ValueError`` if ``scheme``, built from a name, encodes positions at the token embeddings.

  Such a scheme's ``embed`` changes its input (sinusoidal, learned, shaw with
  ``add_sinusoidal=True``); the layer never calls ``embed``, so it would drop
  that encoding silently.
  """
  if type(scheme).embed is positions.Scheme.embed:
    return
  name = scheme.scheme_name
  if type(scheme).acts_in_attention():  # acts in attention, and at the embeddings only with add_sinusoidal
    if not getattr(scheme.options, "add_sinusoidal", True):
      return
    what = f"{name!r} with add_sinusoidal=True adds sinusoids that act"
    instead = f"{name!r} with add_sinusoidal=False, another scheme"
  else:
    what, instead = f"{name!r} acts", "a scheme"
  raise ValueError(f"position {what} on the token embeddings, not inside attention, and this layer never calls its "
                   f"embed: add it to the layer's input with rpr.attention.positions.make({name!r}, ...).embed(x) "
                   f"(as rpr.model does from model.position) and pass the layer {instead} that acts in attention, "
                   f"or 'none'; allowed: {in_attention_schemes()}")


class MultiHeadAttention(nn.Module):
  """Projections in, attention per head with a position scheme, projection out.

  Attributes:
    num_heads: number of heads; ``head_dim`` defaults to ``features_in // num_heads``.
    position: the position scheme used in this layer's attention: its name
      (:data:`rpr.attention.positions.SCHEMES`), or a scheme module built by
      the caller (:func:`rpr.attention.positions.make`): an unbound one
      becomes this layer's own (Shaw's tables), a bound one is shared with
      its owner (T5's bias, shared by the layers of a stack). A name must
      name a scheme acting in attention, or be ``none``
      (:func:`in_attention_schemes`): a scheme that encodes positions at the
      token embeddings (sinusoidal, learned, shaw with ``add_sinusoidal``)
      raises ``ValueError``; add its ``embed`` to the layer's input instead.
      A module is used as given: its ``terms`` act here, its ``embed`` is
      the caller's to apply (:mod:`rpr.model` does, at the embeddings).
    position_options: with a scheme name, its options: its ``Options`` or a
      mapping of their fields, e.g. ``{"share_heads": True}`` (None: defaults).
    max_length: longest position, passed to a named scheme (none of those acting in attention reads it).
    implementation: ``dense``, ``chunked`` or ``additive`` (:data:`IMPLEMENTATIONS`).
      Decode steps (one query against the cache) run dense.
    causal: mask keys after the query (decoder self-attention).
    window: restricted attention: only keys within ``window`` positions (None: all).
    decode: one query token per call, keys and values cached in the ``cache``
      collection; initialise with a full-length input to size the cache.
  """

  num_heads: int
  head_dim: Optional[int] = None
  out_features: Optional[int] = None
  position: Union[str, nn.Module] = "none"
  position_options: Any = None
  max_length: int = 512
  implementation: str = "dense"
  causal: bool = False
  window: Optional[int] = None
  dropout_rate: float = 0.0
  decode: bool = False
  use_bias: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Optional[Array] = None, *, key_valid: Optional[Array] = None,
               deterministic: bool = True, q_offset=0) -> Array:
    """``inputs_q [batch, q, features]``, ``inputs_kv [batch, k, features]`` (None: self-attention).

    ``key_valid [batch, k]``: False for padding keys. The layer's ``causal``
    and ``window`` complete the :class:`Mask`. A query with no allowed key
    attends to nothing: zero before the output projection (by design, not an
    error: padding rows of PAD only have no valid key). With the dense implementation
    the attention weights are sown in ``intermediates/attention_weights``.
    ``q_offset`` is the position of query 0 when not decoding (the
    encoder-decoder attention of a cached decoder step at position ``t``
    passes ``t``); with ``decode=True`` the cache index is used instead.
    """
    check_implementation(self.implementation)
    check_offset(q_offset)
    if isinstance(self.num_heads, bool) or not isinstance(self.num_heads, int) or self.num_heads < 1:
      raise ValueError(f"num_heads must be an int >= 1, got {self.num_heads!r}")
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    for name, x in (("inputs_q", inputs_q), ("inputs_kv", inputs_kv)):
      if jnp.ndim(x) != 3:  # checked here: the projections would make another shape of it, and name that one
        raise ValueError(f"{name} must be [batch, length, features], got shape {tuple(jnp.shape(x))}")
    features = inputs_q.shape[-1]
    if self.head_dim is None and features % self.num_heads:
      raise ValueError(f"features {features} are not divisible by num_heads {self.num_heads}")
    head_dim = self.head_dim or features // self.num_heads
    dense = lambda name: nn.DenseGeneral((self.num_heads, head_dim), use_bias=self.use_bias, dtype=self.dtype,
                                         param_dtype=self.param_dtype, name=name)
    query, key, value = dense("query")(inputs_q), dense("key")(inputs_kv), dense("value")(inputs_kv)
    implementation = self.implementation
    if self.decode:
      key, value, q_offset = self._update_cache(key, value)
      if implementation == "chunked":
        implementation = "dense"
    mask = Mask(key_valid=key_valid, causal=self.causal or self.decode, window=self.window)

    scheme = self.position
    if isinstance(scheme, str):
      scheme = positions.make(scheme, self.num_heads, head_dim, causal=self.causal, max_length=self.max_length,
                              options=self.position_options, name="position")
      check_in_attention(scheme)
    terms = scheme.terms(query, key, q_offset)
    rate = 0.0 if deterministic else self.dropout_rate
    rng = self.make_rng("dropout") if rate > 0 else None
    out, weights = IMPLEMENTATIONS[implementation](self, terms, value, mask, q_offset, rate, rng)
    if weights is not None:
      self.sow("intermediates", "attention_weights", weights)
    return nn.DenseGeneral(self.out_features or features, axis=(-2, -1), use_bias=self.use_bias, dtype=self.dtype,
                           param_dtype=self.param_dtype, name="out")(out)

  def _update_cache(self, key: Array, value: Array):
    """Writes this step's key/value at ``cache_index``; returns the cache and the query's position.

    Keys not yet written lie after the query, so the causal mask hides them.
    """
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:  # init call: sizes the cache, attends as a full causal pass
      return key, value, 0
    b, max_len, h, d = cached_key.value.shape
    if key.shape != (b, 1, h, d):
      raise ValueError(f"decode step expects one token of shape {(b, 1, h, d)}, got {key.shape}")
    i = index.value
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, i, 0, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, i, 0, 0))
    index.value = i + 1
    return cached_key.value, cached_value.value, i
