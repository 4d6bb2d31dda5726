"""Data flows one way: the attention package imports nothing else of rpr, and no module imports upward."""

import ast
import pathlib
import subprocess

import pytest

RPR = pathlib.Path(__file__).resolve().parents[1] / "rpr"

# Each module may import modules of a strictly lower level, and modules of its own package.
LEVELS = {
    "rpr": 0, "rpr.attention": 0, "rpr.tokens": 0, "rpr.failures": 0, "rpr.fields": 0,
    "rpr.blocks": 1, "rpr.decode": 1, "rpr.metrics": 1, "rpr.data": 1, "rpr.optim": 1, "rpr.checkpoint": 1,
    "rpr.records": 1, "rpr.sharding": 1, "rpr.plateau": 1, "rpr.model_config": 1,
    "rpr.model": 2, "rpr.workdir": 2, "rpr.writers": 2,
    "rpr.predict": 3, "rpr.config": 3, "rpr.evaluation": 3,
    "rpr.steps": 4,  # jits the step functions beside rpr.predict's decoders
    "rpr.record": 4,  # config.json: reads rpr.config's tree
    "rpr.memory": 4,  # estimates the memory of rpr.config's tree
    "rpr.assemble": 5,  # builds a run from the tree's sections
    "rpr.loop": 6,  # trains what rpr.assemble built
    "rpr.train": 7,
}


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(RPR.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def owner(name: str) -> str:
  """The LEVELS entry a module belongs to: itself, or its top package below rpr (rpr.attention.dense ->
  rpr.attention)."""
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
SIZED = ("rpr", "experiments", "configs")  # the folders the size rules hold for
# Functions over the limit that this test knows by name, with their length: each may shrink, not grow, and
# leaves the list once it is within the limit. None is left.
KNOWN_LONG: dict[str, int] = {}


def _sizes(path: pathlib.Path):
  """``(lines of the module, [(function, its lines), ...])``, nested functions and kernel loops included."""
  text = path.read_text(encoding="utf-8")
  functions = []
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      functions.append((node, node.end_lineno - first + 1))
  return text.count("\n"), functions


def test_modules_and_functions_stay_small():
  """No module of rpr/, experiments/ or configs/ over 400 lines, no function over 80 (but those KNOWN_LONG)."""
  too_long, known = [], {}
  for path in sorted(p for folder in SIZED for p in (RPR.parent / folder).rglob("*.py")):
    where = path.relative_to(RPR.parent).as_posix()
    lines, functions = _sizes(path)
    if lines > MAX_MODULE_LINES:
      too_long.append(f"{where}: {lines} lines")
    for node, length in functions:
      if f"{where}:{node.name}" in KNOWN_LONG:
        known[f"{where}:{node.name}"] = length
      elif length > MAX_FUNCTION_LINES:
        too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
  assert not too_long, too_long
  for name, limit in KNOWN_LONG.items():
    assert MAX_FUNCTION_LINES < known.get(name, 0) <= limit, (
        f"{name}: {known.get(name)} lines; KNOWN_LONG allows up to {limit} (remove it once within "
        f"{MAX_FUNCTION_LINES})")


MAX_EXPERIMENTS_LINES = 3000  # the whole of experiments/: a small library behind one command, not a framework


def test_the_experiments_folder_stays_a_small_library():
  lines = {p.relative_to(RPR.parent).as_posix(): _sizes(p)[0] for p in (RPR.parent / "experiments").rglob("*.py")}
  assert sum(lines.values()) <= MAX_EXPERIMENTS_LINES, sorted(lines.items(), key=lambda kv: -kv[1])[:5]


# experiments/: a library that any experiment, command or sweep may use, and that imports none of them (sweeps: the
# registry of the sweeps the config files declare).
EXPERIMENTS_LIBRARY = ("engine", "runs", "render", "machine", "settings", "paper", "protocol", "stats", "sweeps")


def test_the_experiments_library_imports_no_experiment_and_configs_import_no_experiments():
  for name in EXPERIMENTS_LIBRARY:
    for imported in imports(RPR.parent / "experiments" / f"{name}.py"):
      parts = imported.split(".")
      assert not (parts[0] == "experiments" and len(parts) > 1 and parts[1] not in EXPERIMENTS_LIBRARY), (
          f"experiments/{name}.py imports {imported}: the library imports no experiment or command")
  for path in sorted((RPR.parent / "configs").glob("*.py")):
    assert not [n for n in imports(path) if n.split(".")[0] == "experiments"], f"{path.name} imports experiments"


def test_the_size_check_reads_nested_functions_and_decorators(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def outer():\n  @staticmethod\n  def inner():\n" + "    x = 1\n" * 90 + "  return inner\n")
  lines, functions = _sizes(bad)
  # the decorator counts
  assert lines == 94 and {n.name: length for n, length in functions} == {"outer": 94, "inner": 92}


# ----------------------------------------------------------------------------
# The tests mirror the package: rpr/<name>.py is tested by tests/test_<name>.py, rpr/attention/<name>.py by
# tests/attention/test_<name>.py, and likewise rpr/data/ and experiments/ (experiments/bench/ included, in
# tests/experiments/). A module tested under another name has its line here.

ROOT = RPR.parent
COVERED_BY = {
    "rpr/checksums.py": "tests/test_checkpoint.py",
    "rpr/attention/dense_terms.py": "tests/attention/test_relative_fast.py",
    "rpr/attention/chunked_kernel.py": "tests/attention/test_chunked.py",
    "rpr/attention/chunked_plan.py": "tests/attention/test_chunked.py",
    "rpr/attention/reference.py": "tests/test_properties.py",
    "rpr/attention/positions/alibi.py": "tests/attention/test_positions.py",
    "rpr/attention/positions/base.py": "tests/attention/test_positions.py",
    "rpr/attention/positions/learned.py": "tests/attention/test_positions.py",
    "rpr/attention/positions/rope.py": "tests/attention/test_positions.py",
    "rpr/attention/positions/shaw.py": "tests/attention/test_positions.py",
    "rpr/attention/positions/sinusoidal.py": "tests/attention/test_positions.py",
    "rpr/attention/positions/t5.py": "tests/attention/test_positions.py",
    "rpr/blocks.py": "tests/test_model.py",
    "rpr/data/sections.py": "tests/test_config.py",
    "rpr/fields.py": "tests/test_config.py",
    "rpr/loop.py": "tests/test_train.py",
    "rpr/data/bounds.py": "tests/data/test_arithmetic.py",
    "rpr/data/corpus.py": "tests/data/test_bible.py",
    "rpr/data/lm.py": "tests/data/test_sotu.py",
    "rpr/data/sentencepiece_vocab.py": "tests/data/test_wmt.py",
    "rpr/data/task.py": "tests/data/test_arithmetic.py",
    "rpr/data/text.py": "tests/data/test_bible.py",
    "rpr/steps.py": "tests/test_train.py",
    "rpr/tokens.py": "tests/test_predict.py",
    "experiments/__main__.py": "tests/experiments/test_app.py",
    "experiments/bench/attention.py": "tests/experiments/test_bench_attention.py",
    "experiments/bench/attention_report.py": "tests/experiments/test_bench_attention.py",
    "experiments/bench/step.py": "tests/experiments/test_bench_step.py",
    "experiments/engine.py": "tests/experiments/test_sweep.py",
    "experiments/machine.py": "tests/experiments/test_bench_attention.py",
    "experiments/paper.py": "tests/experiments/test_sweep.py",
    "experiments/protocol.py": "tests/experiments/test_tables.py",
    "experiments/render.py": "tests/experiments/test_tables.py",
    "experiments/status.py": "tests/experiments/test_launch.py",
    "experiments/settings.py": "tests/experiments/test_bench_attention.py",
    "experiments/sweeps.py": "tests/experiments/test_sweep.py",
}


def mirrored(module: pathlib.Path) -> pathlib.Path:
  rel = module.relative_to(ROOT)
  folders = rel.parts[1:-1] if rel.parts[0] == "rpr" else ("experiments",)
  return pathlib.Path("tests", *folders, f"test_{module.stem}.py")


MODULES = sorted(p for p in [*RPR.rglob("*.py"), *(ROOT / "experiments").rglob("*.py")]
                 if p.name != "__init__.py" and not {"results", "data_survey"} & set(p.parts))


def test_every_module_has_its_test_file_or_a_line_saying_which_test_covers_it():
  missing = []
  for module in MODULES:
    rel, own = str(module.relative_to(ROOT)), mirrored(module)
    covering = own if (ROOT / own).is_file() else COVERED_BY.get(rel)
    if covering is None:
      missing.append(f"{rel}: no {own} and no COVERED_BY line")
    elif not (ROOT / covering).is_file() or (rel in COVERED_BY and (ROOT / own).is_file()):
      missing.append(f"{rel}: COVERED_BY names {covering}, which is missing or redundant")
    elif module.stem not in (ROOT / covering).read_text():
      missing.append(f"{rel}: {covering} never names {module.stem}")
  assert not missing, missing


# Lines are at most 120 columns: the code's 2-space indent (Google's Python style, as JAX and flax write it)
# at the width this code was written to; 80 would wrap a third of the signatures and messages here. A Markdown
# table row inside a report template cannot wrap and is exempt.
MAX_COLUMNS = 120
SOURCES = sorted(p for d in ("rpr", "experiments", "configs", "tests") for p in (ROOT / d).rglob("*.py")
                 if "results" not in p.parts) + [ROOT / "run.py"]


def test_no_line_is_wider_than_120_columns():
  wide = [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES for n, line in enumerate(p.read_text().splitlines(), 1)
          if len(line) > MAX_COLUMNS and not line.lstrip().startswith("|")]
  assert not wide, wide


def test_the_readme_layout_names_every_folder_and_module():
  """The README's Layout section is the map: every folder and every module of rpr/ has its place in it."""
  text = (ROOT / "README.md").read_text(encoding="utf-8")
  layout = text[text.index("## Layout"):text.index("Data flows one way")]
  folders = ["run.py", "rpr/attention/", "rpr/", "configs/", "experiments/", "tests/", "data/", "positions/"]
  modules = [p.name for d in (RPR, RPR / "attention") for p in d.glob("*.py") if p.name != "__init__.py"]
  data_modules = [p.stem for p in (RPR / "data").glob("*.py") if p.name != "__init__.py"]
  missing = [n for n in folders + modules + data_modules if n not in layout]
  assert not missing, f"README.md's Layout section does not name {missing}"
  tracked = {p.split("/")[0] for p in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                                     check=True).stdout.split()}
  assert not [name for name in tracked if (ROOT / name).is_dir() and not name.startswith((".", "_"))
              and f"{name}/" not in layout], "a top-level folder without its line in the Layout section"
