"""Prose names only what exists: every module, function or file that a docstring, comment or string in the
code names (``rpr.data.fetch.fetch``, ``experiments/report.py``, ``tests/test_train.py``) is there."""

import ast
import functools
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("rpr", "experiments", "configs", "tests")
SOURCES = sorted(p for d in PACKAGES for p in (ROOT / d).rglob("*.py") if p.name != "test_references.py")
SOURCES.append(ROOT / "run.py")
MADE_UP = re.compile(r"nope|no_such")  # names tests make up to be missing

PATH = re.compile(r"(?<![\w/.~-])((?:rpr|experiments|configs|tests)/[\w/.=-]*\w|run\.py)")
DOTTED = re.compile(r"(?<![\w.])((?:rpr|experiments|configs)(?:\.\w+)+)")


def prose(path: pathlib.Path) -> list[tuple[int, str]]:
  """``(line, text)`` of every comment and string token of a source file."""
  with open(path, "rb") as f:
    tokens = tokenize.tokenize(f.readline)
    return [(t.start[0], t.string) for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)]


@functools.cache
def top_level_names(module_path: pathlib.Path) -> dict[str, ast.AST]:
  """Names a module defines or imports at its top level (and, under a class's name, the class node)."""
  tree = ast.parse(module_path.read_text())
  names: dict[str, ast.AST] = {}
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names[node.name] = node
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        for n in ast.walk(target):
          if isinstance(n, ast.Name):
            names[n.id] = node
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      for a in node.names:
        names[(a.asname or a.name).split(".")[0]] = node
    elif isinstance(node, (ast.If, ast.Try)):
      for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
          names[sub.name] = sub
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
          for a in sub.names:
            names[(a.asname or a.name).split(".")[0]] = sub
  return names


def resolves(dotted: str) -> bool:
  """Whether ``a.b.c`` is a module of the repository, or a module followed by names it defines."""
  parts = dotted.split(".")
  for n in range(len(parts), 0, -1):
    base = ROOT.joinpath(*parts[:n])
    module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if module.is_file():
      rest = parts[n:]
      if not rest:
        return True
      node = top_level_names(module).get(rest[0])
      if node is None:
        return base.is_dir() and ROOT.joinpath(*parts[:n + 1]).with_suffix(".py").is_file()
      if len(rest) == 1 or isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
        return True  # attributes of imported or assigned objects are not followed
      if isinstance(node, ast.ClassDef):
        members = {getattr(m, "name", None) for m in node.body} | {
            t.id for m in node.body if isinstance(m, (ast.Assign, ast.AnnAssign))
            for t in ast.walk(m.targets[0] if isinstance(m, ast.Assign) else m.target) if isinstance(t, ast.Name)}
        return rest[1] in members
      return False
  return False


def references(path: pathlib.Path) -> list[tuple[int, str, bool]]:
  """``(line, name, exists)`` of every path and dotted name the file's prose mentions."""
  out = []
  for line, text in prose(path):
    for m in PATH.finditer(text):
      name = m.group(1).rstrip(".")
      placeholder = text[m.end():m.end() + 1] in ("<", "{", "*")  # tests/test_<name>.py: a pattern, not a file
      if placeholder or any(c in name for c in "*{}<>") or name.endswith("/") or MADE_UP.search(name):
        continue
      out.append((line, name, (ROOT / name).exists() or (ROOT / name.split("::")[0]).exists()))
    for m in DOTTED.finditer(text):
      name = m.group(1)
      if not MADE_UP.search(name):
        out.append((line, name, resolves(name)))
  return out


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_prose_names_only_what_exists(path):
  missing = [f"line {line}: {name}" for line, name, ok in references(path) if not ok]
  assert not missing, f"{path.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_check_catches_a_missing_module_function_and_file(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text('"""See rpr.data.fetch.unwritten_function and rpr.unwritten_module."""\n'
                 "# as experiments/unwritten_script.py does; rpr.data.fetch.fetch and rpr/data/fetch.py exist\n")
  found = {name: ok for _, name, ok in references(bad)}
  assert found == {"rpr.data.fetch.unwritten_function": False, "rpr.unwritten_module": False,
                   "experiments/unwritten_script.py": False, "rpr.data.fetch.fetch": True, "rpr/data/fetch.py": True}
