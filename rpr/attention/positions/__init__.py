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
their only defaults (Shaw's clipping distance, T5's ``num_buckets``, ...) and
their checks: :func:`parse_options` turns a mapping of them into the typed
options, checked, and :func:`make` builds the scheme module from them.
Each scheme is one file of this folder; adding one is a file holding one
``@register("name")`` subclass, plus its import here (the README's "Adding a position
scheme" walks through one).
"""

from rpr.attention.positions.base import (SCHEMES, NoOptions, Scheme, Terms, arange_from, defaults, get, make,
                                          parse_options, register)
# In the registry's order: none (base), then each scheme's file.
from rpr.attention.positions.sinusoidal import Sinusoidal, sinusoid
from rpr.attention.positions.learned import Learned
from rpr.attention.positions.shaw import Shaw
from rpr.attention.positions.t5 import T5Bias, t5_bucket
from rpr.attention.positions.rope import RoPE, rotate
from rpr.attention.positions.alibi import ALiBi, DirectionalALiBi, alibi_slopes

__all__ = ["SCHEMES", "NoOptions", "Scheme", "Terms", "arange_from", "defaults", "get", "make", "parse_options",
           "register", "Sinusoidal", "sinusoid", "Learned", "Shaw", "T5Bias", "t5_bucket", "RoPE", "rotate", "ALiBi",
           "DirectionalALiBi", "alibi_slopes"]
