"""The README's API tour must stay runnable and print what it claims."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tour_runs_and_prints_the_registry():
  text = README.read_text()
  block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
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
