"""Base experiment: reverse digit strings with Shaw relative positions, on a CPU.

Its keys are those of configs/base.py (each commented there); configs/tiny.py starts from this one. ``python run.py``
without flags runs ``configs/arithmetic.py:quick`` instead (see run.py).

Command (from the repository root)::

  .venv/bin/python run.py --config=configs/default.py --workdir=workdirs/reverse

It trains 2,000 steps and evaluates ``valid/exact_match`` (1-12 digits, greedy
decoding) and ``long/exact_match`` (13-16 digits, lengths never trained on).
What this recipe scores, per length and beside the other schemes, with seeds:
experiments/results/length/README.md.
Re-running resumes from ``workdirs/reverse/checkpoints``.

Variant ``configs/default.py:sinusoidal`` trains the absolute baseline
(``model.position = "sinusoidal"``), everything else equal::

  .venv/bin/python run.py --config=configs/default.py:sinusoidal --workdir=workdirs/default_sinusoidal
"""

import ml_collections

from configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  flags, _ = base.parse_variant(variant, "configs/default.py", flags=("sinusoidal",))
  c = base.get_config()
  base.set_k(c, 8)  # Shaw's clipping distance
  if "sinusoidal" in flags:
    c.model.position = "sinusoidal"
  return c
