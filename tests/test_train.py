"""rpr.train end to end on the tiny config: outputs, exact resume, SIGTERM, NaN stop, data parallelism, bad configs."""

import dataclasses
import importlib
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from rpr import data
from rpr import record
from rpr import steps
from rpr import train
from rpr.config import ConfigError, parse
from rpr.records import read_jsonl
from rpr.data import synthetic

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent


def _env(cache_dir, devices=None):
  """Environment of a subprocess: same compilation cache, optionally forced host device count."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache_dir,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  if devices:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
  return env


def tiny_config(**overrides):
  """configs/tiny.py with ``overrides`` (``model`` keys: ``model={"d_model": 16}``)."""
  from configs import tiny

  config = tiny.get_config()
  config.lock()  # a misspelt key fails instead of being added
  model = overrides.pop("model", {})
  config.update(overrides)
  config.model.update(model)
  return config


def validate(config, num_devices=1, workdir=None, allow_changes=(), quiet=True, trust_checkpoints=False):
  """A ConfigDict through the boundary as run.py takes it: :func:`rpr.config.parse`, then the workdir's rules."""
  tree = parse(config, num_devices)
  if workdir is not None:
    record.check_resume(tree, workdir, allow_changes, quiet, trust_checkpoints)
  return tree


def train_run(config, workdir, **kwargs):
  """``train_and_evaluate`` of a ConfigDict parsed at the boundary, as run.py and the sweep runner do."""
  return train.train_and_evaluate(parse(config), workdir, **kwargs)


def load_state(workdir, step) -> dict:
  """The saved TrainState of ``step`` as a flat dict of numpy arrays, whatever device layout saved it."""
  path = str(pathlib.Path(workdir) / "checkpoints" / str(step) / "default")
  checkpointer = ocp.StandardCheckpointer()
  meta = checkpointer.metadata(path).item_metadata
  here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                                  getattr(meta, "tree", meta))
  tree = checkpointer.restore(path, target)
  return {jax.tree_util.keystr(path): np.asarray(v) for path, v in jax.tree_util.tree_leaves_with_path(tree)}


def timeless_records(path) -> list[dict]:
  """The records of a metrics.jsonl without the step rate, the one value two equal runs may differ in."""
  return [{k: v for k, v in r.items() if k != "train/steps_per_sec"} for r in read_jsonl(path)]


# Short runs without evaluation, so that each test compiles only the train step.
FAST = dict(num_train_steps=8, eval_splits=(), log_every_steps=2, checkpoint_every_steps=100,
            model={"dropout_rate": 0.1})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """The tiny config trained once, evaluated on "valid" at each evaluation and on "long" at the last step only: its
  workdir and final metrics. Three tests read it: what it wrote and learnt, when each split was scored, and its
  float32 loss curve beside bfloat16's."""
  workdir = tmp_path_factory.mktemp("tiny") / "run"
  return workdir, train_run(tiny_config(eval_splits=("valid",), final_eval_splits=("long",)), str(workdir))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  """FAST trained straight to step 8, saving every 2 steps and keeping the last 2: the state that the resumed runs
  below must reach, bit for bit."""
  workdir = tmp_path_factory.mktemp("straight") / "run"
  train_run(tiny_config(**{**FAST, "checkpoint_every_steps": 2, "keep_checkpoints": 2}), str(workdir))
  return workdir


def test_tiny_run_writes_the_workdir_and_learns(tiny_run):
  workdir, results = tiny_run
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["config"]["dataset"] == "copy" and saved["model_config"]["d_model"] == 32
  records = read_jsonl(workdir / "metrics.jsonl")
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert len(losses) == 4 and losses[-1] < losses[0] - 0.4, losses
  evals = [r for r in records if "valid/exact_match" in r]
  assert [r["step"] for r in evals] == [20, 40]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["20", "40"]
  assert list(workdir.glob("events.out.tfevents.*"))
  assert results["step"] == 40
  assert results["valid/accuracy"] > 0.2  # chance is 1/13
  assert 0.0 <= results["valid/exact_match"] <= 1.0


class _SigtermAt:
  """The copy task, but fetching the batch of ``step`` sends this process SIGTERM (a preemption)."""

  def __init__(self, config, step):
    self._task, self._step = synthetic.from_config("copy", config), step
    self.vocab, self.is_text = self._task.vocab, self._task.is_text

  def train_rows(self, step):
    return self._task.train_rows(step)

  def train_batch(self, step, rows=slice(None)):
    if step == self._step:
      os.kill(os.getpid(), signal.SIGTERM)
    return self._task.train_batch(step, rows)

  def eval_batches(self, split):
    return self._task.eval_batches(split)


def test_sigterm_saves_and_the_resumed_run_equals_a_straight_run(straight, tmp_path, monkeypatch):
  resumed = tmp_path / "resumed"
  handler = signal.getsignal(signal.SIGTERM)
  with monkeypatch.context() as m:  # the same config: "copy" is the task that sends SIGTERM, this once
    m.setitem(data.REGISTRY, "copy", data.Entry(lambda c: _SigtermAt(c, step=3)))
    out = train_run(tiny_config(**FAST), str(resumed))
  assert out["stopped_by_signal"] == 1.0 and out["step"] == 4  # step 3 finishes, then save and stop
  assert sorted(os.listdir(resumed / "checkpoints")) == ["4"]
  assert signal.getsignal(signal.SIGTERM) == handler  # the run's handler is removed again

  out = train_run(tiny_config(**FAST), str(resumed))
  assert out["step"] == 8
  a, b = load_state(straight, 8), load_state(resumed, 8)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # bitwise: same batches, same dropout keys
  steps = [r["step"] for r in read_jsonl(resumed / "metrics.jsonl")]
  assert steps == [2, 4, 6, 8]  # the metrics file continues where the stopped run left it


def test_resume_by_raising_num_train_steps_is_exact_and_old_checkpoints_go(straight, tmp_path):
  resumed = tmp_path / "resumed"
  assert sorted(os.listdir(straight / "checkpoints")) == ["6", "8"]  # 2 and 4 deleted: keep the last 2
  train_run(tiny_config(**{**FAST, "num_train_steps": 4}), str(resumed))
  train_run(tiny_config(**FAST), str(resumed))
  a, b = load_state(straight, 8), load_state(resumed, 8)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  train_run(tiny_config(**{**FAST, "num_train_steps": 4}), str(workdir))
  good = load_state(workdir, 4)
  bad = tiny_config(**FAST, learning_rate=1e39)  # inf in float32: the first update makes the parameters inf/nan
  with pytest.raises(train.NonFiniteError, match=r"non-finite training state at step 5.*checkpoint \(step 4\)"):
    train_run(bad, str(workdir), allow_config_change=("learning_rate",))
  assert sorted(os.listdir(workdir / "checkpoints")) == ["4"]
  for k, v in load_state(workdir, 4).items():
    np.testing.assert_array_equal(v, good[k])


_DP_SCRIPT = """
import sys, numpy as np, jax
sys.path.insert(0, {tests!r})
from tests import test_train
np.savez({out!r}, devices=jax.device_count(), **test_train.run_steps(3))
"""


def run_steps(num_steps):
  """``num_steps`` train steps of the tiny config (dropout on) on every device; flat parameters. Jitted as rpr.train
  jits FAST's steps (the same model, batch and donated state), so that on one device they are programs a test
  session has compiled already."""
  import functools
  from jax.sharding import NamedSharding, PartitionSpec as P
  from rpr import model as model_lib
  from rpr import optim

  config = tiny_config(model={"dropout_rate": 0.1})
  mesh = train.make_mesh()
  task = data.get_task(config)
  model = model_lib.Transformer(parse(config).model.replace(vocab_size=task.vocab.size))
  tx, schedule = optim.make_optimizer(parse(config).optim, model.config.d_model, config.num_train_steps)
  first = task.train_batch(0)
  rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  state = jax.jit(functools.partial(train.init_state, model=model, tx=tx, input_length=first["inputs"].shape[1],
                                    target_length=first["targets"].shape[1]), out_shardings=rep)(jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(train.train_step, model=model, tx=tx, schedule=schedule, label_smoothing=0.1),
                 in_shardings=(rep, rows), out_shardings=(rep, rep), donate_argnums=0)
  for s in range(num_steps):
    batch = train.shard_batch(task.train_batch(s), mesh)
    assert len(batch["inputs"].sharding.device_set) == mesh.size
    state, _ = step(state, batch)
  flat = traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
  return {k: np.asarray(v) for k, v in flat.items()}


@pytest.mark.slow  # a process of its own, compiling for 4 devices
def test_data_parallel_on_4_devices_matches_1_device(tmp_path, compilation_cache):
  # XLA_FLAGS must be set before JAX starts: the 4-device run is a subprocess. The
  # 1-device run is this process when it has one device, else a subprocess too.
  runs = {4: None}
  if jax.device_count() != 1:
    runs[1] = None
  for n in runs:
    code = _DP_SCRIPT.format(tests=str(TESTS), out=str(tmp_path / f"{n}.npz"))
    runs[n] = subprocess.Popen([sys.executable, "-c", code], env=_env(compilation_cache, devices=n), cwd=ROOT,
                               stderr=subprocess.PIPE, text=True)
  results = {}
  if 1 not in runs:
    results[1] = run_steps(3)
  for n, p in runs.items():
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    with np.load(tmp_path / f"{n}.npz") as f:
      assert int(f["devices"]) == n
      results[n] = {k: f[k] for k in f.files if k != "devices"}
  one, four = results[1], results[4]
  assert one and sorted(one) == sorted(four)
  for k in one:
    np.testing.assert_allclose(one[k], four[k], rtol=1e-5, atol=1e-6, err_msg=k)


BAD_CONFIGS = [
    (dict(model={"position": "absolute"}), r"config.model.position = 'absolute'.*allowed: \[.*'shaw'"),
    (dict(model={"cross_position": "sinusoidal"}), r"config.model.cross_position.*allowed"),
    (dict(model={"num_heads": 3}), r"config.model.num_heads = 3.*allowed: a divisor of d_model = 32"),
    (dict(model={"shaw": {"max_distance": -1}}),
     r"config.model.shaw: shaw option max_distance = -1 is not allowed; allowed: an int >= 0 and <= 65536"),
    (dict(dataset="wmt99"), r"config.dataset: unknown data set 'wmt99'; allowed: \[.*'copy'"),
    (dict(dataset=""), r"config.dataset: unknown data set ''"),
    (dict(eval_splits=("test",)), r"config.eval_splits.*allowed: names from \['valid', 'long'\]"),
    (dict(optimizer="sgd"), r"config.optimizer = 'sgd'.*allowed: \['adam', 'adamw'\]"),
    (dict(schedule="linear"), r"config.schedule = 'linear'.*allowed: \['vaswani', 'rsqrt', 'constant', 'cosine'\]"),
    (dict(decode_method="sample"), r"config.decode_method.*allowed: \['greedy', 'beam'\]"),
    (dict(learning_rate=-1.0), r"config.learning_rate = -1.0.*allowed: a number > 0"),
    (dict(label_smoothing=1.0), r"config.label_smoothing"),
    (dict(batch_size=0), r"config.batch_size = 0.*allowed: an int >= 1"),
    (dict(model={"dtype": "float16"}), r"config.model.dtype.*allowed: \['float32', 'bfloat16'\]"),
    (dict(model={"attention_implementation": "flash"}),
     r"config.model.attention_implementation = 'flash'.*allowed: \['chunked', 'dense'\]"),
]


@pytest.mark.parametrize("overrides, message", BAD_CONFIGS, ids=[repr(o) for o, _ in BAD_CONFIGS])
def test_bad_config_fails_before_any_work_naming_the_key(tmp_path, overrides, message):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    train_run(tiny_config(**dict(overrides)), str(workdir))
  assert not workdir.exists()  # nothing was built or written


def test_missing_dataset_key_and_batch_not_divisible_by_devices():
  config = tiny_config()
  with config.unlocked():
    del config["dataset"]
  with pytest.raises(ValueError, match=r"config.dataset: unknown data set None"):
    validate(config, num_devices=1)
  with pytest.raises(ValueError, match=r"config.batch_size = 6 must be divisible by the number of devices \(4\)"):
    validate(tiny_config(batch_size=6), num_devices=4)
  with pytest.raises(ValueError, match=r"config.eval_batch_size = 16 must be divisible .* \(3\)"):
    validate(tiny_config(batch_size=6), num_devices=3)


def test_every_config_file_validates_and_run_py_trains_with_overrides(tmp_path, caplog, run_py_here):
  for path in sorted((ROOT / "configs").glob("*.py")):
    if path.stem in ("__init__", "base", "sweeps"):  # base.py: defaults; sweeps.py: sweeps' building blocks
      continue
    module = importlib.import_module("configs." + path.stem)
    validate(module.get_config(), num_devices=1)
  # run.py in this process (conftest.py's run_py_here: its flag parser and main), which has imported TensorFlow for
  # the events already (run.py's own processes train in tests/test_workdir.py, tests/test_stop.py and others), with
  # --verbosity=0: its log at INFO, as a run.py process writes it to stderr. The overrides make FAST, which the tests
  # above trained.
  workdir = tmp_path / "cli"
  with caplog.at_level(logging.INFO):
    proc = run_py_here(["--config=configs/tiny.py", f"--workdir={workdir}",
                                          "--config.num_train_steps=8", "--config.eval_splits=()",
                                          "--config.model.dropout_rate=0.1", "--config.log_every_steps=1",
                                          "--verbosity=0"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model_config"]["dropout_rate"] == 0.1 and saved["config"]["num_train_steps"] == 8
  assert any(r.getMessage().startswith("step 8/8: loss") for r in caplog.records)
  assert list(workdir.glob("events.out.tfevents.*"))  # config.tensorboard is on by default


def test_a_newly_registered_scheme_trains_through_the_engine(tmp_path):
  """A scheme is its own class plus a registry entry: the config, the model and the loop pick it up by name."""
  import flax.linen as nn
  import jax.numpy as jnp
  from rpr.attention import positions

  @positions.register("toy_clipped_bias")
  class ToyClippedBias(positions.Scheme):
    @dataclasses.dataclass(frozen=True)
    class Options:
      toy_radius: int = 2  # an option of its own

      def check(self, head_dim=None):
        pass

    @nn.compact
    def terms(self, query, key, q_offset=0):
      r = self.options.toy_radius
      table = self.param("bias", nn.initializers.normal(0.1), (2 * r + 1, self.num_heads))

      def bias_fn(q_pos, k_pos):
        d = jnp.clip(k_pos[None, :] - q_pos[:, None], -r, r) + r
        return jnp.transpose(table[d], (2, 0, 1))

      return positions.Terms(query, key, bias_fn=bias_fn)

  try:
    config = tiny_config(num_train_steps=3, eval_splits=(), log_every_steps=1,
                         model={"position": "toy_clipped_bias", "attention_implementation": "chunked"})
    assert config.model.toy_clipped_bias.toy_radius == 2  # the base config lists the new scheme's options
    config.model.toy_clipped_bias.toy_radius = 3
    out = train_run(config, str(tmp_path / "run"))
    assert out["step"] == 3 and np.isfinite(out["train/loss"])
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model_config"]["position_options"]["toy_radius"] == 3
    state = load_state(tmp_path / "run", 3)
    assert state["['params']['encoder']['layer_0']['self_attention']['position']['bias']"].shape == (7, 2)
  finally:
    del positions.SCHEMES["toy_clipped_bias"]


@pytest.mark.parametrize("args, message", [
    (["--config.train.steps=50"], r"the config has no key 'train'.*--print_config"),
    (["--config.num_train_steps=abc"], r"--config.num_train_steps=abc: invalid literal"),
    (["--config=configs/arithmetic.py:pe=bogus"], r"pe='bogus' is not allowed; allowed: one of \['alibi'"),
    (["--workdir={file}"], r"--workdir '.*' is a file; allowed: a directory"),
    (["--process_id=1", "--heartbeat_seconds=3"], r"--process_id=1, --heartbeat_seconds=3: act only with --multihost$"),
    (["--multihost", "--heartbeat_seconds=0"], r"--heartbeat_seconds=0: 0 is not a positive integer"),
])
def test_user_errors_are_one_line_with_exit_status_2(tmp_path, args, message, run_py_here):
  # In this process (conftest.py's run_py_here): run.py's flag parser and main, each case twice; the same through
  # run.py's own processes below.
  file = tmp_path / "a_file"
  file.write_text("")
  argv = ["--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}"] + [a.format(file=file) for a in args]
  proc = run_py_here(argv)
  lines = [l for l in proc.stderr.splitlines() if l.startswith("run.py: error:")]
  assert proc.returncode == 2 and len(lines) == 1 and re.search(message, lines[0]), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  debug = run_py_here(argv + ["--debug"])
  assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_a_user_error_of_a_run_py_process_is_one_line_and_with_debug_a_traceback(tmp_path):
  # One case of the test above through run.py's own processes, side by side: a ValueError raised by the config
  # file (a variant word), which config_flags wraps with the file's traceback.
  cmd = [sys.executable, "run.py", "--config=configs/arithmetic.py:pe=bogus", f"--workdir={tmp_path / 'run'}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
           for c in (cmd, cmd + ["--debug"])]
  (_, err), (_, debug) = [p.communicate(timeout=300) for p in procs]
  lines = [l for l in err.splitlines() if l.startswith("run.py: error:")]
  assert procs[0].returncode == 2 and len(lines) == 1, err[-2000:]
  assert re.search(r"pe='bogus' is not allowed; allowed: one of \['alibi'", lines[0]), lines[0]
  assert "Traceback" not in err and not (tmp_path / "run").exists()
  assert procs[1].returncode != 0 and "Traceback" in debug


def test_final_eval_splits_are_scored_at_the_last_step_only(tiny_run):
  workdir, _ = tiny_run  # "valid" every 20 steps, "long" at the last step
  evaluated = {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    r = json.loads(line)
    evaluated.setdefault(r["step"], set()).update(k.split("/")[0] for k in r if k.endswith("/loss"))
  assert evaluated[20] == {"train", "valid"} and evaluated[40] == {"train", "valid", "long"}
  with pytest.raises(ConfigError, match="final_eval_splits"):
    validate(tiny_config(eval_splits=("valid",), final_eval_splits=("valid",)), num_devices=1)


def test_bfloat16_trains_within_two_percent_of_float32(tiny_run, tmp_path):
  """model.dtype = bfloat16 (float32 parameters, bfloat16 computation, float32 softmax and losses) on the tiny
  config: the training loss stays within 2% of float32's at every logged step (measured: at most 0.6% over 48
  steps), the parameters stay float32, and the curves are not the same numbers (bfloat16 did compute). The float32
  run is the tiny run (its evaluations change nothing it trains); the bfloat16 run differs from it in the dtype only,
  and leaves out the evaluations."""
  workdirs = {"float32": tiny_run[0], "bfloat16": tmp_path / "bfloat16"}
  train_run(tiny_config(eval_splits=(), model={"dtype": "bfloat16"}), str(workdirs["bfloat16"]))
  curves = {}
  for dtype, workdir in workdirs.items():
    curves[dtype] = np.array([r["train/loss"] for r in read_jsonl(workdir / "metrics.jsonl") if "train/loss" in r])
    assert {v.dtype for k, v in load_state(workdir, 40).items() if "params" in k} == {np.dtype("float32")}
  assert len(curves["float32"]) == 4  # steps 10, 20, 30 and 40
  np.testing.assert_allclose(curves["bfloat16"], curves["float32"], rtol=0.02)
  assert not np.array_equal(curves["bfloat16"], curves["float32"])


def test_a_second_run_of_the_same_config_in_one_process_reuses_its_compiled_programs(tmp_path):
  # rpr.steps.programs is keyed by everything its programs depend on; the seed is the init program's argument.
  steps.programs.cache_clear()
  first = train_run(tiny_config(**FAST), str(tmp_path / "a"))
  other_seed = train_run(tiny_config(**dict(FAST, seed=1)), str(tmp_path / "b"))
  assert steps.programs.cache_info()[:2] == (1, 1)  # (hits, misses): built once, reused once
  assert other_seed["train/loss"] != first["train/loss"]  # the seed still acts
  train_run(tiny_config(**dict(FAST, model={"d_model": 16})), str(tmp_path / "c"))
  assert steps.programs.cache_info()[:2] == (1, 2)  # another model: built anew
