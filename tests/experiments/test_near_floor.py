"""experiments.near_floor: the pairs of cells whose verdict hangs on the noise floor."""

import json

from experiments import baselines
from experiments import near_floor
from experiments import noise
from tests.experiments.test_noise import _lm_run


def test_the_pairs_within_the_margin_of_the_floor_are_listed_closest_first(tmp_path, monkeypatch):
  monkeypatch.setattr(noise, "FLOOR_FILE", str(tmp_path / "floor.json"))
  (tmp_path / "floor.json").write_text(json.dumps({"sotu": {"test/perplexity": 0.5}}))
  monkeypatch.setattr(baselines, "RESULTS", str(tmp_path / "baselines.json"))
  (tmp_path / "baselines.json").write_text(json.dumps({"translation": {}, "lm": {"chosen_order": "6", "orders": {
      "6": {"splits": {"test": {"perplexity": 38.2}}}}}}))
  root = tmp_path / "results"
  for seed, (a, b, c) in enumerate([(40.0, 40.55, 45.0), (40.5, 41.0, 45.2)]):  # test/perplexity of three cells
    _lm_run(root / "lm" / "clipping" / "k=8" / f"seed{seed}", seed, a, max_distance=8)
    _lm_run(root / "lm" / "clipping" / "k=16" / f"seed{seed}", seed, b, max_distance=16)
    _lm_run(root / "lm" / "clipping" / "k=0" / f"seed{seed}", seed, c, max_distance=0)
  _lm_run(root / "lm" / "curves" / "k=16" / "seed0", 0, 39.35, num_train_steps=400)  # one seed
  _lm_run(root / "noise" / "lm_k16" / "same" / "seed0", 0, 41.2)  # a retraining, not a cell: left out
  listed = lambda margin: [line for _, line in near_floor.near(str(root), margin)
                           if line.startswith("test/")]  # 2x-8x (held to test's floor here) repeat these gaps
  # Gaps, over the 0.5 floor: k = 8 (40-40.5) and k = 16 (40.55-41) 0.05 apart, 0.1x; the curve cell (39.35) 0.65
  # under k = 8 (1.3x), 1.2 under k = 16 (2.4x) and 1.15 above the baseline (38.2, 2.3x); k = 0 (45-45.2) far
  # from all. The margin is a fraction of the floor: none is within 0.25 of it, one within 0.35.
  assert listed(0.25) == []
  assert listed(0.35) == ["test/perplexity (floor 0.500): lm/clipping/k=8 against lm/curves/k=16, apart by 0.650 "
                          "(1.30x the floor): not judged (one seed: lm/curves/k=16)"]
  lines = listed(0.95)
  assert lines[-1] == ("test/perplexity (floor 0.500): lm/clipping/k=16 against lm/clipping/k=8, apart by 0.050 "
                       "(0.10x the floor): not separated")  # nearest the floor first: 0.9 from it, the farthest
  assert not any("noise" in line or "k=0" in line for line in lines)


def test_a_pair_of_cells_at_a_budget_with_its_own_floor_is_held_to_it(tmp_path, monkeypatch):
  monkeypatch.setattr(noise, "FLOOR_FILE", str(tmp_path / "floor.json"))
  (tmp_path / "floor.json").write_text(json.dumps({"sotu": {"test/perplexity": 0.5}}))
  (tmp_path / noise.BUDGETS_FILE).write_text(json.dumps(
      {"sotu": {"test/perplexity": {"400": {"floor": 0.3, "cells": ["a", "b"]}}}}))
  monkeypatch.setattr(baselines, "RESULTS", str(tmp_path / "none.json"))
  root = tmp_path / "results"
  for seed, (a, b) in enumerate([(40.0, 40.82), (40.5, 41.0)]):  # 0.32 apart at 400 steps: 0.64x the largest floor
    _lm_run(root / "lm" / "curves" / "k=8" / f"seed{seed}", seed, a, max_distance=8, num_train_steps=400)
    _lm_run(root / "lm" / "curves" / "k=16" / f"seed{seed}", seed, b, max_distance=16, num_train_steps=400)
  lines = [line for _, line in near_floor.near(str(root), 0.15) if line.startswith("test/")]
  assert lines == ["test/perplexity (floor 0.300 at 400 steps): lm/curves/k=16 against lm/curves/k=8, apart by 0.320 "
                   "(1.07x the floor): worse by 0.32"]
