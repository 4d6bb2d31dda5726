"""rpr: attention with relative position representations (Shaw et al. 2018) in JAX/Flax.

The attention functions, masks, position schemes and the layer live in
:mod:`rpr.attention` (re-exported here); the engine around them in
:mod:`rpr.model`, :mod:`rpr.train` and :mod:`rpr.data`.
"""

from rpr.attention import (IMPLEMENTATIONS, SCHEMES, Mask, MultiHeadAttention, Relative, Scheme, Terms,
                           additive_attention, causal_mask, chunked_attention, combine, dot_product_attention,
                           padding_mask, register, window_mask)

__all__ = [
    "IMPLEMENTATIONS", "SCHEMES", "Mask", "MultiHeadAttention", "Relative", "Scheme", "Terms", "additive_attention",
    "causal_mask", "chunked_attention", "combine", "dot_product_attention", "padding_mask", "register",
    "window_mask",
]
__version__ = "0.2.0"
