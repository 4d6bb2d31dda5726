"""Shaw et al. (2018): relative position representations a^K and a^V, clipped at the distance k."""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import numpy as np

from rpr.attention.positions.base import Scheme, Terms, register
from rpr.attention.positions.sinusoidal import add_sinusoid
from rpr.attention.relative import Relative

Array = jax.Array
# The cap that stops a huge k before any allocation (issue 71): 2k+1 table rows. Not the model's max_length: a k
# past the longest sequence only adds rows never trained, and a committed sweep (table2_cpu) trains k = 64 there.
MAX_DISTANCE = 2 ** 16


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
      k = self.max_distance
      if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= MAX_DISTANCE:
        raise ValueError(f"shaw option max_distance = {k!r} is not allowed; allowed: an int >= 0 and <= "
                         f"{MAX_DISTANCE}")

    def table_parameters(self, num_heads: int, head_dim: int) -> int:
      """The parameters of one layer's tables: 2k + 1 rows of ``head_dim`` per term on, per head (or shared)."""
      terms = int(self.use_keys) + int(self.use_values)
      return (2 * self.max_distance + 1) * head_dim * (1 if self.share_heads else num_heads) * terms

  @classmethod
  def note(cls, options, max_length: int, where: str) -> Optional[str]:
    """A k not below ``max_length`` (distances reach ``max_length - 1`` at most) clips none, and its outer table
    rows are never trained. It is kept as given (a committed sweep, table2_cpu, trains k = 64 there); the note says
    what it does. Without tables k does nothing: no note."""
    k = options.max_distance
    if k < max_length or not (options.use_keys or options.use_values):
      return None
    return (f"Shaw's clipping distance max_distance = {k} ({where}) is not below the longest sequence, "
            f"model.max_length = {max_length}: it clips no distance, so it acts as {max_length - 1} (max_length - 1), "
            f"and {2 * (k - max_length + 1)} of the {2 * k + 1} rows of each relative table are never trained.")

  def embed(self, x: Array, offset=0) -> Array:
    return add_sinusoid(x, offset) if self.options.add_sinusoidal else x

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
    return Terms(query, key, relative=Relative(kt, vt, offset=q_offset))
