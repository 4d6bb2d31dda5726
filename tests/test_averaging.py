"""Checkpoint averaging (``config.average_last``): the final evaluation scores the final state under the usual
names and the mean of the last N checkpoints' parameters as ``<split>_avg/...``; the training state stays the
unaveraged one, and a resumed run trains on from it."""

import shutil

import numpy as np
import pytest

from rpr import checkpoint
from rpr import evaluation
from rpr import train
from rpr.records import read_jsonl
from tests.test_train import load_state, tiny_config
from tests.test_train import ConfigError, validate, train_run

# No TensorBoard events: no test here reads them, and writing them imports TensorFlow (seconds of CPU).
AVERAGED = dict(num_train_steps=8, eval_splits=("valid",), eval_every_steps=8, log_every_steps=2,
                checkpoint_every_steps=2, keep_checkpoints=3, average_last=3, tensorboard=False,
                model={"dropout_rate": 0.1})


@pytest.fixture(scope="module")
def averaged(tmp_path_factory):
  """One averaged run of 8 steps: its workdir, its final metrics and the parameters its final evaluation scored."""
  path, scored = tmp_path_factory.mktemp("averaged"), []
  evaluate = evaluation.evaluate
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(evaluation, "evaluate", lambda config, task, params, *a, **k: scored.append(params) or evaluate(
        config, task, params, *a, **k))
    out = train_run(tiny_config(**AVERAGED), str(path))
  return path, out, scored


@pytest.mark.slow
def test_the_final_evaluation_scores_the_state_and_the_mean_of_the_last_checkpoints_and_training_resumes(averaged,
                                                                                                      tmp_path):
  path, out, scored = averaged
  steps = [load_state(path, s) for s in (4, 6, 8)]
  state, params = scored  # the final state's evaluation, then the average's
  for key, value in _flat(state).items():
    np.testing.assert_array_equal(np.asarray(value), steps[-1]["['params']" + key], err_msg=key)
  assert out["valid_avg/loss"] != out["valid/loss"]
  flat = {k: v for k, v in _flat(params).items()}
  for key, value in flat.items():
    mean = np.mean([s["['params']" + key] for s in steps], axis=0)
    np.testing.assert_allclose(np.asarray(value), mean, rtol=1e-6, atol=1e-7, err_msg=key)
  assert np.abs(np.asarray(flat[key]) - steps[-1]["['params']" + key]).max() > 0  # not the last state
  # average_params itself: the arithmetic mean of the steps it is given.
  _check_average_params(path, steps[0], steps[-1])
  # A run resumed after the averaged evaluation trains on from the unaveraged state: a straight run's.
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  train_run(tiny_config(**dict(AVERAGED, num_train_steps=12)), str(straight))
  # Its evaluation at step 8 is not its last, so it scores the state of step 8 alone, as the averaged run's
  # valid/loss does, and writes no average.
  (at_8,) = [r for r in read_jsonl(straight / "metrics.jsonl") if r["step"] == 8 and "valid/loss" in r]
  assert out["valid/loss"] == at_8["valid/loss"] and "valid_avg/loss" not in at_8
  shutil.copytree(path, resumed)  # averaged evaluation at step 8
  train_run(tiny_config(**dict(AVERAGED, num_train_steps=12)), str(resumed))
  a, b = load_state(straight, 12), load_state(resumed, 12)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}['{k}']") if isinstance(v, dict) else {f"{prefix}['{k}']": v})
  return out


def test_average_last_needs_the_checkpoints_kept():
  with pytest.raises(ConfigError, match=r"config.average_last = 4 .*<= keep_checkpoints \(3\)"):
    validate(tiny_config(**dict(AVERAGED, average_last=4)), num_devices=1)


def _check_average_params(path, a, b):
  """average_params of the steps 4 and 8 of ``path`` is the mean of ``a`` and ``b``, their saved states."""
  import jax

  ckpt = checkpoint.Checkpoints(str(path / "checkpoints"), every=2, keep=3)
  try:
    state = ckpt.manager.restore(8)
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), state)
    mean = ckpt.average_params(train.TrainState(**abstract), [4, 8])
  finally:
    ckpt.close()
  for key, value in _flat(mean).items():
    np.testing.assert_allclose(np.asarray(value), (a["['params']" + key] + b["['params']" + key]) / 2, rtol=1e-6)
