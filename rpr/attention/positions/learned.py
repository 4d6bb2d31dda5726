"""Absolute learned position embeddings, one row per position, added to the token embeddings."""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention.positions.base import Scheme, register

Array = jax.Array


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
