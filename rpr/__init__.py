"""rpr: attention with relative position representations (Shaw et al. 2018) in JAX/Flax.

The attention functions, masks, position schemes and the layer live in
:mod:`rpr.attention` (re-exported here); the engine around them in
:mod:`rpr.model`, :mod:`rpr.train` and :mod:`rpr.data`.
"""

import importlib

# The attention API, imported on first use (PEP 562), so that a light module such as rpr.malloc is imported
# without JAX.
_ATTENTION = ("IMPLEMENTATIONS", "SCHEMES", "Mask", "MultiHeadAttention", "Relative", "Scheme", "Terms",
              "additive_attention", "causal_mask", "chunked_attention", "combine", "dot_product_attention",
              "padding_mask", "register", "window_mask")


def __getattr__(name):
  if name in _ATTENTION:
    return getattr(importlib.import_module("rpr.attention"), name)
  raise AttributeError(f"module 'rpr' has no attribute {name!r}")


def __dir__():
  return sorted([*globals(), *_ATTENTION])


__all__ = list(_ATTENTION)
__version__ = "0.2.0"
