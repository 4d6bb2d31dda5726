"""Attention with relative position representations (Shaw et al. 2018): the one folder to open.

Nothing here imports the rest of ``rpr``. From the equations to the layer:

* :mod:`~rpr.attention.dense`: :func:`dot_product_attention`, the function
  the model runs (its docstring quotes Shaw's equations 3-5), and
  :func:`additive_attention`;
* :mod:`~rpr.attention.relative`: Shaw's clipped a^K and a^V terms as two
  linear maps over the logits (:class:`Relative`);
* :mod:`~rpr.attention.masks`: :class:`Mask`, key validity + causal + window,
  read by both implementations;
* :mod:`~rpr.attention.chunked`: :func:`chunked_attention`, the same
  attention in memory linear in the lengths;
* :mod:`~rpr.attention.positions`: the position-scheme registry (none,
  sinusoidal, learned, shaw, t5, rope, alibi, alibi_directional);
* :mod:`~rpr.attention.layer`: :class:`MultiHeadAttention`, a scheme and an
  implementation picked by name;
* :mod:`~rpr.attention.reference`: the float64 oracle the tests hold the rest to.
"""

from rpr.attention.chunked import chunked_attention
from rpr.attention.dense import additive_attention, dot_product_attention
from rpr.attention.layer import IMPLEMENTATIONS, MultiHeadAttention
from rpr.attention.masks import Mask, causal_mask, combine, padding_mask, window_mask
from rpr.attention.positions import SCHEMES, Scheme, Terms, register
from rpr.attention.relative import Relative

__all__ = [
    "chunked_attention", "additive_attention", "dot_product_attention", "IMPLEMENTATIONS", "MultiHeadAttention",
    "Mask", "causal_mask", "combine", "padding_mask", "window_mask", "SCHEMES", "Scheme", "Terms", "register",
    "Relative",
]
