"""rpr: attention with relative position representations (Shaw et al. 2018) in JAX/Flax."""

from rpr.attention import (Relative, additive_attention, causal_mask, combine_masks, dot_product_attention,
                           local_attention, padding_mask, window_mask)
from rpr.chunked import chunked_attention
from rpr.layers import MultiHeadAttention
from rpr.positions import PositionConfig, SCHEMES

__all__ = [
    "Relative", "additive_attention", "causal_mask", "combine_masks", "dot_product_attention", "local_attention",
    "padding_mask", "window_mask", "chunked_attention", "MultiHeadAttention", "PositionConfig", "SCHEMES",
]
__version__ = "0.1.0"
