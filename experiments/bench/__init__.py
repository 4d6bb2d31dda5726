"""The benchmarks' library: what ``python -m experiments.bench_attention`` and ``bench_memory`` measure and report.

* :mod:`~experiments.bench.attention`: attention cost per position scheme
  (time and peak memory, ratios to plain attention);
  :mod:`~experiments.bench.attention_readme` renders its README;
* :mod:`~experiments.bench.memory`: peak memory of a whole training step
  against length, dense vs chunked; :mod:`~experiments.bench.memory_readme`
  renders its README; :mod:`~experiments.bench.hlo` finds the arrays a
  compiled step materialises.

Peak memory is one definition for both: :func:`experiments.machine.peak_bytes`.
"""
