"""rpr.attention.masks: a mask has one meaning (booleans, True = may attend) at every entry point."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rpr
from rpr.attention import masks

B, N, H, D = 2, 5, 2, 4
Q, K, V = jax.random.normal(jax.random.PRNGKey(0), (3, B, N, H, D))
VALID = jnp.arange(N)[None] < jnp.array([[5], [3]])  # [batch, k]: the second row has 2 padding keys
ADDITIVE = jnp.where(VALID, 0.0, -1e9)  # the other codebases' convention: 0 = attend
FULL_ADDITIVE = ADDITIVE[:, None, None, :]  # [batch, 1, 1, k]


@pytest.mark.parametrize("make", [
    lambda m: masks.Mask(key_valid=m),
    lambda m: masks.Mask(array=m[:, None, None, :]),
    lambda m: rpr.dot_product_attention(Q, K, V, mask=m[:, None, None, :]),
    lambda m: rpr.dot_product_attention(Q, K, V, mask=masks.Mask(key_valid=m)),
    lambda m: rpr.chunked_attention(Q, K, V, mask=m[:, None, None, :]),
    lambda m: rpr.chunked_attention(Q, K, V, mask=masks.Mask(key_valid=m, causal=True)),
], ids=["Mask.key_valid", "Mask.array", "dense array", "dense Mask", "chunked array", "chunked Mask"])
@pytest.mark.parametrize("bad", [ADDITIVE, VALID.astype(jnp.int32), np.asarray(VALID, np.float32)],
                         ids=["additive float", "0/1 int", "0/1 numpy float"])
def test_a_non_boolean_mask_is_refused_naming_the_conversion(make, bad):
  with pytest.raises(TypeError, match=r"has dtype .*allowed: a boolean array, True = may attend.*m == 0"):
    make(bad)


def test_the_layer_refuses_a_float_key_valid():
  layer = rpr.MultiHeadAttention(num_heads=H, position="shaw", position_options={"max_distance": 2})
  x = jnp.ones((B, N, H * D))
  with pytest.raises(TypeError, match="Mask.key_valid has dtype float32"):
    layer.init(jax.random.PRNGKey(0), x, key_valid=ADDITIVE)


def test_the_boolean_mask_of_the_converted_additive_mask_is_the_same_attention():
  # What the error message advises gives the attention the additive mask means: padding keys get no weight.
  out = rpr.dot_product_attention(Q, K, V, mask=FULL_ADDITIVE == 0)
  ref = rpr.dot_product_attention(Q[1:], K[1:, :3], V[1:, :3])  # row 1 with its 2 padding keys cut off
  np.testing.assert_allclose(out[1:], ref, rtol=1e-5, atol=1e-6)
  chunked = rpr.chunked_attention(Q, K, V, mask=masks.Mask(key_valid=ADDITIVE == 0))
  np.testing.assert_allclose(chunked, out, rtol=1e-5, atol=1e-6)


def test_masks_under_jit_are_checked_at_trace_time():
  f = jax.jit(lambda m: rpr.dot_product_attention(Q, K, V, mask=masks.Mask(key_valid=m)))
  assert f(VALID).shape == (B, N, H, D)
  with pytest.raises(TypeError, match="Mask.key_valid has dtype float32"):
    f(ADDITIVE)
