"""The benchmarks, each a sub-verb of ``python -m experiments bench``: ``step`` (step.py: the training step of the
real configs) and ``attention`` (attention.py measures attention per scheme, attention_report.py runs it and renders
its README); the retired ones are in experiments/README.md.
"""
