"""pyproject.toml's dependencies are enough for the library: in a virtual environment holding only rpr and
the distributions pyproject requires (with everything they require in turn), every light module imports
(tests/test_imports.py's list), a model takes an optax training step, and TensorFlow, TFDS and the
experiments' tools are absent.

The environment is made without a network: each distribution of that closure, as installed here, is linked
file by file into a fresh venv's site-packages (what pip would unpack), with the bytecode already written for
it, and rpr is linked from the source.
"""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.test_imports import LIGHT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABSENT = ("tensorflow", "tensorflow_datasets", "sacrebleu", "sentencepiece",
          "matplotlib", "sklearn", "clu")


def closure(requirements: list[str]) -> dict[str, importlib.metadata.Distribution]:
  """The installed distributions ``requirements`` need, transitively, with requested extras and markers."""
  found: dict[str, importlib.metadata.Distribution] = {}
  todo = [(Requirement(r), "") for r in requirements]
  seen = set()
  while todo:
    req, extra = todo.pop()
    if req.marker and not req.marker.evaluate({"extra": extra}):
      continue
    name = canonicalize_name(req.name)
    for wanted in [""] + sorted(req.extras):  # a distribution's base requirements, then its extras'
      if (name, wanted) in seen:
        continue
      seen.add((name, wanted))
      dist = found.setdefault(name, importlib.metadata.distribution(name))
      todo += [(Requirement(r), wanted) for r in dist.requires or []]
  return found


TRAIN_STEP = """
import jax, jax.numpy as jnp, optax
from rpr import model
config = model.ModelConfig(vocab_size=12, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                           num_decoder_layers=1, max_length=16, deterministic=True).validate()
net = model.build(config)
x = jnp.ones((2, 6), jnp.int32)
params = jax.jit(net.init)(jax.random.PRNGKey(0), x, x)
opt = optax.adam(1e-2)
def loss(p):
  logits = net.apply(p, x, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, x).mean()
@jax.jit
def step(p):
  value, grads = jax.value_and_grad(loss)(p)
  updates, _ = opt.update(grads, opt.init(p), p)
  return value, optax.apply_updates(p, updates)
value, params = step(params)
after, _ = step(params)
assert after < value, (value, after)
import importlib.util, sys
print("absent:", [m for m in ABSENT if importlib.util.find_spec(m) is not None])
"""


def test_the_library_runs_in_a_venv_with_pyproject_dependencies_only(tmp_path):
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    dependencies = tomllib.load(f)["project"]["dependencies"]
  dists = closure(dependencies)
  assert {"jax", "jaxlib", "flax", "optax", "orbax-checkpoint"} <= set(dists)
  assert not {"tensorflow", "tensorflow-datasets", "sacrebleu", "clu"} & set(dists)
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = venv / "bin" / "python"
  site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        capture_output=True, text=True, check=True).stdout.strip()
  for dist in dists.values():
    for file in dist.files or []:
      if file.parts[0] == "..":  # scripts, outside site-packages
        continue
      target = os.path.join(site, file)
      os.makedirs(os.path.dirname(target), exist_ok=True)
      if not os.path.lexists(target):
        os.symlink(dist.locate_file(file), target)
      # The bytecode this interpreter wrote for the source, linked beside it: it stays valid (the link has the
      # source's mtime and size), so the venv does not compile 924 files again (importing jax, flax, optax and
      # orbax there took 15.0 s unlinked, 5.6 s linked, measured beside two training runs).
      if file.suffix == ".py":
        bytecode, linked = (importlib.util.cache_from_source(str(f)) for f in (dist.locate_file(file), target))
        if os.path.exists(bytecode) and not os.path.lexists(linked):
          os.makedirs(os.path.dirname(linked), exist_ok=True)
          os.symlink(bytecode, linked)
  os.symlink(os.path.join(ROOT, "rpr"), os.path.join(site, "rpr"))
  code = f"import {', '.join(LIGHT)}\nABSENT = {ABSENT!r}\n{TRAIN_STEP}"
  out = subprocess.run([python, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.splitlines()[-1] == "absent: []", out.stdout
