"""experiments.tables: the protocol's tables from run records, with their statistics, CSVs and the README's copy."""

import csv
import gzip
import random
import re
import dataclasses
import json
import pathlib

import ml_collections
import pytest

from experiments import protocol
from experiments import stats
from experiments import status as status_lib
from experiments import tables

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(path: pathlib.Path, seed: int, bleu: float, steps: int = 100, finished: bool = True) -> None:
  path.mkdir(parents=True)
  config = {"dataset": "bible_fr_en", "seed": seed, "num_train_steps": steps}
  (path / "config.json").write_text(json.dumps({"config": config, "model_config": {}}))
  records = [{"step": 50, "test/bleu": 99.0}, {"step": steps if finished else 60, "validation/bleu": 1.0}]
  if finished:
    records.append({"step": steps, "test/bleu": bleu, "test/chrf": bleu + 20, "test/loss": 2.0,
                    "test_avg/bleu": bleu + 0.5})
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


REFERENCE, BETTER, SAME = [20.0, 20.5, 19.5, 20.2, 19.8], [24.0, 24.4, 23.7, 24.2, 23.9], [20.1, 19.6, 20.4]
TABLE = protocol.Table("t", "A table", "test/bleu", (protocol.Row("a", "absolute", 26.5), protocol.Row("b"),
                                                    protocol.Row("c"), protocol.Row("d"), protocol.Row("e")),
                     "a", "x/{cell}", baselines=(("copy", 0.14),), note="One line.")


@pytest.fixture
def root(tmp_path):
  for cell, values in (("a", REFERENCE), ("b", BETTER), ("c", SAME), ("d", [22.0])):
    for seed, v in enumerate(values):
      _run(tmp_path / "x" / cell / f"seed{seed}", seed, v)
  _run(tmp_path / "x" / "e" / "seed0", 0, 0.0, finished=False)  # still training: not in the table
  _run(tmp_path / "x" / "c" / "seed9", 9, 50.0, steps=200, finished=False)
  return tmp_path


def test_a_table_reads_each_finished_run_at_its_last_step(root):
  records = tables.frame(TABLE, str(root))
  assert [(r["cell"], r["seed"]) for r in records] == [("a", s) for s in range(5)] + [("b", s) for s in range(5)] + [
      ("c", s) for s in range(3)] + [("d", 0)]
  assert [r["test/bleu"] for r in records] == REFERENCE + BETTER + SAME + [22.0]  # not step 50's 99
  assert {r["steps"] for r in records} == {100}


def test_a_row_also_reads_the_runs_another_sweep_trained_for_it(root):
  # A pilot's runs at the chosen budget are the cell's seeds 0-1 (Run.same_as); its folder holds seeds 2-4.
  for seed, v in zip((2, 3, 4), (21.0, 21.5, 20.5)):
    _run(root / "x" / "f" / f"seed{seed}", seed, v)
  for seed, v in zip((0, 1), (20.0, 22.0)):
    _run(root / "pilot" / "f,steps=100" / f"seed{seed}", seed, v)
  table = dataclasses.replace(TABLE, rows=(protocol.Row("f", also=("pilot/f,steps=100",)),))
  records = tables.frame(table, str(root))
  assert [(r["seed"], r["test/bleu"]) for r in records] == [(0, 20.0), (1, 22.0), (2, 21.0), (3, 21.5), (4, 20.5)]


def test_a_table_gives_the_libraries_statistics_and_a_verdict_per_row(root):
  text = tables.markdown(TABLE, tables.frame(TABLE, str(root)))
  rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| ")}
  expected = stats.compare(REFERENCE, {"b": BETTER, "c": SAME, "d": [22.0]}, "a")
  ci = stats.cell(BETTER)
  # The mean of the last checkpoints beside the final state's (the fixture scores them 0.5 higher), untested.
  averaged = stats.cell([v + 0.5 for v in BETTER])
  assert (f"| {ci.mean:.2f} ± {(ci.high - ci.low) / 2:.2f} | 5 (100) | "
          f"{averaged.mean:.2f} ± {(averaged.high - averaged.low) / 2:.2f} |") in rows["`b`"]
  assert "| last checkpoints averaged |" in text and "| 22.00 | 1 (100) | 22.50 |" in rows["`d`"]
  unaveraged = [{**x, "test_avg/bleu": None} if (x["cell"], x["seed"]) == ("b", 0) else x
                for x in tables.frame(TABLE, str(root))]
  assert "| 5 (100) | - |" in tables.markdown(TABLE, unaveraged)  # not a mean over 4 of the 5 seeds
  b = expected["b"]
  assert f"{b.diff:+.2f} [{b.low:+.2f}, {b.high:+.2f}]" in rows["`b`"] and rows["`b`"].endswith("| b > a (better) |")
  assert b.p_holm < 0.001 and "< 0.001" in rows["`b`"]
  c = expected["c"]
  assert c.verdict == "not separated" and rows["`c`"].endswith(f"| not separated (MDE {c.mde:.2f}) |")
  assert f"| {c.p_holm:.3f} |" in rows["`c`"]  # Holm over b and c: d has one seed
  assert rows["`d`"].endswith("| not tested (< 2 seeds a side) |") and "+2.00" in rows["`d`"]
  assert "| no finished run |" in rows["`e`"]
  assert rows["`a`"].startswith("| absolute | `a` | 26.50 |") and "reference" in rows["`a`"]
  assert rows["baseline"] == "| copy | baseline |  | 0.14 |  |  |  |  |  |"
  assert text.startswith("**A table**") and text.endswith("One line.")
  # Lower is better for a perplexity: the same higher values read as worse.
  lower = dataclasses.replace(TABLE, metric="test/perplexity")
  records = [{**r, "test/perplexity": r["test/bleu"]} for r in tables.frame(TABLE, str(root))]
  said = {line.split(" | ")[1]: line for line in tables.markdown(lower, records).splitlines() if line.startswith("| ")}
  assert said["`b`"].endswith("| b > a (worse) |")


def test_the_command_writes_a_csv_per_table_with_a_row_per_cell_and_seed(root, monkeypatch, tmp_path):
  monkeypatch.setattr(protocol, "protocol_tables", lambda root: [TABLE])
  out = tmp_path / "paper"
  block = tables.write(str(root), str(out))
  with open(out / "t.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0]) == ["cell", "seed", "steps", "test/bleu", "test/chrf", "test/loss", "test_avg/bleu"]
  assert [(r["cell"], r["seed"], float(r["test/bleu"])) for r in rows][:2] == [("a", "0", 20.0), ("a", "1", 20.5)]
  assert len(rows) == 14
  readme = (out / "README.md").read_text()
  assert "python -m experiments tables" in readme and block.split("\n\nThe three")[0] in readme
  assert (out / "t.png").read_bytes().startswith(b"\x89PNG") and "![A table](t.png)" in readme


def test_the_readme_opens_its_results_with_the_generated_tables(committed_runs_only):
  """After a run lands: `python -m experiments tables` rewrites the README's copy and experiments/results/paper/."""
  generated = tables.readme_block(protocol.protocol_tables(str(ROOT / tables.RESULTS)), str(ROOT / tables.RESULTS))
  assert tables.readme_copy(str(ROOT / "README.md")) == generated
  written = (ROOT / tables.OUT / "README.md").read_text()
  answered = re.search(r"\n\nThe three questions.*?(?=\n\n\*\*)", generated, re.S)  # the pilots follow them
  assert answered and generated.index("**Table 1") < answered.start() < generated.index("**Pilot")
  tables_part = generated.replace(answered.group(), "")
  assert all(section in written for section in tables_part.split("\n\n**"))


def test_each_headline_table_falls_back_to_its_history_until_one_of_its_rows_is_tested(root):
  history = protocol.Table("history_t", "Old table", "test/bleu", (protocol.Row("a"),), "a", "x/{cell}")
  rows = (protocol.Row("a"), protocol.Row("b"))
  empty = protocol.Table("t", "New table", "test/bleu", rows, "a", "y/{cell}", headline=True)
  assert tables.readme_block([empty, history], str(root)).startswith("**Old table**")
  only_reference = dataclasses.replace(empty, rows=(protocol.Row("a", folder="x/a"), protocol.Row("b")))
  assert tables.readme_block([only_reference, history], str(root)).startswith("**Old table**")  # compares nothing
  one_seed = dataclasses.replace(empty, rows=(protocol.Row("a", folder="x/a"), protocol.Row("d", folder="x/d")))
  assert tables.readme_block([one_seed, history], str(root)).startswith("**Old table**")  # d has 1 seed: no test
  assert tables.readme_block([dataclasses.replace(empty, folder="x/{cell}"), history], str(root)).startswith(
      "**New table**")


def test_one_table_alone_is_headed_by_its_command_and_reads_a_folder_per_run(root, tmp_path):
  rows = (protocol.Row("a", folder="a/seed1"), protocol.Row("b", folder="b/seed0"))
  one = protocol.Table("plot", "Runs", "test/bleu", rows, "a", runs="", baselines=(("bound", 30.0),), digits=4)
  text = tables.write_one(one, str(root / "x"), str(tmp_path / "report"), "python run.py")
  assert text == (tmp_path / "report" / "table.md").read_text() and text.startswith("Generated by `python run.py`.")
  rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
  assert "| 20.5000 | 1 (100) | 21.0000 | reference |" in rows["`a`"] and "| +3.5000 |" in rows["`b`"]
  # No row has anything of the paper's, so its two columns are left out; a baseline is named in the cell column.
  assert rows["cell"].startswith("| cell | ours (mean ± 95% CI) | n (steps) |") and "paper" not in text
  assert rows["bound"] == "| bound | 30.0000 |  |  |  |  |  |"
  assert (tmp_path / "report" / "plot.png").exists() and (tmp_path / "report" / "plot.csv").exists()


def test_every_committed_run_is_finished(committed_workdirs):
  # A run's records are committed when it has finished (its last step and that step's evaluations), never while
  # it trains: a table would count a half-trained run, or leave it out and say so only in passing.
  assert len(committed_workdirs) > 100, committed_workdirs
  unfinished = []
  for workdir in committed_workdirs:
    config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text())["config"])
    if not status_lib.finished(str(workdir), config):
      unfinished.append(str(workdir.relative_to(ROOT)))
  assert not unfinished, unfinished


def _decoded(run: pathlib.Path, lines) -> None:
  (run / "decoded").mkdir()
  with gzip.open(run / "decoded" / "test.txt.gz", "wt", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))


def test_the_test_set_column_is_sacrebleus_paired_bootstrap_seed_against_seed_cached_by_the_outputs(root, tmp_path):
  rng = random.Random(0)
  words = "the lord said unto moses go and speak to the children of israel that they".split()
  references = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(60)]
  cut = [" ".join(r.split()[:4]) for r in references]  # a quarter of each reference
  even = [r if i % 2 == 0 else c for i, (r, c) in enumerate(zip(references, cut))]
  odd = [c if i % 2 == 0 else r for i, (r, c) in enumerate(zip(references, cut))]  # as good as even, not the same
  for seed in range(3):
    _decoded(root / "x" / "a" / f"seed{seed}", even)
    _decoded(root / "x" / "b" / f"seed{seed}", cut)
    _decoded(root / "x" / "c" / f"seed{seed}", odd)
  asked = []

  def refs(run_dir):
    asked.append(run_dir)
    return references

  cache = {}
  boot = tables.bootstrap(TABLE, str(root), cache, refs)
  assert set(boot) == {"b", "c"} and len(boot["b"]) == len(boot["c"]) == 3  # d has no outputs; a is the reference
  assert all(p < 0.05 for p in boot["b"]) and all(p > 0.05 for p in boot["c"]), boot
  assert boot["b"][0] == stats.paired_bootstrap(references, even, cut)
  assert len(cache) == 6 and len(asked) == 6
  text = tables.markdown(TABLE, tables.frame(TABLE, str(root)), boot=boot)
  rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| ")}
  assert rows["`b`"].endswith("| 3 of 3 |") and rows["`c`"].endswith("| 0 of 3 |") and rows["`d`"].endswith("|  |")
  # Cached: nothing is recomputed, and the data set is not asked for again...
  assert tables.bootstrap(TABLE, str(root), cache, tables._not_cached) == boot
  # ... until an output changes.
  changed = root / "x" / "b" / "seed1" / "decoded" / "test.txt.gz"
  with gzip.open(changed, "wt", encoding="utf-8") as f:
    f.write("".join(r + "\n" for r in references))
  with pytest.raises(ValueError, match="run python -m experiments tables"):
    tables.bootstrap(TABLE, str(root), cache, tables._not_cached)


def test_the_renderer_writes_a_missing_value_as_a_dash_in_markdown_and_empty_in_a_csv(tmp_path):
  from experiments import render

  assert [render.fmt(v, 2) for v in (None, float("nan"), 1.234)] == ["-", "-", "1.23"]
  assert render.markdown_table(["a", "b"], [[1, "x"]], ["---", render.RIGHT]) == "| a | b |\n| --- | ---: |\n| 1 | x |"
  render.write_csv(str(tmp_path / "t.csv"), ["a", "b"], [[None, float("nan")], [1, 2.5]])
  assert (tmp_path / "t.csv").read_text().splitlines() == ["a,b", ",", "1,2.5"]


def test_a_cell_keeps_its_colour_in_every_plot_and_colours_differ_within_one():
  from experiments import render

  table1, table2 = render.colours(["sinusoidal", "shaw", "rope"]), render.colours(["k=0", "shaw", "k=64"])
  assert table1[1] == table2[1]  # shaw
  assert render.colours(["shaw,steps=8000", "sinusoidal,steps=8000"]) == table1[1::-1]  # a pilot's runs: their cells'
  for names in (list(render.CELLS), ["shaw,steps=4000", "shaw,steps=8000"], ["new", "shaw", "other"]):
    assert len(set(render.colours(names))) == len(names), names  # distinct within a plot, unknown names included


def test_a_plot_without_learning_curves_is_one_column_and_draws_without_warnings(monkeypatch, tmp_path):
  # python run.py's arithmetic runs score the test set at their end only: no curve, so no empty curve panel.
  import warnings

  from experiments import render

  figures = []
  monkeypatch.setattr(render, "save", lambda fig, path: figures.append(fig))
  finals_only = [("shaw", [0.99, 0.98], []), ("none", [0.1], [])]
  curves = [("shaw", [0.99], [([1, 2], [0.5, 0.9])]), ("none", [0.1], [([1, 2], [0.1, 0.1])])]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # matplotlib warns of a legend without labelled artists
    render.table_plot(str(tmp_path / "a.png"), "t", "test/exact_match", finals_only)
    render.table_plot(str(tmp_path / "b.png"), "t", "test/exact_match", curves, baselines=(("bound", 0.15),))
  assert [len(f.axes) for f in figures] == [1, 2]
  assert [bool(ax.get_legend()) for ax in figures[1].axes] == [True, True]  # the baseline's; the cells' means


def test_the_budget_rule_section_says_which_pairs_wait_and_takes_the_largest_budget_when_every_pair_fails(tmp_path):
  def pilot_run(cell, budget, seed, value):
    path = tmp_path / "pilot" / "translation" / f"{cell},steps={budget}" / f"seed{seed}"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"config": {"seed": seed, "num_train_steps": budget},
                                                  "model_config": {}}))
    (path / "metrics.jsonl").write_text(json.dumps({"step": budget, "validation/bleu": value}) + "\n")

  for budget, gain in ((4000, 0.0), (8000, 4.0), (16000, 7.0)):  # every step gains far more than the seeds differ
    for seed in (0, 1):
      pilot_run("shaw", budget, seed, 15.0 + gain + 0.1 * seed)
      pilot_run("sinusoidal", budget, seed, 12.0 + gain + 0.1 * seed)
  pilot_run("shaw", 32000, 0, 24.0)
  text = tables.budget_section(str(tmp_path))
  assert ("**Budget rule, `pilot/translation`** (no budget chosen yet: 16,000 vs 32,000 judged once each has 2 "
          "finished seeds of every cell)") in text
  assert "(no budget chosen yet: 8,000 vs 16,000, 16,000 vs 32,000 judged once" in text  # the LM: no run yet
  pilot_run("shaw", 32000, 1, 24.1)
  for seed in (0, 1):
    pilot_run("sinusoidal", 32000, seed, 21.0 + 0.1 * seed)
  text = tables.budget_section(str(tmp_path))
  assert "(the budget is 32,000 steps, the largest: every pair fails)" in text
  assert "| 16,000 vs 32,000 | 22.05 / 24.05 | 19.05 / 21.05 | 0.07 | fails |" in text
