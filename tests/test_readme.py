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
