"""Data flows one way: the attention package imports nothing else of rpr, and no module imports upward."""

import ast
import pathlib

import pytest

RPR = pathlib.Path(__file__).resolve().parents[1] / "rpr"

# Each module may import modules of a strictly lower level, and modules of its own package.
LEVELS = {
    "rpr": 0, "rpr.attention": 0, "rpr.tokens": 0,
    "rpr.blocks": 1, "rpr.decode": 1, "rpr.metrics": 1, "rpr.data": 1, "rpr.optim": 1, "rpr.checkpoint": 1,
    "rpr.writers": 1, "rpr.sharding": 1, "rpr.plateau": 1,
    "rpr.model": 2,
    "rpr.predict": 3, "rpr.run_config": 3, "rpr.evaluation": 3, "rpr.steps": 3,
    "rpr.train": 4,
}


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(RPR.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def owner(name: str) -> str:
  """The LEVELS entry a module belongs to: itself, or its top package below rpr (rpr.attention.dense -> rpr.attention)."""
  parts = name.split(".")
  for n in range(len(parts), 0, -1):
    if ".".join(parts[:n]) in LEVELS:
      return ".".join(parts[:n])
  raise KeyError(f"{name} has no level in tests/test_layout.py LEVELS: add it")


def imports(path: pathlib.Path) -> list[str]:
  """Every module ``path`` imports (at any depth of the file: lazy imports count too)."""
  out = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out.append(node.module)
      out += [f"{node.module}.{a.name}" for a in node.names]  # "from rpr import model" imports rpr.model
  return out


FILES = sorted(RPR.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[module_name(p) for p in FILES])
def test_no_module_imports_upward(path):
  me = owner(module_name(path))
  for name in imports(path):
    if name.split(".")[0] in ("experiments", "configs", "run"):
      pytest.fail(f"{module_name(path)} imports {name}: the library never imports what sits above it")
    if not name.startswith("rpr.") and name != "rpr":
      continue
    try:
      other = owner(name)
    except KeyError:
      continue  # "from rpr.data import arithmetic" also yields names that are not modules
    if other != me and LEVELS[other] >= LEVELS[me] and not (me == "rpr" and other == "rpr.attention"):
      pytest.fail(f"{module_name(path)} (level {LEVELS[me]}) imports {name} (level {LEVELS[other]}): upward or "
                  "sideways")


def test_attention_package_imports_nothing_else_of_rpr():
  for path in sorted((RPR / "attention").rglob("*.py")):
    for name in imports(path):
      assert not (name.startswith("rpr.") and not name.startswith("rpr.attention")), (path.name, name)


def test_the_check_fails_on_an_upward_import(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def f():\n  from rpr import train\n")
  assert "rpr.train" in imports(bad) and LEVELS[owner("rpr.train")] > LEVELS[owner("rpr.model")]


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80


def test_modules_and_functions_stay_small():
  """No module of the library over 400 lines, no function (nested ones and kernel loops included) over 80."""
  import ast

  too_long = []
  for path in sorted(RPR.rglob("*.py")):
    text = path.read_text(encoding="utf-8")
    if text.count("\n") > MAX_MODULE_LINES:
      too_long.append(f"{path.relative_to(RPR.parent)}: {text.count(chr(10))} lines")
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
          too_long.append(f"{path.relative_to(RPR.parent)}:{node.lineno} {node.name}: "
                          f"{node.end_lineno - first + 1} lines")
  assert not too_long, too_long
