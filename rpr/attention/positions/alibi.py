"""ALiBi (Press et al. 2022): a linear bias in the distance, symmetric or with a halved slope to the right."""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from rpr.attention.positions.base import Scheme, Terms, register

Array = jax.Array


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
