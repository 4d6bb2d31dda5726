"""The benchmarks, each a sub-verb of ``python -m experiments bench``: ``step`` (step.py: the training step of the
real configs), ``malloc`` (malloc.py: glibc's allocator settings), ``memory`` (memory.py measures a training step's
peak memory against length, memory_report.py runs it and renders its README; hlo.py finds the arrays a compiled
step materialises) and ``attention`` (attention.py measures attention per scheme, attention_report.py runs it and
renders its README). Peak memory is one definition for all: :func:`experiments.machine.peak_bytes`.
"""
