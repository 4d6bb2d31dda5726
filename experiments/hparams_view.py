"""A committed sweep in TensorBoard's HParams view: its runs' records written back as event files.

A run writes its config as HParams and its metrics as scalars into its
workdir (``rpr.writers``); the committed results keep ``config.json`` and
``metrics.jsonl`` only. This writes, for every run the globs match, the config
keys whose values differ between those runs as HParams, and every metric
record as scalars, with the runs' own TensorBoard writer (clu's), into
``<out>/<run path>``::

    python -m experiments.hparams_view 'experiments/results/lm/clipping/*/*' --out workdirs/tensorboard/lm_clipping
    tensorboard --logdir workdirs/tensorboard/lm_clipping    # the HParams tab: one row per run
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import app
from absl import flags

from experiments import runs as runs_lib
from rpr import writers

FLAGS = flags.FLAGS


def differing(configs: Sequence[dict]) -> set[str]:
  """The keys whose values are not the same in every config (a key some configs lack counts)."""
  keys = set().union(*configs)
  return {k for k in keys if len({runs_lib.canonical(c.get(k)) for c in configs}) > 1}


def export(patterns: Sequence[str], out: str) -> list[str]:
  """Writes each matched run's differing hyper-parameters and its metrics as events; returns their folders."""
  from clu.metric_writers import summary_writer  # TensorFlow: only when writing

  runs = runs_lib.load_runs(patterns)
  if not runs:
    raise app.UsageError(f"no run (a folder with config.json and metrics.jsonl) matches {list(patterns)}")
  flat = [writers.hparams(r.raw_config) for r in runs]
  keys = differing(flat) | {"seed"}
  root = os.path.commonpath([os.path.abspath(r.workdir) for r in runs]) if len(runs) > 1 else ""
  folders = []
  for run, hparams in zip(runs, flat):
    name = os.path.relpath(os.path.abspath(run.workdir), root) if root else os.path.basename(run.workdir)
    folder = os.path.join(out, name)
    writer = summary_writer.SummaryWriter(folder)
    writer.write_hparams({k: hparams[k] for k in sorted(keys) if k in hparams})
    for record in run.records:
      writer.write_scalars(record["step"], {k: v for k, v in record.items()
                                            if k != "step" and isinstance(v, (int, float))})
    writer.close()
    folders.append(folder)
  return folders


def main(argv) -> None:
  if len(argv) < 2:
    raise app.UsageError("give one or more globs of run folders, e.g. 'experiments/results/lm/clipping/*/*'")
  folders = export(argv[1:], FLAGS.out)
  print(f"wrote {len(folders)} runs under {FLAGS.out}; view them with: tensorboard --logdir {FLAGS.out}")


if __name__ == "__main__":
  flags.DEFINE_string("out", "workdirs/tensorboard", "Where the event files go (one folder per run).")
  app.run(main)
