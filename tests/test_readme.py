"""The README's API tour must stay runnable and print what it claims."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tour_runs_and_prints_the_registry():
  text = README.read_text()
  block = re.search(r"## A short tour.*?```python\n(.*?)```", text, re.S).group(1)
  claimed = re.search(r"print\(sorted\(positions.SCHEMES\)\)\s*#\s*(\[.*\])", block).group(1)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(block, str(README), "exec"), {})
  assert out.getvalue().strip() == claimed


def test_readme_scheme_example_registers_a_scheme_that_a_layer_runs():
  import jax
  import jax.numpy as jnp

  from rpr.attention import MultiHeadAttention, positions

  text = README.read_text()
  block = re.search(r"## Adding a position scheme.*?```python\n(.*?)```", text, re.S).group(1)
  assert "clipped_bias" not in positions.SCHEMES
  try:
    exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})
    assert positions.defaults("clipped_bias") == {"radius": 4}
    layer = MultiHeadAttention(num_heads=2, position="clipped_bias", position_options={"radius": 2})
    x = jnp.ones((1, 5, 8))
    params = layer.init(jax.random.PRNGKey(0), x)
    assert params["params"]["position"]["bias"].shape == (5, 2)
    assert layer.apply(params, x).shape == (1, 5, 8)
  finally:
    positions.SCHEMES.pop("clipped_bias", None)


def test_readme_nnx_example_trains():
  text = README.read_text()
  block = re.search(r"## From flax.nnx.*?```python\n(.*?)```", text, re.S).group(1)
  scope = {"__name__": "readme_nnx"}
  exec(compile(block, str(README), "exec"), scope)
  losses = scope["losses"]
  assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses


def test_readme_python_use_examples_run():
  import jax
  import numpy as np

  text = README.read_text()
  section = re.search(r"### Using the layer and the models from Python\n(.*?)\n## ", text, re.S).group(1)
  linen, bridged, models = (dict(__name__="readme_python_use") for _ in range(3))
  blocks = re.findall(r"```python\n(.*?)```", section, re.S)
  assert len(blocks) == 3, len(blocks)
  for block, scope in zip(blocks, (linen, bridged, models)):
    exec(compile(block, str(README), "exec"), scope)
  # flax.linen: the causal Shaw layer with k = 16 (2k + 1 rows per head), and its output.
  assert linen["params"]["params"]["attention"]["position"]["key_table"].shape == (4, 33, 8)
  assert linen["y"].shape == (2, 10, 32) and np.all(np.isfinite(np.asarray(linen["y"])))
  # flax.nnx: the bridged layer gives the linen layer's output with the same parameters.
  layer, params, x = bridged["layer"], bridged["params"], bridged["x"]
  np.testing.assert_array_equal(np.asarray(bridged["y"]), np.asarray(layer.apply({"params": params}, x)))
  assert params["position"]["key_table"].shape == (4, 33, 8)
  # The models: teacher-forced logits over the vocabulary, the language model's with sinusoids at its embeddings.
  assert models["logits"].shape == models["lm_logits"].shape == (2, 9, 16)
  assert np.all(np.isfinite(np.asarray(models["logits"]))) and np.all(np.isfinite(np.asarray(models["lm_logits"])))
  assert "encoder" in models["params"]["params"] and "encoder" not in models["lm_params"]["params"]
  assert jax.tree_util.tree_structure(models["params"]) != jax.tree_util.tree_structure(models["lm_params"])
