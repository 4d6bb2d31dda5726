"""The linen layer from flax.nnx through ``nnx.bridge.ToNNX``: the same outputs with the same parameters, and it
trains."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import rpr


@pytest.mark.parametrize("position, options", [("shaw", {"max_distance": 2}), ("t5", {"num_buckets": 8}),
                                               ("rope", None)])
def test_the_nnx_bridge_gives_the_linen_layers_output_with_the_same_parameters(position, options):
  layer = rpr.MultiHeadAttention(num_heads=2, position=position, position_options=options, causal=True)
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
  bridged = nnx.bridge.ToNNX(layer, rngs=nnx.Rngs(0))
  nnx.bridge.lazy_init(bridged, x)
  params = nnx.state(bridged, nnx.Param).to_pure_dict()
  np.testing.assert_array_equal(np.asarray(bridged(x)), np.asarray(layer.apply({"params": params}, x)))
  other = jax.tree_util.tree_map(lambda p: p + 0.1, params)  # the comparison can fail: other parameters differ
  assert np.max(np.abs(np.asarray(bridged(x)) - np.asarray(layer.apply({"params": other}, x)))) > 1e-3


def test_the_bridged_layer_trains_with_nnx_optimizer():
  layer = rpr.MultiHeadAttention(num_heads=2, position="shaw", position_options={"max_distance": 2})
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
  model = nnx.bridge.ToNNX(layer, rngs=nnx.Rngs(0))
  nnx.bridge.lazy_init(model, x)
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - 1.0) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(5)]
  assert losses[-1] < losses[0] - 0.1, losses
  assert model.position["key_table"].shape == (2, 5, 4)  # Shaw's tables are parameters of the nnx module
