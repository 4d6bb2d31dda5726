"""Position schemes by name: the registry every config, sweep, experiment and test reads.

A scheme acts at up to two places of a Transformer:

* ``embed(x, offset)`` on the token embeddings ``[batch, length, features]``
  (absolute schemes add their encoding here; the others return ``x``);
* ``terms(query, key, q_offset)`` in every attention layer, on the projected
  ``[batch, length, heads, head_dim]`` queries and keys; it returns
  :class:`Terms`: possibly rotated query and key (RoPE), an additive logits bias
  (T5, ALiBi) and Shaw's relative tables.

Keys always sit at positions ``0 .. k_length-1`` and query ``i`` at
``q_offset + i``, so a decoder step at position ``t`` passes ``q_offset=t``.

A scheme is a :class:`Scheme` subclass registered under a name. Its own
hyper-parameters are the fields of its ``Options`` dataclass, which holds
their only defaults (Shaw's ``max_distance``, T5's ``num_buckets``, ...) and
their checks: :func:`parse_options` turns a mapping of them into the typed
options, checked, and :func:`make` builds the scheme module from them.
Adding a scheme is one file holding one ``@register("name")`` subclass, plus
its import in ``rpr/attention/__init__.py`` (the README's "Adding a position
scheme" walks through one).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention.relative import Relative, check_max_distance

Array = jax.Array
BiasFn = Callable[[Array, Array], Array]  # (q_positions [q], k_positions [k]) -> [heads | 1, q, k]


@dataclasses.dataclass(frozen=True)
class Terms:
  """What a scheme contributes to one attention call."""

  query: Array
  key: Array
  bias_fn: Optional[BiasFn] = None
  relative: Optional[Relative] = None

  def bias(self, q_length: int, k_length: int, q_offset=0) -> Optional[Array]:
    """Dense ``[1, h, q, k]`` bias, or None."""
    if self.bias_fn is None:
      return None
    q_pos = jnp.arange(q_length) + jnp.asarray(q_offset, jnp.int32)
    return self.bias_fn(q_pos, jnp.arange(k_length))[None]


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """The options of a scheme that has none."""

  def check(self, head_dim: Optional[int] = None) -> None:
    """Raises ``ValueError`` (or ``TypeError``) naming a bad value and what is allowed."""


class Scheme(nn.Module):
  """Base of every scheme, and the scheme ``none`` (no position information).

  Attributes (set by the layer or the model):
    num_heads, head_dim: of the attention it serves.
    causal: causal self-attention (T5's one-sided buckets).
    max_length: longest position (learned tables).
    options: the scheme's ``Options`` (None: their defaults).
  """

  num_heads: int = 1
  head_dim: int = 1
  causal: bool = False
  max_length: int = 512
  options: Any = None

  Options: ClassVar[type] = NoOptions
  # One module for a whole stack (T5 shares its bias across layers) or one per layer (Shaw's tables).
  shared_across_layers: ClassVar[bool] = False
  scheme_name: ClassVar[str] = "none"

  def __post_init__(self):
    if self.options is None:
      object.__setattr__(self, "options", type(self).Options())
    super().__post_init__()

  def embed(self, x: Array, offset=0) -> Array:
    return x

  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    return Terms(query, key)

  @classmethod
  def acts_in_attention(cls) -> bool:
    return cls.terms is not Scheme.terms


SCHEMES: dict[str, type] = {}


def register(name: str):
  """Class decorator: the scheme is known as ``name`` from now on."""
  def deco(cls):
    if name in SCHEMES:
      raise ValueError(f"position scheme {name!r} is already registered")
    SCHEMES[name] = cls
    cls.scheme_name = name
    return cls
  return deco


def get(name: str) -> type:
  if not isinstance(name, str) or name not in SCHEMES:
    raise ValueError(f"unknown position scheme {name!r}; allowed: {sorted(SCHEMES)}")
  return SCHEMES[name]


def defaults(name: str) -> dict[str, Any]:
  """The options ``name`` declares, with their defaults (``{}`` for a scheme without options)."""
  return dataclasses.asdict(get(name).Options())


def parse_options(name: str, values=None, head_dim: Optional[int] = None):
  """The typed, checked ``Options`` of scheme ``name`` from a mapping of its fields (or its ``Options``).

  Fields left out keep their defaults. An unknown field, a value of the
  wrong type or out of range raises ``ValueError`` naming it and what is
  allowed; ``head_dim`` adds the checks that depend on it (RoPE's even width).
  """
  cls = get(name).Options
  if isinstance(values, cls):
    options = values
  elif dataclasses.is_dataclass(values):
    raise ValueError(f"options {values!r} are not {name}'s; allowed: {name}'s Options, or a mapping of its fields")
  else:
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
      if key not in fields:
        raise ValueError(f"{name} has no option {key!r}; allowed: {sorted(fields) or 'none'}")
      _check_type(name, key, value, type(fields[key].default))
    options = cls(**values)
  try:
    options.check(head_dim)
  except TypeError as e:
    raise ValueError(str(e)) from None
  return options


def _check_type(scheme: str, key: str, value, want: type) -> None:
  if want is float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  elif want is int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  else:
    ok = isinstance(value, want)
  if not ok:
    raise ValueError(f"{scheme} option {key} = {value!r} is not allowed; allowed: a {want.__name__}")


def make(scheme: str, num_heads: int, head_dim: int, *, options=None, causal: bool = False, max_length: int = 512,
         **linen_kwargs) -> Scheme:
  """The module of scheme ``scheme`` with ``options`` (its ``Options``, a mapping of them, or None for defaults).

  ``linen_kwargs``: ``name``, ``parent`` of the module.
  """
  options = parse_options(scheme, options, head_dim)
  return get(scheme)(num_heads=num_heads, head_dim=head_dim, causal=causal, max_length=max_length, options=options,
                     **linen_kwargs)


register("none")(Scheme)


def sinusoid(positions: Array, features: int, dtype=jnp.float32) -> Array:
  """Vaswani et al.: ``PE(p, 2i) = sin(p / 10000^(2i/d))``, ``PE(p, 2i+1) = cos(...)``; ``[..., features]``."""
  half = features // 2
  # At least float32 (bfloat16 angles are useless), float64 when asked for.
  ct = jnp.promote_types(dtype, jnp.float32)
  inv = 1.0 / (10000.0 ** (2.0 * jnp.arange(half, dtype=ct) / features))
  angles = positions.astype(ct)[..., None] * inv
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(positions.shape + (2 * half,))
  if features % 2:
    pe = jnp.concatenate([pe, jnp.zeros(positions.shape + (1,))], axis=-1)
  return pe.astype(dtype)


def _positions(length: int, offset) -> Array:
  return jnp.arange(length) + jnp.asarray(offset, jnp.int32)


def _add_sinusoid(x: Array, offset) -> Array:
  """``x [b, L, d]`` plus the sinusoids of positions ``offset .. offset + L - 1``."""
  return x + sinusoid(_positions(x.shape[1], offset), x.shape[-1], x.dtype)[None]


@register("sinusoidal")
class Sinusoidal(Scheme):
  """Absolute sinusoidal encoding added to the embeddings."""

  def embed(self, x: Array, offset=0) -> Array:
    return _add_sinusoid(x, offset)


@register("learned")
class Learned(Scheme):
  """Absolute learned embedding per position (``max_length`` rows)."""

  @dataclasses.dataclass(frozen=True)
  class Options:
    # Standard deviation of the table at initialisation (GPT-2's and BERT's 0.02; the model scales its
    # token embeddings by sqrt(d_model) to unit variance).
    learned_init_std: float = 0.02

    def check(self, head_dim: Optional[int] = None) -> None:
      if not 0 < self.learned_init_std <= float(np.finfo(np.float64).max):  # finite, as a float
        raise ValueError(f"learned option learned_init_std = {self.learned_init_std!r} is not allowed; "
                         "allowed: a finite number > 0")

  @nn.compact
  def embed(self, x: Array, offset=0) -> Array:
    n = self.max_length
    if x.shape[1] > n:
      raise ValueError(f"sequence length {x.shape[1]} exceeds the learned table's max_length {n}")
    table = self.param("embedding", nn.initializers.normal(self.options.learned_init_std), (n, x.shape[-1]))
    rows = jax.lax.dynamic_slice_in_dim(table, jnp.asarray(offset, jnp.int32), x.shape[1])
    return x + rows.astype(x.dtype)[None]


@register("shaw")
class Shaw(Scheme):
  """Shaw et al. (2018): learned a^K and a^V tables of ``2k+1`` vectors, clipped at ``k``."""

  @dataclasses.dataclass(frozen=True)
  class Options:
    max_distance: int = 16  # clipping distance k (Shaw's base model: 16)
    use_keys: bool = True  # the a^K term (on the logits)
    use_values: bool = True  # the a^V term (on the values)
    share_heads: bool = False  # one table for all heads (Shaw's big model) instead of one per head
    add_sinusoidal: bool = False  # also the absolute sinusoids at the embeddings (Shaw et al. drop them)

    def check(self, head_dim: Optional[int] = None) -> None:
      check_max_distance(self.max_distance)

  def embed(self, x: Array, offset=0) -> Array:
    return _add_sinusoid(x, offset) if self.options.add_sinusoidal else x

  @nn.compact
  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    o = self.options
    k = o.max_distance
    shape = (2 * k + 1, self.head_dim) if o.share_heads else (self.num_heads, 2 * k + 1, self.head_dim)
    init = nn.initializers.normal(self.head_dim ** -0.5)
    kt = self.param("key_table", init, shape) if o.use_keys else None
    vt = self.param("value_table", init, shape) if o.use_values else None
    if kt is None and vt is None:
      return Terms(query, key)
    return Terms(query, key, relative=Relative(k, kt, vt, offset=q_offset))


def t5_bucket(relative_position: Array, bidirectional: bool, num_buckets: int, max_distance: int) -> Array:
  """T5's bucket of ``key - query``: exact below ``num_buckets/2`` (per side), log-spaced to ``max_distance``."""
  n = num_buckets
  ret = 0
  rp = relative_position
  if bidirectional:
    n //= 2
    ret = (rp > 0).astype(jnp.int32) * n
    rp = jnp.abs(rp)
  else:
    rp = jnp.maximum(-rp, 0)
  max_exact = n // 2
  is_small = rp < max_exact
  large = max_exact + (
      jnp.log(jnp.maximum(rp, 1).astype(jnp.float32) / max_exact)
      / math.log(max_distance / max_exact) * (n - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, n - 1)
  return ret + jnp.where(is_small, rp, large)


@register("t5")
class T5Bias(Scheme):
  """Raffel et al. (2020): one learned scalar per (bucketed relative distance, head), shared by the layers."""

  @dataclasses.dataclass(frozen=True)
  class Options:
    num_buckets: int = 32  # buckets (both directions together unless causal); T5: 32
    bucket_max_distance: int = 128  # distances from here on share the last bucket; T5: 128

    def check(self, head_dim: Optional[int] = None) -> None:
      if self.num_buckets < 2:
        raise ValueError(f"t5 option num_buckets = {self.num_buckets} is not allowed; allowed: an int >= 2")
      if self.bucket_max_distance < self.num_buckets:
        raise ValueError(f"t5 option bucket_max_distance = {self.bucket_max_distance} is not allowed; allowed: "
                         f"an int >= num_buckets ({self.num_buckets})")

  shared_across_layers: ClassVar[bool] = True

  @nn.compact
  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    o = self.options
    table = self.param("bias", nn.initializers.normal(0.02), (o.num_buckets, self.num_heads))

    def bias_fn(q_pos, k_pos):
      buckets = t5_bucket(k_pos[None, :] - q_pos[:, None], not self.causal, o.num_buckets, o.bucket_max_distance)
      return jnp.transpose(table[buckets], (2, 0, 1))

    return Terms(query, key, bias_fn=bias_fn)


def rotate(x: Array, positions: Array, base: float = 10000.0) -> Array:
  """RoPE (Su et al. 2021): rotate feature pairs ``(x_2i, x_2i+1)`` by ``p * base^(-2i/d)``.

  ``x`` is ``[batch, length, heads, head_dim]`` (even head_dim), ``positions`` ``[length]``.
  """
  d = x.shape[-1]
  if d % 2:
    raise ValueError(f"rope needs an even head_dim, got {d}")
  # At least float32 (bfloat16 angles are useless), float64 for float64 inputs.
  ct = jnp.promote_types(x.dtype, jnp.float32)
  inv = base ** (-jnp.arange(0, d, 2, dtype=ct) / d)
  angles = positions.astype(ct)[:, None] * inv  # [l, d/2]
  cos, sin = jnp.cos(angles)[None, :, None], jnp.sin(angles)[None, :, None]
  x1, x2 = x[..., 0::2].astype(ct), x[..., 1::2].astype(ct)
  out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
  return out.reshape(x.shape).astype(x.dtype)


@register("rope")
class RoPE(Scheme):
  """Rotary position embedding on queries and keys: ``q_i . k_j`` depends on ``j - i`` only."""

  @dataclasses.dataclass(frozen=True)
  class Options:
    rope_base: float = 10000.0  # frequency base

    def check(self, head_dim: Optional[int] = None) -> None:
      # inf, or an int no float holds, is not a base
      if not 1 < self.rope_base <= float(np.finfo(np.float64).max):
        raise ValueError(f"rope option rope_base = {self.rope_base!r} is not allowed; allowed: a finite number > 1")
      if head_dim is not None and head_dim % 2:
        raise ValueError(f"rope needs an even head_dim, got {head_dim}")

  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    b = self.options.rope_base
    return Terms(rotate(query, _positions(query.shape[1], q_offset), b),
                 rotate(key, jnp.arange(key.shape[1]), b))


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al. (2022): geometric slopes ``2^(-8 h / H)``, extended for non-powers of two."""
  def pow2(n):
    start = 2 ** (-8 / n)
    return [start ** (i + 1) for i in range(n)]
  p = 2 ** math.floor(math.log2(num_heads))
  slopes = pow2(p)
  if p < num_heads:
    slopes += pow2(2 * p)[0::2][: num_heads - p]
  return np.asarray(slopes, np.float32)


@register("alibi")
class ALiBi(Scheme):
  """ALiBi (Press et al. 2022): bias ``-m_h |j - i|``, symmetric.

  In bidirectional attention it sees distance but not direction. The
  registered variant ``alibi_directional`` halves the slope for keys to the
  right of the query, so it also sees direction.
  """

  directional: ClassVar[bool] = False

  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    slopes = jnp.asarray(alibi_slopes(self.num_heads))[:, None, None]
    directional = self.directional

    def bias_fn(q_pos, k_pos):
      d = (k_pos[None, :] - q_pos[:, None]).astype(jnp.float32)
      right = jnp.where(d > 0, 0.5, 1.0) if directional else 1.0
      return -slopes * jnp.abs(d) * right

    return Terms(query, key, bias_fn=bias_fn)


@register("alibi_directional")
class DirectionalALiBi(ALiBi):
  """ALiBi with half the slope for keys right of the query: ``-m_h |j - i| (1/2 if j > i)``."""

  directional: ClassVar[bool] = True
