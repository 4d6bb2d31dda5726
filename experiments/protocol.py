"""The protocol's tables (experiments/results/protocol.md), declared: which cells fill each row, beside the paper's.

A :class:`Table` names its rows by cell (the one name a cell has in tables, plots, folders and text), the paper's
row and number beside each (:mod:`experiments.paper`), a reference row, a metric and the baselines drawn under it.
:func:`protocol_tables` is every table ``python -m experiments tables`` writes (``experiments/tables.py``), in
order; :data:`PILOTS` are the runs the budget rule reads and :data:`QUESTIONS` the three a reader brings. Adding a
row or a table is an edit here.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Optional

from experiments import paper

TRANSLATION_CSV = ("test/bleu", "test/chrf", "test/loss", "test_avg/bleu")
LM_CSV = ("test/perplexity", "test_x8/perplexity")


@dataclasses.dataclass(frozen=True)
class Row:
  cell: str  # the cell's one name
  paper_row: str = ""  # the row as the paper names it ("" where the paper has none)
  paper: Optional[float] = None  # the paper's number (WMT14 BLEU): the shape to compare against, not the scale
  folder: str = ""  # under the results root; default: the table's folder pattern with the cell
  also: tuple[str, ...] = ()  # more folders of its runs: another sweep's, trained at the same config (same_as)


@dataclasses.dataclass(frozen=True)
class Table:
  name: str  # the CSV's file name and the section's anchor
  title: str
  metric: str
  rows: tuple[Row, ...]
  reference: str  # the cell every other row is compared with
  folder: str = ""  # "<task folder>/{cell}"
  baselines: tuple[tuple[str, float], ...] = ()  # (name, value of the metric): drawn under the table, not tested
  note: str = ""  # one line under the table
  headline: bool = False  # in the README's results
  runs: str = "seed*"  # a row's runs: this glob under its folder ("": the folder is its one run)
  digits: int = 2  # decimals of the values

  @property
  def csv_metrics(self) -> tuple[str, ...]:
    return LM_CSV if "perplexity" in self.metric else TRANSLATION_CSV if "bleu" in self.metric else ()

  def folder_of(self, row: Row) -> str:
    return row.folder or self.folder.format(cell=row.cell)

  def runs_of(self, row: Row, root: str) -> list[str]:
    """The globs of the row's runs under ``root``: its folder's, then those of :attr:`Row.also`."""
    return [os.path.join(root, f, *([self.runs] if self.runs else [])) for f in (self.folder_of(row), *row.also)]


def _baselines(root: str) -> dict[str, tuple[tuple[str, float], ...]]:
  """The committed baselines (``python -m experiments baselines``): retrieval and copy, and the Kneser-Ney LM."""
  path = os.path.join(root, "baselines", "baselines.json")
  if not os.path.exists(path):
    return {"translation": (), "lm": ()}
  with open(path, encoding="utf-8") as f:
    b = json.load(f)
  order = b["lm"]["chosen_order"]
  return {"translation": tuple((name, b["translation"][name]["test"]["bleu"]) for name in ("retrieval", "copy")),
          "lm": ((f"Kneser-Ney {order}-gram", b["lm"]["orders"][order]["splits"]["test"]["perplexity"]),)}


def trained_elsewhere(task: str, sweep: str) -> dict[str, tuple[str, ...]]:
  """Cell -> the folders of its runs in ``configs/<task>.py``'s ``sweep`` that another sweep trained at the same
  config (``same_as``: the pilot's runs at the budget it chose); {} while ``sweep`` is not declared."""
  from experiments import sweeps  # pylint: disable=import-outside-toplevel  (reads every config file)

  runs = [sweeps.Run(**r) for r in importlib.import_module(f"configs.{task}").get_sweeps().get(sweep, {"runs": ()})[
      "runs"] if r["same_as"]]
  return {name: tuple(dict.fromkeys(os.path.dirname(r.workdir("", "")) for r in runs if r.name == name))
          for name in dict.fromkeys(r.name for r in runs)}


def protocol_tables(root: str) -> list[Table]:
  """The five-seed tables the protocol fixes, then its pilots, then the earlier sweeps (history)."""
  base = _baselines(root)
  bleu, ppl = "test/bleu", "test/perplexity"
  t1 = (Row("sinusoidal", "absolute position", paper.TABLE1[("base", "absolute")]),
        Row("shaw", "relative position", paper.TABLE1[("base", "relative")]), Row("shaw+sinusoidal"))
  beside = (Row("rope"), Row("t5"), Row("alibi_directional"))
  t2 = tuple(Row("shaw" if k == 16 else f"k={k}", f"k = {k}", paper.TABLE2[k]) for k in (0, 1, 2, 4, 16, 64, 256))
  t3 = (Row("shaw", "a^V yes, a^K yes", paper.TABLE3[(True, True)]),
        Row("ak", "a^V no, a^K yes", paper.TABLE3[(False, True)]),
        Row("av", "a^V yes, a^K no", paper.TABLE3[(True, False)]),
        Row("k=0", "a^V no, a^K no", paper.TABLE3[(False, False)]))
  lm = tuple(Row(f"k={k}") for k in (0, 1, 2, 4, 8, 16, 64, 256)) + (Row("sinusoidal"),)
  tr, lmf = "paper/translation/{cell}", "paper/lm/{cell}"
  shared = {task: trained_elsewhere(task, f"{task}_paper") for task in ("translation", "lm")}
  share = lambda rows, task: tuple(dataclasses.replace(r, also=shared[task].get(r.cell, ())) for r in rows)
  t1, beside, t2, t3, lm = (*(share(rows, "translation") for rows in (t1, beside, t2, t3)), share(lm, "lm"))
  h1 = (Row("sinusoidal", "absolute position", t1[0].paper, "translation/table1/sinusoidal"),
        Row("shaw", "relative position", t1[1].paper, "translation/table1/shaw"),
        Row("shaw+sinusoidal", folder="translation/absolute/shaw+sinusoidal"),
        *(Row(r.cell, folder=f"translation/table1/{r.cell}") for r in beside))
  h2 = tuple(Row(r.cell, r.paper_row, r.paper, "translation/table1/shaw" if r.cell == "shaw" else
                 f"translation/table2/{r.cell}") for r in t2 if r.cell != "k=256")
  h3 = tuple(Row(r.cell, r.paper_row, r.paper, f"translation/table{1 if r.cell == 'shaw' else 3}/{folder}")
             for r, folder in zip(t3, ("shaw", "av=off,ak=on", "av=on,ak=off", "av=off,ak=off")))
  return [
      Table("table1", "Table 1: position information (translation, test BLEU)", bleu, t1 + beside, "sinusoidal", tr,
            base["translation"], headline=True),
      Table("table2", "Table 2: clipping distance k (translation, test BLEU)", bleu, t2, "shaw", tr,
            base["translation"], headline=True),
      Table("table3", "Table 3: a^K and a^V (translation, test BLEU)", bleu, t3, "shaw", tr, base["translation"],
            headline=True),
      Table("lm_clipping", "The clipping curve (language model, test perplexity: lower is better)", ppl, lm, "k=16",
            lmf, base["lm"], headline=True),
      *(Table(f"pilot_translation_{b}", f"Pilot at {b:,} steps with a cool-down: Shaw (k = 16) and sinusoidal "
              "(translation, test BLEU)", bleu, (Row(f"shaw,steps={b}"), Row(f"sinusoidal,steps={b}")),
              f"sinusoidal,steps={b}", "pilot/translation/{cell}", base["translation"], headline=True)
        for b in (4000, 8000, 16000, 32000)),
      Table("pilot_lm", "Pilot: the LM's size and budget with Shaw, k = 16 (language model, test perplexity: lower is "
            "better)", ppl, (Row("shaw,L2d128,steps=8000", folder="lm/curves/k=16"),  # the model before the pilot
                             *(Row(f"shaw,{size},steps={b}") for size, b in (("L2d256", 8000), ("L4d128", 8000),
                                                                           ("L4d128", 16000), ("L4d128", 32000)))),
            "shaw,L2d128,steps=8000", "pilot/lm/{cell}", base["lm"], headline=True),
      Table("history_table1", "History, 2,500 steps, no cool-down: Table 1 (translation, test BLEU)", bleu, h1,
            "sinusoidal", baselines=base["translation"]),
      Table("history_table2", "History, 2,500 steps, no cool-down: Table 2 (translation, test BLEU)", bleu, h2,
            "shaw", baselines=base["translation"]),
      Table("history_table3", "History, 2,500 steps, no cool-down: Table 3 (translation, test BLEU)", bleu, h3,
            "shaw", baselines=base["translation"]),
      Table("history_lm_clipping", "History, 2,000 steps: the clipping curve (LM, test perplexity: lower is better)",
            ppl, tuple(Row(r.cell, folder=f"lm/clipping/{r.cell}" if r.cell != "sinusoidal" else "lm/length/sinusoidal")
                       for r in lm), "k=16", baselines=base["lm"]),
  ]


# The three questions a reader brings (the issue's): each answered from its table's rows, in the table's words.
QUESTIONS = (("Shaw against sinusoidal", "table1", ("shaw",)),
             ("How k matters", "table2", ("k=0", "k=1", "k=2", "k=4", "k=64", "k=256")),
             ("How k matters in the LM", "lm_clipping", ("k=0", "k=1", "k=2", "k=4", "k=8", "k=64", "k=256")),
             ("a^K against a^V", "table3", ("ak", "av")))


# The protocol's pilots: (task folder, the metric the budget rule reads, the cells, the budgets).
PILOTS = (("pilot/translation", "validation/bleu", ("shaw", "sinusoidal"), (4000, 8000, 16000, 32000)),
          ("pilot/lm", "test/perplexity", ("shaw,L4d128",), (8000, 16000, 32000)))
