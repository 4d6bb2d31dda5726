"""Resuming a workdir: checksummed checkpoints, fallback past damaged ones (never deleted), same config or a refusal."""

import functools
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
from jax.experimental import multihost_utils
import numpy as np
import pytest

from rpr import checkpoint
from rpr import checksums
from rpr import data
from rpr import provenance
from tests.test_train import ROOT, _SigtermAt, _env, load_state, tiny_config
from rpr import record as record_lib
from tests.test_train import ConfigError, validate, train_run

# Checkpoints every 2 steps, the last 2 kept; no evaluation, so each run compiles only the train step; no TensorBoard
# events, which no test here reads and whose writer imports TensorFlow (seconds of CPU).
RUN = dict(eval_splits=(), log_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=2, tensorboard=False,
           model={"dropout_rate": 0.1})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """A straight run of 8 steps, and the same run stopped by SIGTERM after step 6 (checkpoints 4 and 6) to copy and
  damage: one config, whose programs the second run and the resumed ones find compiled."""
  root = tmp_path_factory.mktemp("runs")
  train_run(tiny_config(**RUN, num_train_steps=8), str(root / "straight"))
  with pytest.MonkeyPatch.context() as m:  # fetching the batch of step 5 sends SIGTERM: step 6 is saved, then it stops
    m.setitem(data.REGISTRY, "copy", data.Entry(lambda c: _SigtermAt(c, step=5)))
    assert train_run(tiny_config(**RUN, num_train_steps=8), str(root / "six"))["step"] == 6
  return root


def copy_of_six(runs, tmp_path) -> pathlib.Path:
  workdir = tmp_path / "run"
  shutil.copytree(runs / "six", workdir)
  return workdir


def data_file(step_dir: pathlib.Path) -> pathlib.Path:
  """The largest file of a step: the parameter and optimizer arrays."""
  return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def truncate(step_dir):
  path = data_file(step_dir)
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def flip_byte(step_dir):
  path = data_file(step_dir)
  raw = bytearray(path.read_bytes())
  raw[len(raw) // 2] ^= 0x01
  path.write_bytes(bytes(raw))


def delete_metadata(step_dir):
  (step_dir / "default" / "_METADATA").unlink()


def missing_files(step_dir):  # a step directory whose data never arrived
  shutil.rmtree(data_file(step_dir).parent)


UNFINISHED = "6.orbax-checkpoint-tmp-1700000000"


def unfinished_save(step_dir):  # orbax's temporary directory of a save that was never finalised
  step_dir.rename(step_dir.parent / UNFINISHED)


def flip_byte_unchecksummed(step_dir):  # the damage nothing can see: its checksums are gone too
  (step_dir / checksums.CHECKSUMS).unlink()
  flip_byte(step_dir)


def empty_checksums(step_dir):  # a SHA256SUMS that lists nothing checks nothing
  (step_dir / checksums.CHECKSUMS).write_text("")
  flip_byte(step_dir)


def partial_checksums(step_dir):  # a file it does not list is not checked
  sums = step_dir / checksums.CHECKSUMS
  name = str(data_file(step_dir).relative_to(step_dir))
  sums.write_text("".join(l for l in sums.read_text().splitlines(keepends=True) if not l.endswith(f"  {name}\n")))
  flip_byte(step_dir)


def non_finite(step_dir):  # saved with its checksums, but NaN: not a state to train on
  ckpt = checkpoint.Checkpoints(str(step_dir.parent), every=100, keep=5)
  state = ckpt.manager.restore(6)
  state["params"] = jax.tree_util.tree_map(lambda x: np.full_like(x, np.nan), state["params"])
  shutil.rmtree(step_dir)
  ckpt.manager.reload()
  ckpt.save(6, state, force=True)
  ckpt.close()
  assert checksums.verify(str(step_dir)) is None


DAMAGE = [truncate, flip_byte, delete_metadata, missing_files, unfinished_save, flip_byte_unchecksummed,
          empty_checksums, partial_checksums, non_finite]


@functools.cache
def saved_state(workdir: pathlib.Path, step: int) -> dict:
  """load_state of a run of the runs fixture, which the tests copy but never change: read once, then shared."""
  return load_state(workdir, step)


def assert_same_state(a, b):
  a, b = saved_state(a, 8), load_state(b, 8)  # a: the straight run
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # bitwise: same batches, same dropout keys


def test_every_checkpoint_has_checksums_that_verify(runs):
  for step in ("4", "6"):
    step_dir = runs / "six" / "checkpoints" / step
    assert checksums.verify(str(step_dir)) is None  # raises if it does not verify
    names = [line.split("  ", 1)[1] for line in (step_dir / checksums.CHECKSUMS).read_text().splitlines()]
    assert "_CHECKPOINT_METADATA" in names and "default/_METADATA" in names
    if shutil.which("sha256sum"):  # the format of coreutils' sha256sum
      subprocess.run(["sha256sum", "--check", "--quiet", checksums.CHECKSUMS], cwd=step_dir, check=True)


def abstract_state(workdir, step):
  """The TrainState tree of a saved step as ShapeDtypeStructs on this process's first device."""
  meta = checkpoint.ocp.StandardCheckpointer().metadata(str(workdir / "checkpoints" / str(step) / "default"))
  here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                                getattr(meta.item_metadata, "tree", meta.item_metadata))


def assert_damage_reported(damage, workdir, warnings):
  if damage is unfinished_save:  # never a step to orbax: reported, left where it is
    assert any("step 6" in w and "unfinished save" in w for w in warnings), warnings
    assert (workdir / "checkpoints" / UNFINISHED / "default").is_dir()
  else:  # reported by step and path, then moved aside, where no clean-up deletes it
    path = workdir / "checkpoints" / "6"
    assert any(w.startswith(f"Checkpoint of step 6 in {path} does not restore") for w in warnings), warnings
    assert any("resuming from step 4" in w and "step 6" in w for w in warnings), warnings
    assert (workdir / "checkpoints" / "corrupt" / "6" / "default").is_dir()


# Every kind of damage at the restore; two of them (the two ways it is reported) through a whole resumed run.
@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_newest_checkpoint_is_passed_over_for_the_previous_one_and_kept(runs, tmp_path, caplog, damage):
  workdir = copy_of_six(runs, tmp_path)
  abstract = abstract_state(workdir, 4)
  damage(workdir / "checkpoints" / "6")
  ckpt = checkpoint.Checkpoints(str(workdir / "checkpoints"), every=2, keep=2)
  try:
    with caplog.at_level(logging.WARNING):
      state = ckpt.restore(abstract)
  finally:
    ckpt.close()
  assert int(state["step"] if isinstance(state, dict) else state.step) == 4
  want = saved_state(runs / "six", 4)
  got = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(state)}
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  assert_damage_reported(damage, workdir, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING])


@pytest.mark.parametrize("damage", [truncate, unfinished_save], ids=["truncate", "unfinished_save"])
def test_a_run_resumed_past_a_damaged_checkpoint_ends_as_a_straight_run_and_saves_the_step_again(runs, tmp_path,
                                                                                                 caplog, damage):
  workdir = copy_of_six(runs, tmp_path)
  damage(workdir / "checkpoints" / "6")
  with caplog.at_level(logging.WARNING):
    out = train_run(tiny_config(**RUN, num_train_steps=8), str(workdir))
  assert out["step"] == 8
  assert_same_state(runs / "straight", workdir)
  assert_damage_reported(damage, workdir, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING])
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["6", "8"]  # keep 2


def test_a_step_another_process_found_damaged_is_passed_over_here_too(runs, tmp_path, caplog, monkeypatch):
  # Step 6 verifies here; the other process of a 2-process job (simulated: its flags in the gather) did not
  # verify it. Every process must then resume from step 4, and the run ends on the straight run's state.
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  gathered = []

  def allgather(x):  # this process's array and the other's: the same step list, but step 6 not verified
    x = np.asarray(x)
    other = x.copy()
    if len(gathered) == 1:
      other[0] = 0
    gathered.append(x.tolist())
    return np.stack([x, other])

  monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
  assert checkpoint.agreed([True, True], [6, 4]) == [False, True]
  assert gathered == [[2, 6], [1, 1]]  # the step lists are compared first
  monkeypatch.setattr(multihost_utils, "process_allgather", lambda x: np.stack([x, np.asarray(x) + 1]))
  with pytest.raises(checkpoint.CheckpointError, match="the processes see different checkpoints"):
    checkpoint.agreed([True], [6])

  monkeypatch.undo()  # the resume itself runs as one process, with the other's view of step 6
  monkeypatch.setattr(checkpoint, "agreed", lambda local, steps: [s != 6 and ok for s, ok in zip(steps, local)])
  workdir = copy_of_six(runs, tmp_path)
  with caplog.at_level(logging.WARNING):
    out = train_run(tiny_config(**RUN, num_train_steps=8), str(workdir))
  assert out["step"] == 8
  assert_same_state(runs / "straight", workdir)
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any("step 6" in w and "another process found it damaged" in w and "resuming from step 4" in w
             for w in warnings), warnings


def test_a_damaged_checkpoint_is_one_warning_line(runs, tmp_path, caplog):
  workdir = copy_of_six(runs, tmp_path)
  flip_byte_unchecksummed(workdir / "checkpoints" / "6")
  with caplog.at_level(logging.WARNING):
    train_run(tiny_config(**RUN, num_train_steps=8), str(workdir))
  about_6 = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "step 6" in r.getMessage()
             and "does not restore" in r.getMessage()]
  assert len(about_6) == 1 and "unverified: it has no SHA256SUMS" in about_6[0] and "\n" not in about_6[0], about_6


def test_restore_unverified_restores_a_step_without_checksums_and_says_so(runs, tmp_path, caplog):
  workdir = copy_of_six(runs, tmp_path)
  for step in ("4", "6"):
    (workdir / "checkpoints" / step / checksums.CHECKSUMS).unlink()
  with pytest.raises(checkpoint.CheckpointError, match=r"steps 6, 4 have no complete checksums: --restore_unverified"):
    train_run(tiny_config(**RUN, num_train_steps=8), str(workdir))
  with caplog.at_level(logging.WARNING):
    train_run(tiny_config(**RUN, num_train_steps=8), str(workdir), restore_unverified=True)
  assert any("step 6" in r.getMessage() and "restoring it, as --restore_unverified asks" in r.getMessage()
             for r in caplog.records)
  assert not (workdir / "checkpoints" / "corrupt").exists()
  assert_same_state(runs / "straight", workdir)


def test_a_stray_directory_named_like_a_step_is_set_aside_not_restored(runs, tmp_path, caplog):
  workdir = copy_of_six(runs, tmp_path)
  (workdir / "checkpoints" / "99999").mkdir()
  with caplog.at_level(logging.WARNING):
    out = train_run(tiny_config(**RUN, num_train_steps=8), str(workdir))
  assert out["step"] == 8
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1 and "99999 is not a checkpoint" in warnings[0], warnings
  assert (workdir / "checkpoints" / "corrupt" / "99999").is_dir()
  assert_same_state(runs / "straight", workdir)


def test_when_no_checkpoint_restores_the_run_stops_and_moves_nothing(runs, tmp_path):
  workdir = copy_of_six(runs, tmp_path)
  for step in ("4", "6"):
    flip_byte(workdir / "checkpoints" / step)
  before = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))
  with pytest.raises(checkpoint.CheckpointError, match=r"^no checkpoint in .* restores \(steps 6, 4;"):
    train_run(tiny_config(**RUN, num_train_steps=8), str(workdir))
  assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) == before


def test_a_changed_config_is_refused_before_anything_is_written(runs, tmp_path):
  workdir = copy_of_six(runs, tmp_path)
  record = (workdir / "config.json").read_bytes()
  changed = tiny_config(**{**RUN, "model": {"dropout_rate": 0.1, "d_model": 64}}, num_train_steps=8,
                        learning_rate=0.02)
  with pytest.raises(ConfigError, match=r"learning_rate 0.01 -> 0.02, model.d_model 32 -> 64; .*"
                     r"--allow_config_change=learning_rate,model.d_model"):
    train_run(changed, str(workdir))
  assert (workdir / "config.json").read_bytes() == record
  with pytest.raises(ConfigError, match=r"--allow_config_change: unknown config key\(s\) \['lr'\]"):
    train_run(changed, str(workdir), allow_config_change=("lr",))


def test_allowed_changes_and_a_changed_environment_resume(runs, tmp_path, caplog):
  workdir = copy_of_six(runs, tmp_path)
  record = json.loads((workdir / "config.json").read_text())
  record["xla_flags"] = "--xla_cpu_some_flag"  # a record of the machine, not config: logged, not refused
  assert record["cpu_cores"] == len(os.sched_getaffinity(0))  # the cores XLA's thread pool may use
  record["cpu_cores"] += 7
  assert record["cpu"] == provenance.cpu_model()  # XLA:CPU compiles for it
  record["cpu"] = "Another CPU (avx512f)"
  assert record["code_version"] == provenance.code_version()  # the commit this code runs from
  record["code_version"] = "0" * 40
  (workdir / "config.json").write_text(json.dumps(record))
  config = tiny_config(**{**RUN, "keep_checkpoints": 3}, num_train_steps=6, learning_rate=0.02)
  with caplog.at_level(logging.WARNING):
    out = train_run(config, str(workdir), allow_config_change=["learning_rate"])
  assert out["step"] == 6  # restored, nothing left to train
  messages = [r.getMessage() for r in caplog.records]
  assert any("config.learning_rate changed: 0.01 -> 0.02" in m for m in messages), messages
  now = os.environ.get("XLA_FLAGS", "")
  assert any(f"xla_flags {now!r}, recorded '--xla_cpu_some_flag'" in m for m in messages), messages
  cores = len(os.sched_getaffinity(0))
  assert any(f"cpu_cores {cores!r}, recorded {cores + 7!r}" in m for m in messages), messages
  assert any(f"cpu {provenance.cpu_model()!r}, recorded 'Another CPU (avx512f)'" in m for m in messages), messages
  assert any(f"code_version {provenance.code_version()!r}, recorded '{'0' * 40}'" in m for m in messages), messages
  assert json.loads((workdir / "config.json").read_text())["config"]["learning_rate"] == 0.02


@pytest.mark.parametrize("ending", [dict(schedule="cosine"), dict(cooldown_fraction=0.2)], ids=["cosine", "cooldown"])
def test_a_schedule_that_ends_makes_num_train_steps_unsafe_to_change(tmp_path, ending):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  config = tiny_config(**ending)
  (workdir / "config.json").write_text(json.dumps({"config": json.loads(config.to_json_best_effort())}))
  config.num_train_steps += 10
  with pytest.raises(ConfigError, match=r"num_train_steps 40 -> 50"):
    validate(config, num_devices=1, workdir=str(workdir))
  validate(config, num_devices=1, workdir=str(workdir), allow_changes=["num_train_steps"])


def test_a_record_from_before_the_cooldown_resumes_without_one_only(tmp_path):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  config = tiny_config()
  record = json.loads(config.to_json_best_effort())
  del record["cooldown_fraction"]
  (workdir / "config.json").write_text(json.dumps({"config": record}))
  validate(config, num_devices=1, workdir=str(workdir))
  config.cooldown_fraction = 0.2
  with pytest.raises(ConfigError, match=r"cooldown_fraction 0.0 -> 0.2"):
    validate(config, num_devices=1, workdir=str(workdir))


def test_a_position_option_added_since_the_record_resumes_at_its_default_only(tmp_path):
  # Runs recorded before a scheme gained an option lack its key; at its default it changes nothing.
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  config = tiny_config(model={"position": "learned"})  # the options of the scheme the model uses
  record = json.loads(config.to_json_best_effort())
  del record["model"]["learned"]["learned_init_std"]
  (workdir / "config.json").write_text(json.dumps({"config": record}))
  validate(config, num_devices=1, workdir=str(workdir))
  config.model.learned.learned_init_std = 1.0
  with pytest.raises(ConfigError, match=r"model.learned.learned_init_std 0.02 -> 1.0"):
    validate(config, num_devices=1, workdir=str(workdir))


def test_a_record_from_before_the_options_moved_resumes_as_the_same_config(tmp_path):
  # Records before the redesign kept every scheme's options in one dict, model.position_options.
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  config = tiny_config()
  record = json.loads(config.to_json_best_effort())
  flat = {k: v for name in ("shaw", "t5", "rope") for k, v in record["model"].pop(name).items()}
  del record["model"]["learned"]  # and learned_init_std did not exist yet
  record["model"]["position_options"] = flat
  (workdir / "config.json").write_text(json.dumps({"config": record}))
  assert record_lib.migrate(record)["model"]["shaw"] == dict(config.model.shaw)
  validate(config, num_devices=1, workdir=str(workdir))
  config.model.shaw.max_distance += 1
  with pytest.raises(ConfigError, match=r"model.shaw.max_distance 4 -> 5"):
    validate(config, num_devices=1, workdir=str(workdir))


@pytest.mark.parametrize("case", ["no_checkpoint_restores", "changed_config"])
def test_run_py_reports_either_in_one_line_with_exit_status_2(runs, tmp_path, compilation_cache, case, run_py_here):
  # A damaged workdir through a run.py process; a changed config, refused before JAX starts, through run.py in this
  # process (conftest.py's run_py_here), the same flag parser and main.
  workdir = copy_of_six(runs, tmp_path)
  args = ["--config.num_train_steps=8", "--config.eval_splits=()", "--config.model.dropout_rate=0.1",
          "--config.checkpoint_every_steps=2", "--config.keep_checkpoints=2", "--config.log_every_steps=2",
          "--config.tensorboard=False"]
  if case == "no_checkpoint_restores":
    for step in ("4", "6"):
      truncate(workdir / "checkpoints" / step)
    message = r"no checkpoint in .* restores \(steps 6, 4; see the warnings above\)"
  else:
    args.append("--config.seed=1")
    message = r"the config differs from .*config.json.*: seed 0 -> 1; .*--allow_config_change=seed"
  argv = ["--config=configs/tiny.py", f"--workdir={workdir}", *args]
  if case == "changed_config":
    proc = run_py_here(argv)
  else:
    proc = subprocess.run([sys.executable, "run.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=_env(compilation_cache))
  errors = [l for l in proc.stderr.splitlines() if l.startswith("run.py: error:")]
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert re.search(message, errors[0]), errors[0]
  assert "Traceback" not in proc.stderr
