"""Failures that end a run in one line and lose nothing: clean-up that never hides the first error, and a loss
that grows by orders of magnitude, which training alone would not report.

:func:`clean_up` runs every step of a run's clean-up (wait for the last save, close the writers, record the
process), each even after another failed. Called while an error is on its way out, it lets that first error
through and logs the clean-up's own errors in one warning; otherwise it raises the first error of its steps.

:func:`warn_if_loss_grew` warns once per run when the logged training loss rises above ``GROWTH`` times the
lowest before it (a learning rate far too high trains on, finite, to ever larger losses, which would end with
exit status 0 and no word).
"""

from __future__ import annotations

import math
import sys
from typing import Callable

from absl import logging

GROWTH = 100.0  # a logged loss this many times the lowest before it is warned of


def clean_up(*steps: Callable[[], object], quiet: bool = False) -> None:
  """Runs each of ``steps`` in order; the first error wins (see the module's docstring). ``quiet``: their errors
  are dropped unsaid (the failure they repeat was reported)."""
  propagating = sys.exc_info()[1] is not None  # in a ``finally``: an error the run is stopping on
  errors = []
  for step in steps:
    try:
      step()
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
  if quiet:
    return
  later = errors if propagating else errors[1:]
  if later:
    logging.warning("Cleaning up after the error also failed (ignored): %s.",
                    "; ".join(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}" for e in later))
  if errors and not propagating:
    raise errors[0]


def warn_if_loss_grew(records: list[dict], step: int, loss: float, vocab_size: int, key: str = "train/loss") -> bool:
  """Warns if ``loss``, logged at ``step``, is over :data:`GROWTH` times the lowest loss before it and worse than a
  uniform guess (``ln vocab_size``, the loss training starts near, also counts as a loss before it); once: not if
  a record of ``records`` already rose so. True if it warned."""
  guess = math.log(max(vocab_size, 2))
  lowest, at = guess, None
  for r in records:
    value = r.get(key)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
      continue
    if value > GROWTH * lowest and value > guess:
      return False  # warned of already (in this process or the one before)
    if value < lowest:
      lowest, at = value, r["step"]
  if not (loss > GROWTH * lowest and loss > guess):
    return False
  before = f"at step {at}" if at is not None else f"that of a uniform guess over {vocab_size} tokens"
  logging.warning("The training loss grew by orders of magnitude: %.4g at step %d, %.3gx the lowest before it, "
                  "%.4g (%s); training goes on, but it is likely diverging: lower config.learning_rate, set "
                  "config.grad_clip_norm or lengthen config.warmup_steps.", loss, step, loss / lowest, lowest, before)
  return True
