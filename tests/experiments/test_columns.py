"""experiments.columns: a report column is one registered function, and the arithmetic bounds are such columns."""

import csv
import json

import numpy as np
import pytest
from absl import flags

from experiments import arithmetic
from experiments import columns
from experiments import report
from experiments import sweeps
from experiments.report import ReportSpec
from tests.experiments.test_report import TABLE2, table2_runs  # noqa: F401  (a fixture)


def test_a_registered_column_appears_in_the_table_the_csv_and_runs_json(table2_runs, tmp_path, monkeypatch):
  monkeypatch.setattr(columns, "COLUMNS", dict(columns.COLUMNS))  # the toy leaves the registry as it was

  @columns.column("median", "median", csv="median", order=65, record="median", text=columns.metric_digits)
  def median(group, report):
    return float(np.median(group.values))

  groups = report.write_report([str(table2_runs / "*" / "*")], str(tmp_path), metric="test/exact_match",
                               x="max_distance")
  table = (tmp_path / "table.md").read_text()
  # After max (order 60), before the per-seed values (70); in the metric's 4 decimals.
  assert "| test/exact_match mean | std | min | max | median | per seed |" in table
  assert "| k=4 | 3 | 100 | 0.9400 | 0.0400 | 0.9000 | 0.9800 | 0.9400 | 0.9000, 0.9400, 0.9800 |" in table
  with open(tmp_path / "results.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [float(r["median"]) for r in rows] == [np.median(TABLE2[k]) for k in (0, 4, 256)]
  assert list(rows[0]) == ["variant", "x", "runs", "steps", "mean", "std", "min", "max", "median", "paper"]
  saved = json.loads((tmp_path / "runs.json").read_text())
  assert [g["median"] for g in saved] == [g.cells["median"] for g in groups] == [0.25, 0.94, 0.96]


def test_a_column_shows_where_it_applies(table2_runs, tmp_path, monkeypatch):
  monkeypatch.setattr(columns, "COLUMNS", dict(columns.COLUMNS))
  columns.column("k_squared", "k^2", shown=lambda report: report.spec.x == "max_distance")(
      lambda group, report: group.config["max_distance"] ** 2)
  report.write_report([str(table2_runs / "*" / "*")], str(tmp_path / "a"), metric="test/exact_match",
                      x="max_distance")
  table = (tmp_path / "a" / "table.md").read_text()
  assert "| per seed | k^2 |" in table and "0.9500, 0.9700, 0.9600 | 65536 |" in table  # default order: 80
  report.write_report([str(table2_runs / "*" / "*")], str(tmp_path / "b"), metric="test/exact_match")
  assert "k^2" not in (tmp_path / "b" / "table.md").read_text()
  with pytest.raises(ValueError, match="report column 'k_squared' is already registered"):
    columns.column("k_squared", "again")(lambda group, report: 0)


def test_the_arithmetic_bounds_are_registered_columns_and_sections():
  ceiling = columns.COLUMNS["ceiling"]
  assert ceiling.value is arithmetic.ceiling and ceiling.reads == ("bound",) and ceiling.record == "view"
  assert ceiling.lines is not None  # the whole-set bounds drawn on plot.png
  assert [columns.SECTIONS[s].reads for s in ("checks", "bounds", "attention")] == [("target",), (), ("attention",)]
  # Shown only where the spec asks for bounds (a real-text report has no ceiling column).
  spec = ReportSpec(metric="test/exact_match", bound=("bag",))
  assert ceiling.shown(columns.Report(spec, [], [], "")) and not ceiling.shown(
      columns.Report(ReportSpec(metric="test/bleu"), [], [], ""))
  assert {c.name for c in columns.in_table(columns.Report(spec, [], [], ""))} >= {"ceiling", "mean", "variant"}


def test_a_spec_field_that_no_registered_column_reads_fails_instead_of_being_ignored(table2_runs, tmp_path,
                                                                                    monkeypatch):
  monkeypatch.setattr(columns, "COLUMNS", {k: v for k, v in columns.COLUMNS.items() if k != "ceiling"})
  with pytest.raises(ValueError, match=r"no registered report column or section reads \['bound'\]"):
    report.write_report([str(table2_runs / "*" / "*")], str(tmp_path), metric="test/exact_match", bound=("bag",))


@pytest.mark.parametrize("name", sorted(sweeps.SWEEPS))
def test_every_sweeps_report_spec_is_its_command_line(name):
  spec = sweeps.get(name).spec()
  fv = flags.FlagValues()
  report.define_flags(fv)
  fv(["report", *spec.args(), "--out", "x"])
  assert report.spec_from_flags(fv) == spec


def test_spec_args_follow_the_field_order_and_a_spec_needs_a_metric():
  spec = ReportSpec(metric="m", also=("a", "b"), x="k", bound="bag", target=0.99, attention=True)
  assert spec.args() == ("--metric", "m", "--x", "k", "--also", "a", "--also", "b", "--bound", "bag", "--target",
                         "0.99", "--attention")
  assert spec.bound == ("bag",)  # one string is one item
  with pytest.raises(ValueError, match=r"--metric is required \(or --by_length\)"):
    ReportSpec(x="k")


def test_translation_sweeps_read_the_configs_source_length_buckets():
  from configs import translation

  also = sweeps.get("translation_table1").spec().also
  assert also == ("test/chrf", "test/bleu_by_length/1-10", "test/bleu_by_length/11-20", "test/bleu_by_length/21-30",
                  "test/bleu_by_length/31-40", "test/bleu_by_length/41-60", "test/bleu_by_length/61+")
  assert len(also) - 1 == len(translation.BUCKETS) + 1  # a bucket per bound, and the open one above the last
