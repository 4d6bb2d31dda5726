"""experiments.noise (the floor from retrained runs) and experiments.budgets (a report beside a shorter budget)."""

import json
import pathlib

import pytest

from experiments import budgets
from experiments import noise
from experiments import paper
from experiments import tabulate
from tests.experiments.test_report import _workdir

ROOT = pathlib.Path(__file__).resolve().parents[2]
CELL = {"dataset": "sotu", "position": "shaw", "max_distance": 16, "num_train_steps": 100}
PPL = ("test/perplexity", "test_x2/perplexity", "test_x4/perplexity", "test_x8/perplexity")


def _lm_run(path, seed, ppl, step=100, devices=1, **config):
  path = _workdir(path, {**CELL, **config, "seed": seed}, [{"step": step, **{m: ppl + i for i, m in enumerate(PPL)}}])
  record = json.loads((path / "config.json").read_text())
  (path / "config.json").write_text(json.dumps({**record, "num_devices": devices}))  # as the engine records it
  return path


@pytest.fixture
def results(tmp_path):
  """A committed sweep of 3 seeds, and its seed 0 retrained twice (one unfinished) under other orders."""
  for seed, ppl in enumerate([40.0, 41.5, 40.5]):
    _lm_run(tmp_path / "lm" / "clipping" / "k=16" / f"seed{seed}", seed, ppl)
  for seed, ppl in enumerate([50.0, 50.5]):  # another cell: not a twin
    _lm_run(tmp_path / "lm" / "clipping" / "k=2" / f"seed{seed}", seed, ppl, max_distance=2)
  _lm_run(tmp_path / "noise" / "lm_k16" / "same" / "seed0", 0, 40.25)
  _lm_run(tmp_path / "noise" / "lm_k16" / "devices2" / "seed0", 0, 39.0, step=50, devices=2)  # unfinished: left out
  _lm_run(tmp_path / "lm" / "curves" / "k=16" / "seed0", 0, 30.0, step=400, num_train_steps=400)  # not a twin
  return tmp_path


def test_a_longer_budget_cell_is_retrained_against_its_own_twin_and_counts_in_the_floor(results, tmp_path):
  # The same config at 4x the steps is another cell: its twin is the longer run, and its spread (0.5) is the floor.
  _lm_run(results / "noise" / "lm_k16_long" / "devices2" / "seed0", 0, 30.5, step=400, devices=2,
          num_train_steps=400)
  found = {c["cell"]: c["twin"].workdir for c in noise.cells(str(results / "noise"), str(results))}
  assert found == {"lm_k16": str(results / "lm" / "clipping" / "k=16" / "seed0"),
                   "lm_k16_long": str(results / "lm" / "curves" / "k=16" / "seed0")}
  floor = noise.write(str(tmp_path / "out"), str(results / "noise"), str(results))
  assert floor == {"sotu": {m: pytest.approx(0.5) for m in PPL}}
  table = (tmp_path / "out" / "floor.md").read_text()
  row = "| lm_k16_long | 400 | test/perplexity | 30.00 | - | - | 30.50 | - | **0.50** | 30.00 (1 seed: no range yet) |"
  assert row in table


def test_runs_their_plateau_rule_stopped_before_the_cap_are_finished(results, tmp_path):
  # The committed curve run stopped by its rule at 300 of 400 steps, its retraining at 250: both count (a run was
  # counted only at num_train_steps, so the Shaw curve cell's seed 0 fell out of its own row).
  def stopped(path, ppl, step):
    (path / "metrics.jsonl").write_text(json.dumps({"step": step, "plateau/reached": 1.0,
                                                    **{m: ppl + i for i, m in enumerate(PPL)}}) + "\n")

  stopped(results / "lm" / "curves" / "k=16" / "seed0", 30.0, 300)  # the fixture's 400-step run
  retrained = _lm_run(results / "noise" / "lm_k16_long" / "devices2" / "seed0", 0, 30.5, devices=2,
                      num_train_steps=400)
  stopped(retrained, 30.5, 250)
  noise.write(str(tmp_path / "out"), str(results / "noise"), str(results))
  row = "| lm_k16_long | 400 | test/perplexity | 30.00 | - | - | 30.50 | - | **0.50** | 30.00 (1 seed: no range yet) |"
  assert row in (tmp_path / "out" / "floor.md").read_text()


def test_the_floor_is_the_largest_spread_between_a_committed_run_and_its_retrainings(results, tmp_path):
  floor = noise.write(str(tmp_path / "out"), str(results / "noise"), str(results))
  assert floor == {"sotu": {m: pytest.approx(0.25) for m in PPL}}
  assert json.loads((tmp_path / "out" / "floor.json").read_text()) == floor
  table = (tmp_path / "out" / "floor.md").read_text()
  # committed 40.00, same 40.25, devices2 unfinished, threads2 not run; the 3 seeds span 40.0-41.5.
  assert "| lm_k16 | 100 | test/perplexity | 40.00 | 40.25 | - | - | - | **0.25** | 40.00-41.50 (1.50, 3 seeds) |" \
      in table
  assert "| lm_k16 | 100 | test_x8/perplexity | 43.00 | 43.25 | - | - | - | **0.25** | 43.00-44.50 (1.50, 3 seeds) |" \
      in table


def test_a_budget_where_enough_cells_were_retrained_has_a_floor_of_its_own(results, tmp_path, monkeypatch):
  # Two cells retrained at 400 steps (spreads 0.10 and 0.05): 400 steps has a floor of its own, 0.10. At 100 steps
  # one cell (lm_k16, 0.25) is not enough: numbers there are held to the largest at any budget, 0.25.
  _lm_run(results / "lm" / "curves" / "k=2" / "seed0", 0, 35.0, step=400, num_train_steps=400, max_distance=2)
  _lm_run(results / "noise" / "lm_k16_long" / "devices2" / "seed0", 0, 30.1, step=400, devices=2,
          num_train_steps=400)
  _lm_run(results / "noise" / "lm_k2_long" / "devices2" / "seed0", 0, 35.05, step=400, devices=2,
          num_train_steps=400, max_distance=2)
  out = tmp_path / "out"
  assert noise.write(str(out), str(results / "noise"), str(results)) == {"sotu": {m: pytest.approx(0.25) for m in PPL}}
  own = json.loads((out / noise.BUDGETS_FILE).read_text())
  assert own["sotu"]["test/perplexity"] == {"400": {"floor": pytest.approx(0.1),
                                                    "cells": ["lm_k16_long", "lm_k2_long"]}}
  monkeypatch.setattr(noise, "FLOOR_FILE", str(out / "floor.json"))
  assert noise.floor_of("sotu", "test/perplexity", 400) == (pytest.approx(0.1), "test/perplexity", 400)
  assert noise.floor_of("sotu", "test/perplexity", 100) == (pytest.approx(0.25), "test/perplexity", None)
  assert noise.floor_of("sotu", "test/perplexity") == (pytest.approx(0.25), "test/perplexity", None)
  assert noise.floor_of("sotu", "test/perplexity", 400, 100)[0] == pytest.approx(0.25)  # across budgets: the larger
  assert noise.floor_of("sotu", "test_long/perplexity", 400) == (pytest.approx(0.1), "test/perplexity", 400)
  assert noise.floors_text(["sotu"], "test/perplexity", [400, 100]) == (
      "0.25 at 100 steps (sotu, the largest at any budget), 0.10 at 400 steps (sotu, measured there) "
      "(`experiments/results/noise/`)")
  table = (out / "floor.md").read_text()
  assert "- sotu, test/perplexity at 400 steps: 0.10 over 2 cells (lm_k16_long, lm_k2_long); its own floor." in table
  assert ("- sotu, test/perplexity at 100 steps: 0.25 over 1 cell (lm_k16); held to the largest (0.25): fewer than "
          "2 cells.") in table


def test_a_run_not_trained_as_its_order_says_is_refused_by_name(results, tmp_path):
  noise_dir, root = str(results / "noise"), str(results)
  # An XLA_FLAGS value that XLA cut short trains "devices2" on one device: refused, not counted as two.
  _lm_run(results / "noise" / "lm_k16" / "devices2" / "seed1", 1, 41.0, devices=1)
  with pytest.raises(ValueError, match=r"devices2/seed1: trained on 1 device\(s\); allowed for order 'devices2': 2"):
    noise.cells(noise_dir, root)
  (results / "noise" / "lm_k16" / "devices2" / "seed1" / "config.json").unlink()
  # One core is the launch line's (taskset), which config.json does not record.
  _lm_run(results / "noise" / "lm_k16" / "cores1" / "seed0", 0, 40.1)
  with pytest.raises(ValueError, match=r"cores1/seed0: launched as 'no launch.txt'; allowed for order 'cores1': a "
                                       r"line with 'taskset -c 0'"):
    noise.cells(noise_dir, root)
  (results / "noise" / "lm_k16" / "cores1" / "launch.txt").write_text("taskset -c 0 python run.py ...\n")
  assert [c["reruns"].keys() for c in noise.cells(noise_dir, root)] == [{"same", "devices2", "cores1"}]


def test_a_retrained_run_whose_config_no_committed_run_has_is_refused_by_name(results, tmp_path):
  _lm_run(results / "noise" / "lm_k16" / "repeat" / "seed0", 0, 40.0, max_distance=8)
  with pytest.raises(ValueError, match=r"noise/lm_k16/repeat/seed0: 0 committed runs have its config \(seed "
                                       r"included\), \[\]; allowed: exactly one"):
    noise.write(str(tmp_path / "out"), str(results / "noise"), str(results))


def test_the_committed_noise_table_and_floor_are_what_the_command_makes_of_the_committed_runs(tmp_path,
                                                                                             committed_runs_only):
  noise.write(str(tmp_path), command="python -m experiments.noise")
  committed = ROOT / "experiments" / "results" / "noise"
  for name in ("floor.md", "floor.json", noise.BUDGETS_FILE):
    assert (tmp_path / name).read_text() == (committed / name).read_text(), name


@pytest.mark.parametrize("a,b,floor,lower,expected", [
    ([10, 11], [12.5, 13], 0.6, False, "worse by 1.50"),
    ([10, 11], [12.5, 13], 0.6, True, "better by 1.50"),  # perplexity: lower is better
    ([13, 14], [10, 12], 0.6, False, "better by 1.00"),
    ([13, 14], [10, 12.5], 0.6, False, "not separated"),  # apart by 0.5, under the floor
    ([10, 12], [11, 13], 0.0, False, "not separated"),  # overlapping ranges
    ([13, 14], [10, 12], None, False, "not separated"),  # no floor measured: nothing is called real
    ([13], [10, 11], 0.6, False, "not judged (one seed)"),  # one seed: its range between seeds is unmeasured
    ([13, 14], [10], 0.6, False, "not judged (one seed)"),
])
def test_separation_calls_a_difference_only_above_the_floor(a, b, floor, lower, expected):
  assert budgets.separation(a, b, floor, lower) == expected


def test_a_cell_is_its_config_without_the_budget():
  a = {**CELL, "seed": 0, "num_train_steps": 8000, "eval_every_steps": 500, "plateau_metric": "validation/bleu"}
  assert budgets.cell(a) == budgets.cell({**CELL, "seed": 2, "num_train_steps": 2000})
  assert budgets.cell(a) != budgets.cell({**CELL, "max_distance": 8})


def test_the_papers_cell_is_the_table_that_varies_what_the_config_varies():
  shaw = {"position": "shaw", "max_distance": 16, "d_model": 64}
  assert paper.cell({"position": "sinusoidal", "d_model": 64}) == ("table1", paper.TABLE1[("base", "absolute")])
  assert paper.cell(shaw) == ("table1", paper.TABLE1[("base", "relative")])
  assert paper.cell({**shaw, "max_distance": 64}) == ("table2", paper.TABLE2[64])
  assert paper.cell({**shaw, "use_values": False}) == ("table3", paper.TABLE3[(False, True)])
  assert paper.cell({**shaw, "max_distance": 3}) is None  # not a k of Table 2
  assert paper.cell({**shaw, "add_sinusoidal": True}) is None
  assert paper.cell({"position": "rope"}) is None


def _longer_k16(results, tmp_path, monkeypatch):
  """A floor of 0.25 for sotu's test perplexity, and k = 16 trained longer: 30 and 31 at step 400."""
  monkeypatch.setattr(noise, "FLOOR_FILE", str(tmp_path / "floor.json"))
  (tmp_path / "floor.json").write_text(json.dumps({"sotu": {"test/perplexity": 0.25}}))
  for seed, ppl in enumerate([30.0, 31.0]):
    _lm_run(results / "longer" / "k=16" / f"seed{seed}", seed, ppl, step=400, num_train_steps=400)


def _longer_k2(results, ppls):
  for seed, ppl in enumerate(ppls):
    _lm_run(results / "longer" / "k=2" / f"seed{seed}", seed, ppl, step=400, num_train_steps=400, max_distance=2)


def test_the_report_sets_each_group_beside_its_cell_at_the_shorter_budget(results, tmp_path, monkeypatch):
  _longer_k16(results, tmp_path, monkeypatch)
  _longer_k2(results, [41.0, 41.0])
  _lm_run(results / "longer" / "k=4" / "seed0", 0, 41.0, step=400, num_train_steps=400, max_distance=4)
  out = tmp_path / "out"
  tabulate.write_report([str(results / "longer" / "*" / "*")], str(out), metric="test/perplexity",
                        shorter=(str(results / "lm" / "clipping" / "*" / "*"),))
  table = (out / "table.md").read_text()
  assert ("noise floor of test/perplexity: 0.25 at 100 steps (sotu, the largest at any budget), 0.25 at 400 steps "
          "(sotu, the largest at any budget)") in table
  # k = 16: 30-31 at 400 steps against 40-41.5 at 100 (mean 40.67): better by 9 > 0.25. k = 4: no shorter run.
  assert "| k=16 | 2 | 400 | 30.50 [30.00, 31.00] | 3 | 100 | 40.67 [40.00, 41.50] | -10.17 | better by 9.00 |" in table
  assert "| k=4 | 1 | 400 | 41.00 | 0 | - | - | - | - |" in table
  # The pairs with shorter runs, judged at both budgets, in path order (k = 2 before k = 16): k = 2 (50-50.5,
  # then 41) against k = 16 (40-41.5, then 30-31).
  assert "(1 verdict held, 0 changed)." in table
  assert ("- held: k=2 against k=16: worse by 8.50 at the shorter budget, worse by 10.00 at this one (2 and 2 "
          "runs)") in table
  assert "paper (BLEU" not in table  # a perplexity report has no BLEU beside it
  assert "(cap)" not in table and "at the cap" not in table  # no run has a plateau rule


def test_a_cell_that_reached_its_cap_without_a_plateau_is_marked_where_its_step_is_and_in_its_verdicts(
    results, tmp_path, monkeypatch):
  # Both cells trained to a plateau rule capped at 400 steps: k = 16's seeds met it there, k = 2's did not.
  monkeypatch.setattr(noise, "FLOOR_FILE", str(tmp_path / "floor.json"))
  (tmp_path / "floor.json").write_text(json.dumps({"sotu": {"test/perplexity": 0.25}}))
  rule = {"num_train_steps": 400, "plateau_metric": "validation/perplexity"}
  for k, ppls, met in ((16, [30.0, 31.0], True), (2, [41.0, 41.0], False)):
    for seed, ppl in enumerate(ppls):
      _workdir(results / "longer" / f"k={k}" / f"seed{seed}", {**CELL, **rule, "max_distance": k, "seed": seed},
               [{"step": 400, "test/perplexity": ppl, **({"plateau/reached": 1.0} if met else {})}])
  tabulate.write_report([str(results / "longer" / "*" / "*")], str(tmp_path / "out"), metric="test/perplexity",
                        shorter=(str(results / "lm" / "clipping" / "*" / "*"),))
  table = (tmp_path / "out" / "table.md").read_text()
  assert "| k=2 | 2 | 400 (cap) | 41.00 [41.00, 41.00] | 2 | 100 | 50.25 [50.00, 50.50] |" in table
  assert "| k=16 | 2 | 400 | 30.50 [30.00, 31.00] |" in table
  assert "A step marked (cap) has runs that reached the cap without meeting their plateau rule" in table
  assert ("- held: k=2 against k=16: worse by 8.50 at the shorter budget, worse by 10.00 at this one (2 and 2 "
          "runs; 2 of k=2 at the cap)") in table
  # Against the committed 6-gram (31.16): k = 2 (41) is worse by 9.84, its 2 runs at the cap; k = 16 (30-31) is not
  # separated from it, and unmarked.
  assert "Not separated: k=16. Worse by more than the floor: k=2 (by 9.84; 2 at the cap)." in table
  assert 'A group marked "n at the cap" has n runs that reached their cap' in table


def test_a_verdict_that_training_changed_is_listed_as_changed_and_a_budgets_own_floor_can_hold_it(
    results, tmp_path, monkeypatch):
  _longer_k16(results, tmp_path, monkeypatch)
  _longer_k2(results, [31.2, 31.2])

  def table():
    tabulate.write_report([str(results / "longer" / "*" / "*")], str(tmp_path / "out"), metric="test/perplexity",
                          shorter=(str(results / "lm" / "clipping" / "*" / "*"),))
    return (tmp_path / "out" / "table.md").read_text()

  # 8.5 apart at the shorter budget; at this one 31.2 is 0.2 from 30-31, under the floor of 0.25.
  assert "(0 verdicts held, 1 changed)" in table()
  assert ("- changed: k=2 against k=16: worse by 8.50 at the shorter budget, not separated at this one (2 and 2 "
          "runs)") in table()
  # With a floor of its own at 400 steps, 0.10, the same 0.2 is above it; 100 steps is still held to the largest.
  (tmp_path / noise.BUDGETS_FILE).write_text(json.dumps(
      {"sotu": {"test/perplexity": {"400": {"floor": 0.1, "cells": ["a", "b"]}}}}))
  text = table()
  assert "0.25 at 100 steps (sotu, the largest at any budget), 0.10 at 400 steps (sotu, measured there)" in text
  assert ("- held: k=2 against k=16: worse by 8.50 at the shorter budget, worse by 0.20 at this one (2 and 2 "
          "runs)") in text


def test_a_pair_with_one_seed_in_a_cell_is_counted_and_not_judged(results, tmp_path, monkeypatch):
  _longer_k16(results, tmp_path, monkeypatch)
  _longer_k2(results, [41.0])  # 10 from k = 16 with one seed: no range between seeds to hold it to
  tabulate.write_report([str(results / "longer" / "*" / "*")], str(tmp_path / "out"), metric="test/perplexity",
                        shorter=(str(results / "lm" / "clipping" / "*" / "*"),))
  table = (tmp_path / "out" / "table.md").read_text()
  assert "| k=2 | 1 | 400 | 41.00 | 2 | 100 | 50.25 [50.00, 50.50] | -9.25 | not judged (one seed) |" in table
  assert "(0 verdicts held, 0 changed). 1 pair is not judged: one of their cells has a single seed" in table
  assert "- held" not in table and "- changed" not in table


def test_each_longer_run_is_set_beside_its_seeds_shorter_run_at_the_shorter_runs_last_training_step(tmp_path):
  def run(path, seed, k, steps, lr, loss, ppl):
    config = {**CELL, "seed": seed, "max_distance": k, "num_train_steps": steps}
    _workdir(path, config, [{"step": 100, "train/learning_rate": lr, "train/loss": loss},
                            {"step": steps, "test/perplexity": ppl}])
  for seed, d in ((0, 0.001), (1, -0.002)):  # k = 16: the same schedule to step 100, the loss moved by d
    run(tmp_path / "short" / "k=16" / f"seed{seed}", seed, 16, 100, 1e-3, 4.0, 40.0)
    run(tmp_path / "long" / "k=16" / f"seed{seed}", seed, 16, 400, 1e-3, 4.0 + d, 30.0)
  run(tmp_path / "short" / "k=2" / "seed0", 0, 2, 100, 1e-3, 4.0, 50.0)  # k = 2: another schedule
  run(tmp_path / "long" / "k=2" / "seed0", 0, 2, 400, 2e-3, 4.5, 35.0)
  run(tmp_path / "long" / "k=2" / "seed1", 1, 2, 400, 2e-3, 4.5, 35.0)  # no shorter run of its seed: left out
  tabulate.write_report([str(tmp_path / "long" / "*" / "*")], str(tmp_path / "out"), metric="test/perplexity",
                        shorter=(str(tmp_path / "short" / "*" / "*"),))
  table = (tmp_path / "out" / "table.md").read_text()
  assert "at that run's last training record (step S)" in table
  assert "| k=2 | 0 | 100 | differs | +0.5000 |" in table
  assert "| k=16 | 0, 1 | 100 | same | +0.0010, -0.0020 |" in table


def test_a_gap_that_two_decimals_would_print_as_the_floor_it_clears_gets_more_digits():
  assert noise.verdict([31.2, 31.3], [31.1577], 0.0404, lower_is_better=True) == "worse by 0.042"
  assert noise.verdict([31.2, 31.3], [31.1], 0.04, lower_is_better=True) == "worse by 0.10"
  assert noise.verdict([31.19, 31.3], [31.1577], 0.0404, lower_is_better=True) == "not separated"


def test_a_judged_metric_is_held_to_its_own_floor_at_both_budgets(results, tmp_path, monkeypatch):
  _longer_k16(results, tmp_path, monkeypatch)
  _longer_k2(results, [41.0, 41.0])
  # test_x8 is 3 above test/perplexity in every run; its own floor, 9.0, is not test/perplexity's 0.25.
  (tmp_path / "floor.json").write_text(json.dumps({"sotu": {"test/perplexity": 0.25, "test_x8/perplexity": 9.0}}))
  tabulate.write_report([str(results / "longer" / "*" / "*")], str(tmp_path / "out"), metric="test/perplexity",
                        shorter=(str(results / "lm" / "clipping" / "*" / "*"),), judge=("test_x8/perplexity",))
  table = (tmp_path / "out" / "table.md").read_text()
  main, judged = table.split("On test_x8/perplexity (each run's last value), held to its own noise floor: 9.00 at 100 "
                             "steps (sotu, the largest at any budget)")
  # k = 2 against k = 16: 8.5 apart at the shorter budget, 10 at this one. Against 0.25 the verdict held; against
  # 9.0 it is not separated, then worse.
  assert "- held: k=2 against k=16: worse by 8.50 at the shorter budget, worse by 10.00 at this one" in main
  assert ("- changed: k=2 against k=16: not separated at the shorter budget, worse by 10.00 at this one (2 and 2 "
          "runs)") in judged


def test_judging_a_metric_without_shorter_runs_is_refused_before_any_run_is_read(tmp_path):
  with pytest.raises(ValueError, match=r"judge=\['test/loss'\] without shorter runs; allowed: judge with shorter"):
    tabulate.write_report([str(tmp_path / "none" / "*")], str(tmp_path / "out"), metric="test/bleu",
                          judge="test/loss")
  from experiments import sweeps
  sweep = sweeps.Sweep("judged", "", (), report=tabulate.ReportSpec(metric="test/bleu", judge="test/loss"))
  with pytest.raises(ValueError, match=r"sweep 'judged' judges \['test/loss'\] but has no shorter sweeps"):
    sweeps.register(sweep)
  assert "judged" not in sweeps.SWEEPS


def test_a_loss_and_its_floor_are_printed_with_three_decimals(results, tmp_path):
  def loss_run(path, seed, loss, devices=1):
    path = _workdir(path, {**CELL, "dataset": "bible_fr_en", "seed": seed}, [{"step": 100, "test/loss": loss}])
    record = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**record, "num_devices": devices}))

  for seed, loss in enumerate([2.8224, 2.7666]):
    loss_run(results / "translation" / "table1" / "shaw" / f"seed{seed}", seed, loss)
  loss_run(results / "noise" / "translation_shaw" / "devices2" / "seed0", 0, 2.7590, devices=2)
  floor = noise.write(str(tmp_path / "out"), str(results / "noise"), str(results))
  assert floor["bible_fr_en"] == {"test/loss": pytest.approx(0.0634)}
  table = (tmp_path / "out" / "floor.md").read_text()
  row = "| translation_shaw | 100 | test/loss | 2.822 | - | - | 2.759 | - | **0.063** | 2.767-2.822 (0.056, 2 seeds) |"
  assert row in table
  assert "bible_fr_en: test/loss 0.063" in table
