"""Tabulates and plots finished runs: a Markdown table, a CSV, a JSON of every run and a PNG.

  python -m experiments.report "workdirs/sweeps/clipping/table2/*/*" --metric test/exact_match \\
      --x max_distance --paper table2 --out experiments/results/clipping/table2
  python -m experiments.report "workdirs/sweeps/length/*/*" --by_length --out experiments/results/length

Runs are read from the workdirs the globs match (each with ``config.json``
and ``metrics.jsonl``) and grouped by their config with the seed left out, so
the seeds of one variant form a group; a group is named by the config keys
that tell the groups apart (``max_distance=4``). A run's value is the metric
in the last record of ``metrics.jsonl`` that has it. Each group gets the mean,
the sample standard deviation (ddof 1; "-" for a single run) and the min and
max over its runs, and, with ``--paper tableN``, Shaw et al.'s number for the
cell its config describes (experiments/paper.py).

Each flag is the field of the same name of :class:`experiments.spec.ReportSpec`
(documented there), which is what a sweep declares (``experiments/sweeps.py``).
``--bound``, ``--target`` and ``--attention`` are served by the columns and
sections of :mod:`experiments.arithmetic`, which this module imports so that
they are registered; :func:`write_report` here is
:func:`experiments.tabulate.write_report` with every column of the project
registered.

Outputs in ``--out``: ``table.md`` (headed by the command that regenerates
it), ``results.csv``, ``runs.json``, ``plot.png`` (and ``curve.png`` with
``--curve``); see :mod:`experiments.tabulate`.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys

from absl import app
from absl import flags

from experiments import arithmetic  # registers the ceiling column and the checks, bounds and attention sections
from experiments import baselines  # registers the baselines section
from experiments import budgets  # registers the shorter-budget section
from experiments import learning_curves  # registers the learning-curves section
from experiments import paper
from experiments.spec import ReportSpec
from experiments.tabulate import write_report

__all__ = ["ReportSpec", "write_report"]
FLAGS = flags.FLAGS


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
  """The command line: one flag per ReportSpec field, and ``--out``.

  Defined only when this module is the program: the other commands of experiments/ have an ``--out`` too.
  """
  flags.DEFINE_string("metric", None, "Metric name in metrics.jsonl, e.g. test/exact_match.", flag_values=fv)
  flags.DEFINE_string("x", None, "Numeric config key to order and plot the groups by, e.g. max_distance.",
                      flag_values=fv)
  flags.DEFINE_multi_string("also", [], "More metrics of the same runs: a column each (mean ± std [min, max]).",
                            flag_values=fv)
  flags.DEFINE_multi_string("curve", [], "Metrics to draw in curve.png, in order, as one line per group over them "
                            "(e.g. test/perplexity, then test_x2/perplexity, ...).", flag_values=fv)
  flags.DEFINE_multi_string("steps", [], "Metrics to draw against the training step in learning_curves.png, one "
                            "line per run (e.g. validation/bleu).", flag_values=fv)
  flags.DEFINE_multi_string("shorter", [], "Globs of runs of the same cells at a shorter budget, set beside each "
                            "group with the change and whether it is above the noise floor.", flag_values=fv)
  flags.DEFINE_multi_string("judge", [], "More metrics on which the pairs of groups are judged at both budgets, "
                            "each against its own noise floor (with --shorter).", flag_values=fv)
  flags.DEFINE_enum("paper", None, list(paper.TABLES), "The paper's table to print beside the metric.",
                    flag_values=fv)
  flags.DEFINE_multi_enum("bound", [], list(arithmetic.VIEWS),
                          "Arithmetic runs: hold each group to the ceiling of what its scheme sees.", flag_values=fv)
  flags.DEFINE_float("target", None, "Check that every run of every unbounded group reaches this value.",
                     flag_values=fv)
  flags.DEFINE_bool("attention", False, "Arithmetic runs: encoder attention maps of the lowest-seed runs.",
                    flag_values=fv)
  flags.DEFINE_bool("by_length", False, "Exact match against input length (eval_by_length runs).", flag_values=fv)
  flags.DEFINE_string("title", None, "Plot title (default: the metric).", flag_values=fv)
  flags.DEFINE_string("out", None, "Output directory.", required=True, flag_values=fv)


def spec_from_flags(fv: flags.FlagValues = flags.FLAGS) -> ReportSpec:
  """The ReportSpec the parsed flags describe (each field from the flag of its name)."""
  return ReportSpec(**{f.name: fv[f.name].value for f in dataclasses.fields(ReportSpec)})


def main(argv):
  if len(argv) < 2:
    raise app.UsageError("name one or more workdir globs, e.g. 'workdirs/sweeps/lm/clipping/*/*'")
  command = "python -m experiments.report " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  try:
    spec = spec_from_flags()
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  write_report(argv[1:], FLAGS.out, spec, command=command)
  with open(os.path.join(FLAGS.out, "table.md"), encoding="utf-8") as f:
    print(f.read())


if __name__ == "__main__":
  define_flags()
  app.run(main)
