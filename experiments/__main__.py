"""The experiments app: ``python -m experiments VERB [flags]``, run from the repository root.

  python -m experiments sweep NAME [--executor=local|slurm|debug] [--workers N] [--print] [--root DIR]   # train
  python -m experiments sweep NAME --status                               # every run: state, step, ETA, log
  python -m experiments sweep --list                                      # the sweeps, from configs/<task>.py
  python -m experiments baselines [--out DIR]                             # the real-text tables' baselines
  python -m experiments tables                                            # the one report: the protocol's tables
  python -m experiments bench step|attention [flags]                      # the benchmarks

Each verb is a module with ``define_flags()`` and ``main(argv)``: ``experiments/sweep.py``,
``baselines.py``, ``tables.py`` and the benchmarks' (``BENCHMARKS``); ``python -m experiments VERB --help`` lists its
flags. A bad verb or flag is one line on stderr and exit status 2; a sweep a signal stopped exits with 3
(``rpr.stop.STOPPED``).
"""

import importlib
import sys

VERBS = {"sweep": "experiments.sweep", "baselines": "experiments.baselines", "tables": "experiments.tables",
         "bench": None}
BENCHMARKS = {"step": "experiments.bench.step", "attention": "experiments.bench.attention_report"}


def _fail(message: str) -> None:
  print(f"python -m experiments: error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def _module(argv: list[str]) -> tuple[str, list[str]]:
  """The verb's module and the arguments it parses (program name first)."""
  if argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)
  if len(argv) < 2 or argv[1] not in VERBS:
    _fail(f"verb {argv[1] if len(argv) > 1 else None!r}; allowed: {', '.join(VERBS)}")
  verb = argv[1]
  if verb != "bench":
    return VERBS[verb], [f"experiments {verb}", *argv[2:]]
  if len(argv) < 3 or argv[2] not in BENCHMARKS:
    _fail(f"bench {argv[2] if len(argv) > 2 else None!r}; allowed: {', '.join(BENCHMARKS)}")
  return BENCHMARKS[argv[2]], [f"experiments bench {argv[2]}", *argv[3:]]


def main() -> None:
  name, argv = _module(sys.argv)
  if name == "experiments.sweep":  # glibc's allocator setting first, for this process and its workers
    from rpr import malloc

    malloc.apply()
  from absl import app
  from absl import flags

  module = importlib.import_module(name)
  module.define_flags()

  def parse(args):
    try:
      return flags.FLAGS(args)
    except flags.Error as e:
      _fail(f"{argv[0]}: {e}")

  def run(args):
    try:
      status = module.main(args)
    except app.UsageError as e:
      _fail(f"{argv[0]}: {e}")
    sys.exit(status or 0)

  app.run(run, argv=argv, flags_parser=parse)


if __name__ == "__main__":
  main()
