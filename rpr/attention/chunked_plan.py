"""Which key blocks each query block of :mod:`rpr.attention.chunked` visits, and how.

A :class:`Plan` is static: built once per call from the block sizes, the mask's
causal and window parts and Shaw's terms (their clipping distance, and their
offset when it is a Python int). For query block ``I``
(rows ``q0 = I * block_q ..``) it yields :class:`Visit` ranges of key blocks,
each with one *case* that tells the kernel how Shaw's terms look on those
tiles:

* :data:`PLAIN`: no Shaw terms;
* :data:`LEFT` / :data:`RIGHT`: every distance ``j - i - offset`` is
  ``<= -k`` / ``>= k``, so the tile holds one bucket (``0`` / ``2k``) and
  Shaw's terms are per-row constants;
* :data:`BAND`: the band ``|j - i - offset| < k`` crosses the tile, which
  needs the exact maps of :mod:`rpr.attention.relative`;
* a :class:`Corner`: an edge tile except for a small static box that the
  band crosses (square blocks and a static Shaw offset, :func:`band_plan`).

The ranges are affine in ``I`` and the offsets, evaluated when the kernel
runs, so a traced ``q_offset`` or Shaw offset (cached decoding) skips exactly
the blocks a static one skips. Only the *cases* need a static Shaw offset:
with a traced one every band tile is :data:`BAND` (no corners).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Union

import jax.numpy as jnp
import numpy as np

from rpr.attention.relative import Relative

PLAIN, LEFT, RIGHT, BAND = "plain", "left", "right", "band"


class Corner(NamedTuple):
  """A key block on one ``side`` of the band except for a static box ``rows x cols`` that the band crosses.

  With square blocks and a static offset, the blocks beside a query
  block's diagonal block hold only a corner of the band (``(k-1) x (k-1)``
  when the offset is a multiple of the block). ``offset`` is the
  relative-distance offset inside the box.
  """
  side: str
  rows: slice
  cols: slice
  offset: int


Case = Union[str, Corner]


def side_of(case: Case) -> str:
  return case.side if isinstance(case, Corner) else case


def edge_index(case: Case) -> int:
  """Where an edge tile's single bucket sits: 0 (left of the band) or -1 (bucket 2k, right of it)."""
  return 0 if side_of(case) == LEFT else -1


def band_plan(block: int, max_distance: int, offset: int) -> list:
  """Which diagonals of ``block`` x ``block`` tiles Shaw's band crosses, for a static offset.

  Returns ``[(delta, side)]``: key block ``J = I + delta`` crosses query
  block ``I``'s band, and ``side`` is :data:`BAND` (the exact maps on the
  whole block) or a :class:`Corner` (when every cell outside the band's
  bounding box lies on one side and the box covers at most half the
  block). Key blocks left of the first delta hold only bucket 0; right of
  the last, only bucket 2k.
  """
  k = max_distance
  i = np.arange(block)[:, None]
  j = np.arange(block)[None, :]
  reach = (k + abs(offset)) // block + 2
  plan = []
  for delta in range(-reach, reach + 1):
    d = j - i - (offset - delta * block)  # the relative distance of each cell of block (I, I + delta)
    band = np.abs(d) < k
    if not band.any():
      continue
    rows, cols = np.nonzero(band.any(1))[0], np.nonzero(band.any(0))[0]
    box = np.zeros_like(band)
    box[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = True
    outside = d[~box]
    side = BAND
    if outside.size and 2 * box.sum() <= band.size and (np.all(outside <= -k) or np.all(outside >= k)):
      side = Corner(LEFT if outside[0] <= -k else RIGHT, slice(int(rows[0]), int(rows[-1]) + 1),
                    slice(int(cols[0]), int(cols[-1]) + 1), int(offset - delta * block + rows[0] - cols[0]))
    plan.append((delta, side))
  deltas = [delta for delta, _ in plan]
  assert deltas == list(range(deltas[0], deltas[-1] + 1)), deltas
  return plan


class Visit(NamedTuple):
  """Key blocks ``first..last`` (inclusive; none if ``last < first``) of one query block, all of one ``case``."""
  case: Case
  first: object
  last: object


@dataclasses.dataclass(frozen=True)
class Plan:
  """The static part of the block schedule; :meth:`visits` gives one query block's key blocks.

  Attributes:
    block_q, block_k: block sizes.
    k_blocks: number of key blocks (the keys padded to a multiple of ``block_k``).
    causal, window: the mask's parts that rule out whole key blocks.
    max_distance: Shaw's clipping distance k (:attr:`rpr.attention.Relative.max_distance`), or None without
      Shaw terms.
    diagonals: :func:`band_plan` when blocks are square and Shaw's offset is
      static (the training case), else None (the band's blocks are found at
      run time and all are :data:`BAND`).
  """
  block_q: int
  block_k: int
  k_blocks: int
  causal: bool = False
  window: Optional[int] = None
  max_distance: Optional[int] = None
  diagonals: Optional[tuple] = None

  @classmethod
  def make(cls, block_q: int, block_k: int, k_len: int, causal: bool = False, window: Optional[int] = None,
           relative: Optional[Relative] = None) -> "Plan":
    """The plan for these blocks, mask and Shaw terms (``relative``, checked; a Python int offset fixes the band's
    diagonals, the training case)."""
    k, diagonals = None, None
    if relative is not None and (relative.key_table is not None or relative.value_table is not None):
      k, offset = relative.max_distance, relative.static_offset
      if k and offset is not None and block_q == block_k:
        diagonals = tuple(band_plan(block_q, k, offset))
    k_blocks = -(-k_len // block_k)
    return cls(block_q, block_k, k_blocks, causal, window, k, diagonals)

  def key_range(self, q_index, q_offset):
    """First and last key block that any query of block ``q_index`` may see under the causal and window cuts.

    Queries ``q0..q0+block_q-1`` sit at positions ``q_offset + q0 ..``; the
    window lets them see keys from ``q_offset + q0 - window`` to
    ``q_offset + q0 + block_q - 1 + window``, causality none after the last
    query. ``last < first`` when no key is visible (the block's rows are empty).
    """
    p0 = q_offset + q_index * self.block_q
    p1 = p0 + self.block_q - 1
    first, last = 0, self.k_blocks - 1
    if self.window is not None:
      first = jnp.maximum((p0 - self.window) // self.block_k, 0)
      last = jnp.minimum((p1 + self.window) // self.block_k, last)
    if self.causal:
      last = jnp.minimum(p1 // self.block_k, last)
    return first, last

  def shaw_ranges(self, q_index, rel_offset) -> list:
    """``[Visit]`` over all key blocks, in order: left of the band, across it (band or corners), right of it."""
    nk = self.k_blocks
    if self.diagonals is not None:  # static diagonals J = I + delta
      first_delta, last_delta = self.diagonals[0][0], self.diagonals[-1][0]
      return ([Visit(LEFT, 0, q_index + first_delta - 1)]
              + [Visit(case, q_index + delta, q_index + delta) for delta, case in self.diagonals]
              + [Visit(RIGHT, q_index + last_delta + 1, nk - 1)])
    # Keys a..z hold the band |j - i - offset| < k of rows q0..q0+bq-1;
    # blocks before a's block see only bucket 0, blocks after z's only 2k.
    k, q0 = self.max_distance, q_index * self.block_q
    a = q0 + rel_offset - (k - 1)
    z = q0 + self.block_q - 1 + rel_offset + (k - 1)
    band_first = jnp.clip(a // self.block_k, 0, nk)
    band_last = jnp.clip(z // self.block_k, -1, nk - 1)
    return [Visit(LEFT, 0, band_first - 1), Visit(BAND, band_first, band_last),
            Visit(RIGHT, jnp.maximum(band_last + 1, band_first), nk - 1)]

  def visits(self, q_index, q_offset, rel_offset=0) -> list:
    """``[Visit]`` of query block ``q_index``: the Shaw ranges cut to :meth:`key_range`.

    The cases are static; ``first`` and ``last`` are int32 scalars, traced
    when ``q_index`` or the offsets are.
    """
    lo, hi = self.key_range(q_index, q_offset)
    if self.max_distance is None:
      return [Visit(PLAIN, lo, hi)]
    return [Visit(v.case, jnp.maximum(v.first, lo), jnp.minimum(v.last, hi))
            for v in self.shaw_ranges(q_index, rel_offset)]
