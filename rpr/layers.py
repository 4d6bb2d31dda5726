"""Multi-head attention as a ``flax.linen`` module, its position scheme chosen by name."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from rpr import attention as attn
from rpr import chunked as chunked_lib
from rpr import positions

Array = jax.Array

KINDS = ("dot", "additive", "local")
IMPLEMENTATIONS = ("dense", "chunked")


class MultiHeadAttention(nn.Module):
  """Projections in, one scoring function per head, projection out.

  Attributes:
    num_heads: number of heads; ``head_dim`` defaults to ``features_in // num_heads``.
    position: name of the position scheme (see :mod:`rpr.positions`) used in
      this layer's attention; absolute schemes do nothing here.
    position_config: the scheme's hyper-parameters.
    scheme: optionally a scheme module owned by a parent, to share its
      parameters across layers (T5 shares its bias this way).
    kind: ``dot`` (scaled dot-product), ``additive`` (Bahdanau) or ``local``
      (dot-product restricted to ``|j - i| <= window``).
    causal: mask keys after the query (decoder self-attention).
    decode: one query token per call, keys and values cached in the ``cache``
      collection; initialise with a full-length input to size the cache.
    implementation: ``dense`` materialises the ``[batch, heads, q, k]``
      weights (and sows them); ``chunked`` (kind ``dot`` only) runs
      :func:`rpr.chunked.chunked_attention`, whose memory is linear in the
      lengths (apart from a dense ``mask`` argument, which it slices per
      block) and which sows no weights. Decode steps (one query) stay dense.
  """

  num_heads: int
  head_dim: Optional[int] = None
  out_features: Optional[int] = None
  position: str = "none"
  position_config: positions.PositionConfig = positions.PositionConfig()
  scheme: Optional[nn.Module] = None
  kind: str = "dot"
  window: int = 0
  causal: bool = False
  dropout_rate: float = 0.0
  decode: bool = False
  use_bias: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str = "dense"

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Optional[Array] = None, *, mask: Optional[Array] = None,
               deterministic: bool = True, q_offset=0) -> Array:
    """``inputs_q [batch, q, features]``, ``inputs_kv [batch, k, features]`` (None: self-attention).

    ``mask`` is boolean, broadcastable to ``[batch, heads, q, k]``. The
    attention weights are sown in ``intermediates/attention_weights``.
    ``q_offset`` is the position of query 0 when not decoding (the
    encoder-decoder attention of a cached decoder step at position ``t``
    passes ``t``); with ``decode=True`` the cache index is used instead.
    """
    if self.kind not in KINDS:
      raise ValueError(f"unknown attention kind {self.kind!r}; allowed: {list(KINDS)}")
    if self.kind == "local" and self.window < 1:
      raise ValueError(f"kind='local' needs window >= 1, got {self.window}")
    if self.implementation not in IMPLEMENTATIONS:
      raise ValueError(f"unknown implementation {self.implementation!r}; allowed: {list(IMPLEMENTATIONS)}")
    if self.implementation == "chunked" and self.kind != "dot":
      raise ValueError(f"implementation='chunked' supports kind='dot' only, got kind={self.kind!r}")
    chunked = self.implementation == "chunked" and not self.decode
    self_attention = inputs_kv is None
    inputs_kv = inputs_q if self_attention else inputs_kv
    features = inputs_q.shape[-1]
    head_dim = self.head_dim or features // self.num_heads
    if self.head_dim is None and features % self.num_heads:
      raise ValueError(f"features {features} are not divisible by num_heads {self.num_heads}")
    dense = lambda name: nn.DenseGeneral((self.num_heads, head_dim), use_bias=self.use_bias, dtype=self.dtype,
                                         param_dtype=self.param_dtype, name=name)
    query, key, value = dense("query")(inputs_q), dense("key")(inputs_kv), dense("value")(inputs_kv)

    if self.decode:
      key, value, mask, q_offset = self._update_cache(key, value, mask)
    elif self.causal and not chunked:  # the chunked path masks causally per block
      mask = attn.combine_masks(mask, attn.causal_mask(query.shape[1], key.shape[1], q_offset))

    scheme = self.scheme
    if scheme is None:
      config = dataclasses.replace(self.position_config, causal=self.causal)
      scheme = positions.make(self.position, self.num_heads, head_dim, config, name="position")
    terms = scheme.attend(query, key, q_offset)
    q_len, k_len = query.shape[1], key.shape[1]
    bias = None if chunked else terms.bias(q_len, k_len, q_offset)
    if self.kind == "local":
      mask = attn.combine_masks(mask, attn.window_mask(q_len, k_len, self.window, q_offset, self.causal))
    dropout_rng = None
    rate = 0.0 if deterministic else self.dropout_rate
    if rate > 0:
      dropout_rng = self.make_rng("dropout")

    weights = None
    if chunked:
      out = chunked_lib.chunked_attention(terms.query, terms.key, value, relative=terms.relative,
                                          bias_fn=terms.bias_fn, mask=mask, causal=self.causal, q_offset=q_offset,
                                          dropout_rate=rate, dropout_rng=dropout_rng)
    elif self.kind == "additive":
      if terms.relative is not None:
        raise ValueError(f"position {self.position!r} adds Shaw relative terms, which kind='additive' does not "
                         "support; use kind='dot' or 'local'")
      v = self.param("score_vector", nn.initializers.normal(head_dim ** -0.5), (self.num_heads, head_dim),
                     self.param_dtype)
      out, weights = attn.additive_attention(terms.query, terms.key, value, v, mask=mask, bias=bias,
                                             dropout_rate=rate, dropout_rng=dropout_rng, return_weights=True)
    else:
      out, weights = attn.dot_product_attention(terms.query, terms.key, value, mask=mask, bias=bias,
                                                relative=terms.relative, dropout_rate=rate,
                                                dropout_rng=dropout_rng, return_weights=True)
    if weights is not None:
      self.sow("intermediates", "attention_weights", weights)
    return nn.DenseGeneral(self.out_features or features, axis=(-2, -1), use_bias=self.use_bias, dtype=self.dtype,
                           param_dtype=self.param_dtype, name="out")(out)

  def _update_cache(self, key: Array, value: Array, mask: Optional[Array]):
    """Writes this step's key/value at ``cache_index``; the query sits at that position."""
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:  # init call: sizes the cache, attends as a full causal pass
      mask = attn.combine_masks(mask, attn.causal_mask(key.shape[1], key.shape[1]))
      return key, value, mask, 0
    b, max_len, h, d = cached_key.value.shape
    if key.shape != (b, 1, h, d):
      raise ValueError(f"decode step expects one token of shape {(b, 1, h, d)}, got {key.shape}")
    i = index.value
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, i, 0, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, i, 0, 0))
    index.value = i + 1
    seen = (jnp.arange(max_len) <= i)[None, None, None, :]
    return cached_key.value, cached_value.value, attn.combine_masks(mask, seen), i
