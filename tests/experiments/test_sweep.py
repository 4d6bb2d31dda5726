"""experiments.sweep: every registered sweep expands into valid configs; printing, skipping finished runs, failures."""

import dataclasses
import json
import logging
import pathlib
import subprocess
import sys

import pytest

from configs import translation
from experiments import engine
from experiments import launch
from experiments import paper
from experiments import runs as runs_lib
from experiments import sweep as sweep_lib
from experiments import status as status_lib
from experiments import sweeps
from rpr import data
from rpr.attention import positions
from rpr import config as rpr_config
from tests import paper_cells
from tests.test_train import validate


@pytest.mark.parametrize("name", sorted(sweeps.SWEEPS))
def test_every_run_of_every_sweep_has_a_valid_config_and_its_own_workdir(name):
  sweep = sweeps.get(name)
  workdirs = [sweep.workdir(r, "root") for r in sweep.runs]
  assert len(set(workdirs)) == len(workdirs)
  for run in sweep.runs:
    _skip_without_config_file(run)
    config = sweep_lib.load_config(run, "root")  # unknown override keys would fail here (locked config)
    if config.dataset not in data.REGISTRY:
      pytest.skip(f"data set {config.dataset!r} is not registered yet")
    validate(config, num_devices=1)
    assert config.seed == run.seed


def _skip_without_config_file(run):
  if not (sweeps.ROOT / run.config).exists():  # configs/arithmetic.py comes with the arithmetic experiment
    pytest.skip(f"{run.config} does not exist yet")


def _configs(name):
  runs = sweeps.get(name).runs
  for run in runs:
    _skip_without_config_file(run)
  return [(run, sweep_lib.load_config(run, "root")) for run in runs]


def test_table2_cpu_is_every_k_of_the_paper_relative_only_three_seeds():
  runs = _configs("table2_cpu")
  assert sorted({(c.model.shaw.max_distance, c.seed) for _, c in runs}) == sorted(
      (k, s) for k in paper.TABLE2 for s in (0, 1, 2))
  for _, c in runs:
    assert c.dataset == "arithmetic" and c.model.position == "shaw"  # Shaw attention, no absolute encoding
    assert c.model.shaw.use_keys and c.model.shaw.use_values
    assert paper_cells.lookup("table2", runs_lib.flatten(c.to_dict())) == paper.TABLE2[c.model.shaw.max_distance]


def test_table3_cpu_is_every_switch_combination_three_seeds():
  runs = _configs("table3_cpu")
  assert sorted({(c.model.shaw.use_values, c.model.shaw.use_keys, c.seed) for _, c in runs}) == sorted(
      (av, ak, s) for av, ak in paper.TABLE3 for s in (0, 1, 2))
  assert {(c.model.position, c.model.shaw.max_distance) for _, c in runs} == {("shaw", paper.BASE_K)}


def test_wmt_sweeps_are_the_configs_cells_and_share_one_vocabulary():
  for table in (1, 2, 3):
    runs = _configs(f"wmt_table{table}")
    assert len(runs) == {1: 4, 2: 7, 3: 4}[table]
    for run, c in runs:
      assert run.variant.startswith(f"table{table},") and c.cache_dir == "root/wmt14_cache"
      assert paper_cells.lookup(f"table{table}", runs_lib.flatten(c.to_dict())) is not None


def test_translation_table1_sets_shaw_and_sinusoidal_beside_the_base_row():
  paper_bleu = {c.model.position: paper_cells.lookup("table1", runs_lib.flatten(c.to_dict())) for _, c in _configs(
      "translation_table1")}
  assert paper_bleu == {"shaw": paper.TABLE1[("base", "relative")], "sinusoidal": paper.TABLE1[("base", "absolute")],
                        "t5": None, "rope": None, "alibi_directional": None}


def test_length_sweep_covers_every_scheme_with_three_seeds():
  runs = _configs("length")
  schemes = {c.model.position for _, c in runs}
  assert schemes == set(positions.SCHEMES)  # the registry, directional ALiBi included
  for _, c in runs:
    assert c.dataset == "reverse" and c.eval_by_length and c.long_max_length == 2 * c.max_length
  assert sorted({c.seed for _, c in runs}) == [0, 1, 2]


@pytest.mark.parametrize("name, only, expected", [
    ("length_tiny", "shaw", "python run.py --config=configs/length.py:tiny,pe=shaw "
     "--workdir={root}/length_tiny/shaw/seed1 --config.seed=1"),
    ("table3_cpu", "av=off,ak=on", "python run.py --config=configs/arithmetic.py:pe=shaw,k=16 "
     "--workdir={root}/clipping/table3/av=off,ak=on/seed1 --config.num_train_steps=4000 "
     "--config.model.shaw.use_values=False --config.model.shaw.use_keys=True --config.seed=1"),
])
def test_printed_commands_name_the_config_variant_workdir_and_every_key(tmp_path, name, only, expected, capsys,
                                                                       monkeypatch):
  # The first through `python -m experiments sweep --print`; the second through what that command calls, in this
  # process: select the runs, print_sweep.
  _skip_without_config_file(sweep_lib.select(sweeps.get(name), only=[only])[0])
  if name == "length_tiny":
    proc = subprocess.run([sys.executable, "-m", "experiments", "sweep", name, "--print", "--seeds", "1", "--only",
                           only, "--root", str(tmp_path)], cwd=sweeps.ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stdout = proc.stdout
  else:
    monkeypatch.chdir(sweeps.ROOT)
    sweep_lib.print_sweep(sweeps.get(name), sweep_lib.select(sweeps.get(name), [only], [1]), str(tmp_path))
    stdout = capsys.readouterr().out
  steps = sweep_lib.load_config(sweep_lib.select(sweeps.get(name), only=[only])[0], "").num_train_steps
  assert stdout.splitlines() == [expected.format(root=tmp_path), "# 0 of 1 runs finished, 0 in progress",
                                      f"# {steps:,} steps left; no step rate is logged yet",
                                      "# tables: " + sweep_lib.tables_command(str(tmp_path))]


def test_print_marks_the_finished_runs_and_says_where_each_run_in_progress_stands(tmp_path, capsys):
  sweep = sweeps.get("length_tiny")
  runs = list(sweep.runs[:4])
  _finish(pathlib.Path(sweep.workdir(runs[0], str(tmp_path))), sweep_lib.load_config(runs[0], "").num_train_steps,
          rate=100.0)
  _finish(pathlib.Path(sweep.workdir(runs[1], str(tmp_path))), 5, evaluated=False, rate=0.5)  # stopped at step 5
  (pathlib.Path(sweep.workdir(runs[1], str(tmp_path))) / "checkpoints" / "4").mkdir(parents=True)
  _finish(pathlib.Path(sweep.workdir(runs[2], str(tmp_path))), 3, evaluated=False)  # killed before a save
  sweep_lib.print_sweep(sweep, runs, str(tmp_path))
  lines = capsys.readouterr().out.splitlines()
  steps = sweep_lib.load_config(runs[1], "").num_train_steps
  assert lines[:-2] == ["# finished: " + sweep_lib.command(runs[0], str(tmp_path), sweep.name),
                        f"# in progress: step 5 of {steps:,} (the command resumes it from its newest checkpoint, "
                        "step 4)",
                        sweep_lib.command(runs[1], str(tmp_path), sweep.name),
                        f"# in progress: step 3 of {steps:,} (no checkpoint: the command starts it at step 0 and "
                        "sets these records aside)",
                        sweep_lib.command(runs[2], str(tmp_path), sweep.name),
                        sweep_lib.command(runs[3], str(tmp_path), sweep.name),  # not started
                        "# 1 of 4 runs finished, 2 in progress"]
  # Left: run 1 from its checkpoint at step 4, run 2 (no checkpoint) and run 3 from step 0. Their time is at the
  # rate of the run in progress (0.5 steps/s), not the finished run's.
  left = 3 * steps - 4
  assert lines[-2] == (f"# {left:,} steps left: {left / 0.5 / 3600:.1f} hours of one process at 0.50 steps/s, the "
                       "median step rate of its runs in progress (evaluations included; divide by the processes "
                       "run side by side)")
  assert lines[-1] == f"# tables: python -m experiments tables --root {tmp_path} --out {tmp_path}/paper --readme ''"


def _finish(workdir, steps, evaluated=True, splits=("valid", "long"), rate=None):
  workdir.mkdir(parents=True, exist_ok=True)
  evaluation = {f"{s}/{m}": 1.0 for s in splits for m in ("loss", "exact_match")}
  logged = {"step": steps, "train/loss": 0.1, **({"train/steps_per_sec": rate} if rate else {})}
  records = [logged] + ([{"step": steps, **evaluation}] if evaluated else [])
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _debug(sweep, root, monkeypatch, fake_train, runs=None):
  """The sweep's runs through the launcher's debug executor (in this process), trained by ``fake_train(config,
  workdir)`` on the unparsed config."""
  monkeypatch.setattr(engine, "validate", lambda config, workdir=None: config)
  monkeypatch.setattr(engine, "train", fake_train)
  jobs = sweep_lib.launch_jobs(sweep, list(runs or sweep.runs), root)
  return launch.launch(jobs, launch.Options(executor="debug"), sweep_lib.submitit_folder(sweep, root))


def test_a_sweep_trains_in_turn_skips_finished_runs_and_goes_on_after_a_failure(tmp_path, monkeypatch):
  sweep = sweeps.get("length_tiny")
  root = str(tmp_path)
  calls = []

  def fake_train(config, workdir):
    calls.append((config.model.position, config.seed, workdir))
    if config.model.position == "sinusoidal" and config.seed == 1:
      raise FloatingPointError("diverged")
    _finish(pathlib.Path(workdir), config.num_train_steps)

  first = sweep.runs[0]
  _finish(pathlib.Path(sweep.workdir(first, root)), 10)  # finished before
  _finish(pathlib.Path(sweep.workdir(sweep.runs[1], root)), 5)  # stopped half way: resumed
  outcome = _debug(sweep, root, monkeypatch, fake_train)
  assert outcome["skipped"] == [sweep.workdir(first, root)]
  assert [(p, s) for p, s, _ in calls] == [("shaw", 1), ("sinusoidal", 0), ("sinusoidal", 1)]
  assert len(outcome["done"]) == 2 and outcome["failed"] == [sweep.workdir(sweep.runs[3], root)]
  # Run again: only the failed run is left.
  calls.clear()
  outcome = _debug(sweep, root, monkeypatch, fake_train)
  assert [(p, s) for p, s, _ in calls] == [("sinusoidal", 1)] and len(outcome["skipped"]) == 3


def test_a_finished_run_is_skipped_without_a_word_about_resuming_it(tmp_path, caplog):
  # The sweep checks every config before it trains; a finished run recorded under other XLA flags was logged as
  # "Resuming ... may not repeat a straight run", though nothing resumes it.
  run = sweeps.get("length_tiny").runs[0]
  workdir = tmp_path / "run"
  config = sweep_lib.load_config(run, str(tmp_path))
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"config": json.loads(config.to_json_best_effort()),
                                                   "xla_flags": "--xla_some_other_machine"}))
  _finish(workdir, config.num_train_steps, splits=rpr_config.evaluated_splits(config))
  with caplog.at_level(logging.INFO):
    outcome = launch.launch([launch.Job("run", str(workdir), (), config)], launch.Options(executor="debug"),
                            str(tmp_path / "submitit"))
  assert outcome["skipped"] == [str(workdir)]
  assert not [r.message for r in caplog.records if "Resuming" in r.message]


def test_print_says_how_far_a_run_in_progress_is_from_its_plateau_rule(tmp_path, capsys):
  sweep = sweeps.get("translation_curves")  # plateau rule on validation/bleu (configs/translation.py's CURVE)
  workdir = pathlib.Path(sweep.workdir(sweep.runs[0], str(tmp_path)))
  workdir.mkdir(parents=True)
  (workdir / "metrics.jsonl").write_text(json.dumps({"step": 500, "validation/bleu": 3.0}) + "\n")
  sweep_lib.print_sweep(sweep, sweep.runs[:1], str(tmp_path))
  assert ("# in progress: step 500 of 30,000 (no checkpoint: the command starts it at step 0 and sets these records "
          "aside); validation/bleu 3.00 at step 500, gained (not yet measured)") in capsys.readouterr().out


def test_finished_needs_the_last_step_and_its_evaluation(tmp_path):
  config = sweep_lib.load_config(sweeps.get("length_tiny").runs[0], str(tmp_path))
  assert not status_lib.finished(str(tmp_path / "missing"), config)
  _finish(tmp_path / "a", config.num_train_steps, evaluated=False)
  assert not status_lib.finished(str(tmp_path / "a"), config)  # trained, but the final evaluation is missing
  _finish(tmp_path / "b", config.num_train_steps)
  assert status_lib.finished(str(tmp_path / "b"), config)
  _finish(tmp_path / "c", config.num_train_steps, splits=("valid",))
  assert not status_lib.finished(str(tmp_path / "c"), config)  # the long split was not evaluated
  config.final_eval_splits = ("test",)  # evaluated at the last step only: it must be there too
  assert not status_lib.finished(str(tmp_path / "b"), config)
  _finish(tmp_path / "d", config.num_train_steps, splits=("valid", "long", "test"))
  assert status_lib.finished(str(tmp_path / "d"), config)
  with config.unlocked():
    config.eval_splits = config.final_eval_splits = ()
  assert status_lib.finished(str(tmp_path / "a"), config)  # nothing to evaluate: the last step's log is enough


def test_select_and_unknown_names_fail_clearly():
  sweep = sweeps.get("table2_cpu")
  assert [(r.name, r.seed) for r in sweep_lib.select(sweep, only=["k=4"], seeds=[2])] == [("k=4", 2)]
  with pytest.raises(ValueError, match=r"no run of sweep 'table2_cpu' matches .*runs: \['k=0'"):
    sweep_lib.select(sweep, only=["k=3"])
  with pytest.raises(ValueError, match=r"unknown sweep 'table9'; allowed: \[.*'table2_cpu'"):
    sweeps.get("table9")


def test_a_run_stopped_by_a_signal_stops_the_sweep(tmp_path, monkeypatch):
  sweep = sweeps.get("length_tiny")
  calls = []

  def fake_train(config, workdir):
    calls.append(workdir)
    return {"stopped_by_signal": 1.0, "step": 3.0}  # saved half way, as SIGTERM leaves a run

  outcome = _debug(sweep, str(tmp_path), monkeypatch, fake_train)
  assert len(calls) == 1 and outcome["stopped"] == calls and not outcome["done"]


def test_arithmetic_sweeps_cover_the_registry_seed_major():
  for name in ("arithmetic", "arithmetic_full"):
    runs = sweeps.get(name).runs
    assert [r.name for r in runs[:len(positions.SCHEMES)]] == list(positions.SCHEMES)  # seed 0 of every scheme first
    assert sorted({(r.name, r.seed) for r in runs}) == sorted((s, k) for s in positions.SCHEMES for k in (0, 1, 2))
  full = _configs("arithmetic_full")
  assert {(c.arithmetic_config, c.num_train_steps) for _, c in full} == {("n1000_addsub", 20_000)}


def test_a_shared_cell_is_the_other_sweeps_run_with_the_same_config():
  shared = [(s, r) for s in sweeps.SWEEPS.values() for r in s.runs if r.same_as]
  assert {(s.name, r.name) for s, r in shared} == {
      ("translation_table2", "k=16"), ("translation_table3", "av=on,ak=on"), ("lm_length", "shaw"),
      ("lm_table3", "av=on,ak=on"), ("translation_absolute", "ak"), ("translation_absolute", "shaw"),
      ("translation_absolute", "sinusoidal"), ("translation_paper", "shaw"), ("translation_paper", "sinusoidal"),
      ("lm_paper", "k=16")}
  for s, run in shared:
    other_sweep, other_name = run.same_as.split("/")
    (other,) = [r for r in sweeps.get(other_sweep).runs if r.name == other_name and r.seed == run.seed]
    assert s.workdir(run, "root") == sweeps.get(other_sweep).workdir(other, "root")  # trained once, counted once
    assert sweep_lib.load_config(run, "root").to_dict() == sweep_lib.load_config(other, "root").to_dict()


def test_the_tables_command_rewrites_the_committed_tables_only_from_the_committed_root():
  assert sweep_lib.tables_command("experiments/results") == "python -m experiments tables"
  assert sweep_lib.tables_command("workdirs/sweeps") == ("python -m experiments tables --root workdirs/sweeps --out "
                                                         "workdirs/sweeps/paper --readme ''")


def test_prepare_data_makes_each_data_config_once_before_the_workers_start(monkeypatch):
  made = []
  for name in ("sotu", "bible_fr_en"):
    monkeypatch.setitem(data.REGISTRY, name, dataclasses.replace(data.REGISTRY[name], prepare=made.append))
  configs = lambda runs: [sweep_lib.load_config(r, "root") for r in runs]
  assert engine.prepare_data(configs(sweeps.get("lm_clipping").runs)) == 1  # 24 runs, one data config
  runs = sweeps.get("translation_table1").runs + sweeps.get("translation_short").runs
  assert engine.prepare_data(configs(runs)) == 2  # all lengths; training on <= 30 pieces
  assert [c.dataset for c in made] == ["sotu", "bible_fr_en", "bible_fr_en"]
  assert [c.train_max_source_tokens for c in made[1:]] == [None, translation.SHORT]


def test_time_left_uses_the_finished_runs_rate_when_none_is_in_progress_and_says_a_plateau_may_stop_sooner():
  text = sweep_lib._time_left(36_000, {False: [], True: [1.0, 2.0, 9.0]}, True)  # pylint: disable=protected-access
  assert text == ("36,000 steps left at most (a plateau rule may stop a run sooner): 5.0 hours of one process at "
                  "2.00 steps/s, the median step rate of its finished runs (evaluations included; divide by the "
                  "processes run side by side)")
  assert sweep_lib._time_left(0, {False: [], True: []}, True) == "0 steps left"  # pylint: disable=protected-access


def test_a_runs_step_rate_counts_its_evaluations_where_the_median_interval_would_not():
  # Four intervals of the same steps; the last held an evaluation and took four times as long.
  records = [{"step": 100 * i, "train/steps_per_sec": 2.0} for i in (1, 2, 3)] + [
      {"step": 400, "train/steps_per_sec": 0.5}, {"step": 400, "valid/loss": 1.0}]
  rate = sweep_lib._run_rate(records)  # pylint: disable=protected-access
  assert rate == pytest.approx(400 / (3 * 50 + 200))  # the 400 steps over their 350 seconds
  assert sweep_lib._run_rate([{"step": 1, "valid/loss": 1.0}]) is None  # pylint: disable=protected-access


@pytest.mark.parametrize("task,sweep_name,tables", [
    ("translation", "translation_paper", ("table1", "table2", "table3")), ("lm", "lm_paper", ("lm_clipping",))])
def test_the_paper_sweep_trains_every_cell_of_its_tables_once_per_protocol_seed(monkeypatch, task, sweep_name,
                                                                                 tables):
  """Declared only once the pilot fixed the budget; then every cell of the protocol's tables has a workdir per seed
  (0-4; 0-2 for the schemes beside Table 1) where experiments/tables.py reads it, each training the budget."""
  import importlib

  from experiments import protocol

  module = importlib.import_module(f"configs.{task}")
  monkeypatch.setattr(module, "PAPER_STEPS", 0)
  assert sweep_name not in module.get_sweeps()
  monkeypatch.setattr(module, "PAPER_STEPS", 12_000)
  declared = module.get_sweeps()[sweep_name]
  runs = {(f"{declared['folder']}/{r['name']}", r["seed"]) for r in declared["runs"]}
  assert len(runs) == len(declared["runs"])
  beside = {"rope", "t5", "alibi_directional"}
  wanted = {(t.folder_of(row), s) for t in protocol.protocol_tables(str(sweeps.ROOT))
            if t.name in tables for row in t.rows
            for s in range(3 if row.cell in beside else 5)}
  assert runs == wanted
  for r in declared["runs"]:  # each a valid config (unknown override keys would fail: the config is locked)
    config = sweep_lib.load_config(sweeps.Run(**r), "root")
    validate(config, num_devices=1)
    assert (config.num_train_steps, config.seed) == (12_000, r["seed"])


@pytest.mark.parametrize("task,pilot,cells", [
    ("translation", "translation_pilot", {"shaw": "shaw,steps=32000", "sinusoidal": "sinusoidal,steps=32000"}),
    ("lm", "lm_pilot", {"k=16": "shaw,L4d128,steps=32000"})])
def test_at_a_pilot_budget_the_pilots_runs_are_seeds_0_and_1_of_their_cells(monkeypatch, task, pilot, cells):
  """The paper sweep does not train again what the pilot trained at the same config: its seeds 0-1 of the pilot's
  cells are the pilot's runs (same_as), and the protocol's tables read them in the pilot's folder."""
  import importlib

  from experiments import protocol

  module = importlib.import_module(f"configs.{task}")
  monkeypatch.setattr(module, "PAPER_STEPS", 32_000)
  declared = module.get_sweeps()[f"{task}_paper"]
  shared = {(r["name"], r["seed"]): r["same_as"] for r in declared["runs"] if r["same_as"]}
  assert shared == {(cell, s): f"{pilot}/{name}" for cell, name in cells.items() for s in (0, 1)}
  for r in declared["runs"]:
    if r["same_as"]:
      (other,) = [o for o in sweeps.get(pilot).runs if o.name == cells[r["name"]] and o.seed == r["seed"]]
      assert sweep_lib.load_config(sweeps.Run(**r), "root").to_dict() == sweep_lib.load_config(other, "root").to_dict()
  assert protocol.trained_elsewhere(task, f"{task}_paper") == {c: (f"pilot/{task}/{n}",) for c, n in cells.items()}
  names = ("table1", "table2", "table3") if task == "translation" else ("lm_clipping",)
  rows = {r.cell: r for t in protocol.protocol_tables(str(sweeps.ROOT)) for r in t.rows if t.name in names}
  assert {c: rows[c].also for c in cells} == {c: (f"pilot/{task}/{n}",) for c, n in cells.items()}
  monkeypatch.setattr(module, "PAPER_STEPS", 12_000)  # not a pilot budget: every run its own
  assert not any(r["same_as"] for r in module.get_sweeps()[f"{task}_paper"]["runs"])
