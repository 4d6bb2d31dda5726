"""The pairs of cells whose verdict hangs on the noise floor: what to re-read when the floor moves.

Every finished run under the results root (the noise folder's retrainings
left out) is grouped into cells by its config without the seed; a cell is
named by its folder. For each metric with a floor (``experiments.noise``,
``test_long`` held to ``test``'s), every pair of cells of one data set, and
every cell against each baseline that has the metric, is judged with
:func:`experiments.noise.verdict`; the pairs whose ranges are apart by
between 1 - ``--margin`` and 1 + ``--margin`` times the floor are printed,
nearest the floor first. The margin is a fraction of each metric's own
floor, so BLEU, loss and perplexity, whose floors differ twentyfold, share
one scale. A pair is held to the floor of its cells' budgets
(``num_train_steps``: :func:`experiments.noise.floor_of`). A cell of one
seed is listed as such. After a floor changes, every README sentence about
a pair listed here is the one to re-read.

    python -m experiments.near_floor --margin 0.15
"""

from __future__ import annotations

import collections
import glob
import os
from typing import Optional, Sequence

from absl import app
from absl import flags

from experiments import baselines
from experiments import noise
from experiments import runs as runs_lib

FLAGS = flags.FLAGS
METRICS = {"bible_fr_en": ("test/bleu", "test/loss", "test_long/bleu"), "sotu": noise.METRICS["sotu"]}


def cells(root: str) -> dict[tuple[str, str, Optional[int]], dict[str, list[float]]]:
  """``{(data set, cell folder, budget): {metric: values over seeds}}`` of the finished runs under ``root``; the
  budget is ``num_train_steps``."""
  found: dict = collections.defaultdict(lambda: collections.defaultdict(list))
  names: dict[str, str] = {}
  pattern = os.path.join(root, "**", "seed*")
  for run in runs_lib.load_runs(glob.glob(pattern, recursive=True)):
    folder = os.path.relpath(os.path.dirname(run.workdir), root)
    if folder.split(os.sep)[0] == "noise":
      continue
    dataset = run.config.get("dataset")
    key = runs_lib.canonical(runs_lib.shared_config(run))
    name = names.setdefault(key, folder)  # one cell reached through two folders keeps the first
    for metric in METRICS.get(dataset, ()):
      last = run.last(metric)
      if last is not None:
        found[(dataset, name, run.config.get("num_train_steps"))][metric].append(last[1])
  return found


def near(root: str, margin: float) -> list[tuple[float, str]]:
  """(|gap / floor - 1|, line) of every pair whose gap is between 1 - ``margin`` and 1 + ``margin`` times its floor
  (the floor of both cells' budgets: :func:`experiments.noise.floor_of`)."""
  out = []
  by_dataset = collections.defaultdict(dict)
  for (dataset, name, budget), metrics in cells(root).items():
    by_dataset[dataset][name] = (budget, metrics)
  for dataset, named in by_dataset.items():
    for metric in METRICS[dataset]:
      lower = baselines.lower_is_better(metric)
      groups = [(n, b, m[metric]) for n, (b, m) in sorted(named.items()) if m.get(metric)]
      groups += [(f"baseline: {name}", None, [v]) for name, v in baselines.of_metric(metric).items()]
      for i, (a, a_budget, va) in enumerate(groups):
        for b, b_budget, vb in groups[i + 1:]:
          found = noise.floor_of(dataset, metric, *(x for x in (a_budget, b_budget) if x is not None))
          if found is None:
            continue
          floor = found[0]
          gap = max(min(va) - max(vb), min(vb) - max(va))
          if abs(gap - floor) <= margin * floor:
            single = [n for n, v in ((a, va), (b, vb)) if len(v) == 1 and not n.startswith("baseline")]
            judged = f"not judged (one seed: {', '.join(single)})" if single else noise.verdict(va, vb, floor, lower)
            at = "" if found[2] is None else f" at {found[2]:,} steps"
            out.append((abs(gap - floor) / floor, f"{metric} (floor {floor:.3f}{at}): {a} against {b}, apart by "
                                                  f"{gap:.3f} ({gap / floor:.2f}x the floor): {judged}"))
  return sorted(out)


def define_flags() -> None:
  flags.DEFINE_string("root", noise.RESULTS, "The committed results.")
  flags.DEFINE_float("margin", 0.15, "List the pairs whose gap is between 1 - margin and 1 + margin times the floor.",
                     lower_bound=0.0)


def main(argv: Sequence[str]) -> None:
  del argv
  lines = near(FLAGS.root, FLAGS.margin)
  print("\n".join(line for _, line in lines) or f"no pair within {FLAGS.margin:g} of its floor, as a fraction of it")


if __name__ == "__main__":
  define_flags()
  app.run(main)
