"""T5's relative position bias (Raffel et al. 2020): a learned scalar per bucketed distance and head."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from rpr.attention.positions.base import Scheme, Terms, register

Array = jax.Array


def t5_bucket(relative_position: Array, bidirectional: bool, num_buckets: int, horizon: int) -> Array:
  """T5's bucket of ``key - query``: exact below ``num_buckets/2`` (per side), log-spaced up to ``horizon``, from
  which on all distances share the last bucket (a bucket range, not a clipping distance)."""
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
      / math.log(horizon / max_exact) * (n - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, n - 1)
  return ret + jnp.where(is_small, rp, large)


@register("t5")
class T5Bias(Scheme):
  """Raffel et al. (2020): one learned scalar per (bucketed relative distance, head), shared by the layers."""

  @dataclasses.dataclass(frozen=True)
  class Options:
    num_buckets: int = 32  # buckets (both directions together unless causal); T5: 32
    horizon: int = 128  # distances from here on share the last bucket; T5: 128

    def check(self, head_dim: Optional[int] = None) -> None:
      if self.num_buckets < 2:
        raise ValueError(f"t5 option num_buckets = {self.num_buckets} is not allowed; allowed: an int >= 2")
      if self.horizon < self.num_buckets:
        raise ValueError(f"t5 option horizon = {self.horizon} is not allowed; allowed: "
                         f"an int >= num_buckets ({self.num_buckets})")

  shared_across_layers: ClassVar[bool] = True

  @nn.compact
  def terms(self, query: Array, key: Array, q_offset=0) -> Terms:
    o = self.options
    table = self.param("bias", nn.initializers.normal(0.02), (o.num_buckets, self.num_heads))

    def bias_fn(q_pos, k_pos):
      buckets = t5_bucket(k_pos[None, :] - q_pos[:, None], not self.causal, o.num_buckets, o.horizon)
      return jnp.transpose(table[buckets], (2, 0, 1))

    return Terms(query, key, bias_fn=bias_fn)
