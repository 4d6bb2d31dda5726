"""Runs read from their workdirs: path order with numbers as numbers, restarts, old records, flat configs."""

import json
import pathlib

from experiments import runs as runs_lib


def _workdir(path: pathlib.Path, config: dict, records: list[dict]) -> pathlib.Path:
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps({"config": config, "model_config": {}}))
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def test_runs_are_read_in_path_order_with_numbers_compared_as_numbers(tmp_path):
  for k in (256, 4, 0):
    for seed in (2, 0, 1):
      _workdir(tmp_path / f"k={k}" / f"seed{seed}", {"dataset": "arithmetic", "seed": seed}, [{"step": 1}])
  (tmp_path / "k=4" / "not_a_run").mkdir()  # matched by the glob, passed over
  names = [pathlib.Path(r.workdir).relative_to(tmp_path).as_posix()
           for r in runs_lib.load_runs([str(tmp_path / "*" / "*")])]
  assert names == [f"k={k}/seed{s}" for k in (0, 4, 256) for s in (0, 1, 2)]  # k=256 after k=4, not before
  assert sorted(["seed10", "k=16", "seed2", "k=2", "alibi"], key=runs_lib.natural_key) == [
      "alibi", "k=2", "k=16", "seed2", "seed10"]


def test_a_restarted_run_keeps_its_later_records_and_reads_its_last_value_and_series(tmp_path):
  records = [{"step": 50, "validation/bleu": 1.0}, {"step": 100, "validation/bleu": 2.0},
             {"step": 50, "validation/bleu": 1.5},  # restarted from step 40: step 50 again, then on
             {"step": 100, "validation/bleu": 3.0}, {"step": 100, "train/loss": 0.1}]
  _workdir(tmp_path / "run", {"dataset": "bible_fr_en", "seed": 3, "num_train_steps": 100}, records)
  (run,) = runs_lib.load_runs([str(tmp_path / "run")])
  assert run.seed == 3 and run.end() == 100 and run.last("validation/bleu") == (100, 3.0)
  assert runs_lib.series(run, "validation/bleu") == ([50, 100], [1.5, 3.0])
  assert run.last("test/bleu") is None


def test_a_config_is_flat_by_leaf_name_and_a_name_the_top_level_has_keeps_its_prefix():
  config = runs_lib.flatten({"seed": 0, "max_length": 64, "model": {"d_model": 8, "max_length": 16,
                                                                     "shaw": {"max_distance": 4}}})
  assert config == {"seed": 0, "max_length": 64, "d_model": 8, "model.max_length": 16, "max_distance": 4}
