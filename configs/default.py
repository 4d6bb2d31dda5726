"""Base experiment: reverse digit strings with Shaw relative positions, on a CPU.

Its keys are those of configs/base.py (each commented there); configs/tiny.py starts from this one. ``python run.py``
without flags runs ``configs/arithmetic.py:quick`` instead (see run.py).

Command (from the repository root)::

  .venv/bin/python run.py --config=configs/default.py --workdir=workdirs/reverse

Expected result (measured on 2 shared CPU cores): 2,000 steps in 2.5-4 minutes;
at the end ``valid/exact_match`` (1-12 digits, greedy decoding) about 0.99
and ``long/exact_match`` (13-16 digits, lengths never trained on) about 0.8.
Re-running resumes from ``workdirs/reverse/checkpoints``.

Variant ``configs/default.py:sinusoidal`` trains the absolute baseline
(``model.position = "sinusoidal"``), everything else equal::

  .venv/bin/python run.py --config=configs/default.py:sinusoidal --workdir=workdirs/default_sinusoidal

Expected: ``valid/exact_match`` about 0.99 as well, but ``long/exact_match``
near 0: relative positions generalise to longer strings,
absolute ones do not.
"""

import ml_collections

from configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  flags, _ = base.parse_variant(variant, "configs/default.py", flags=("sinusoidal",))
  c = base.get_config()
  c.model.shaw.max_distance = 8  # Shaw's k, the setting of the measured result above
  if "sinusoidal" in flags:
    c.model.position = "sinusoidal"
  return c
