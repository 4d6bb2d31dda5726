"""experiments.position_tables: the initial parameters it rebuilds are the run's own, and what it measures."""

import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import position_tables
from experiments.runs import load_params
from rpr import train
from tests.test_train import FAST, ROOT, tiny_config
from rpr import assemble
from rpr.sharding import make_mesh
from tests.test_train import train_run, parse

SHAW = dict(FAST, model=dict(FAST["model"], position="shaw"))


def _flat(params) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)}


def _assert_rebuilt_bit_for_bit(run, workdir: str) -> dict[str, np.ndarray]:
  """``initial_params(workdir)`` equals the state ``rpr.assemble.prepare`` initialised; returns that state, flat."""
  started, rebuilt = _flat(run.state.params), _flat(position_tables.initial_params(workdir))
  assert sorted(rebuilt) == sorted(started)
  for name, value in started.items():
    np.testing.assert_array_equal(rebuilt[name], value, err_msg=name)
  return started


def test_the_rebuilt_initial_parameters_are_those_the_run_started_from(tmp_path):
  started = {}
  for seed in (3, 4):
    workdir = str(tmp_path / f"seed{seed}")
    run = assemble.prepare(parse(tiny_config(**SHAW, seed=seed)), workdir, make_mesh())  # writes config.json
    started[seed] = _assert_rebuilt_bit_for_bit(run, workdir)
  # The seed decides: the check above could fail.
  assert any(not np.array_equal(started[3][n], started[4][n]) for n in started[3])


def test_the_rebuilt_initial_parameters_of_a_language_model_are_its_own(tmp_path):
  from configs import lm
  from rpr.data import sotu
  from tests.data import test_sotu as test_sotu_data

  corpus_dir = tmp_path / "corpus"
  corpus_dir.mkdir()
  sotu.prepare(str(tmp_path / "tfds"), str(corpus_dir), test_sotu_data.make_tarball(corpus_dir))
  config = lm.get_config("tiny,pe=shaw,k=2")
  config.data_dir, config.corpus_dir, config.lm_context_length = str(tmp_path / "tfds"), str(corpus_dir), 8
  run = assemble.prepare(parse(config), str(tmp_path / "run"), make_mesh())
  started = _assert_rebuilt_bit_for_bit(run, str(tmp_path / "run"))
  assert any("key_table" in name for name in started)


def test_measure_reports_every_position_table_and_how_far_it_moved(tmp_path):
  workdir = str(tmp_path / "run")
  train_run(tiny_config(**SHAW), workdir)
  rows = {r["name"]: r for r in position_tables.measure(workdir)}
  assert sorted(rows) == [f"{s}/layer_0/{t}" for s in ("decoder", "encoder") for t in ("key_table", "value_table")]
  before = position_tables.position_params(position_tables.initial_params(workdir))
  after = position_tables.position_params(load_params(workdir))
  for name, row in rows.items():
    b, a = before[name], after[name]
    assert row["shape"] == list(a.shape) == [2, 9, 16]  # tiny: 2 heads of 16, k = 4
    assert row["init_rms"] == pytest.approx(np.sqrt(np.mean(b ** 2)))
    assert row["init_rms"] == pytest.approx(16 ** -0.5, rel=0.2)  # Shaw's tables start at N(0, head_dim^-1)
    assert row["final_rms"] == pytest.approx(np.sqrt(np.mean(a ** 2)))
    assert 0 < row["change"] == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b))
    assert row["final_spread"] == pytest.approx(position_tables.spread(a))


def test_spread_is_the_part_of_a_table_that_depends_on_the_distance():
  rows = np.arange(6.0).reshape(2, 3)  # [distances, dim]
  assert position_tables.spread(np.stack([rows[0]] * 5)) == 0.0  # one vector for every distance: no signal
  assert position_tables.spread(rows) == pytest.approx(1.5)  # rows differ by 3 in every component: +-1.5
  assert position_tables.spread(rows + 7.0) == pytest.approx(1.5)  # a shared offset is not a distance signal


def test_a_workdir_without_checkpoints_is_refused_by_name(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  done = subprocess.run([sys.executable, "-m", "experiments.position_tables", str(tmp_path)], cwd=ROOT,
                        capture_output=True, text=True)
  assert done.returncode != 0
  assert f"{str(tmp_path)!r} is not a run's workdir: it needs config.json and checkpoints/" in done.stderr
