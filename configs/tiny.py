"""Tiny setting of the default experiment, for tests and smoke runs (seconds on a CPU).

Command::

  .venv/bin/python run.py --config=configs/tiny.py --workdir=workdirs/tiny

It trains 40 steps and evaluates twice: a plumbing check, not a result. Every
key is documented in ``configs/base.py``; only the values below differ.
"""

import ml_collections

from configs import base
from configs import default


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = default.get_config(variant)
  c.dataset = "copy"  # copying is learnable in a few dozen steps
  c.batch_size = 16  # global training batch
  c.eval_batch_size = 16  # global evaluation batch
  c.min_length = 1  # shortest training string
  c.max_length = 6  # longest training string
  c.long_max_length = 8  # long split: 7-8 digits
  c.num_eval_examples = 32  # two eval batches per split
  c.model.d_model = 32  # model width
  c.model.num_heads = 2  # heads of 16
  c.model.d_ff = 64  # feed-forward width
  c.model.num_encoder_layers = 1  # one encoder block
  c.model.num_decoder_layers = 1  # one decoder block
  base.set_k(c, 4)  # Shaw's clipping distance
  c.learning_rate = 1e-2  # rsqrt peak
  c.warmup_steps = 10  # short warm-up
  c.num_train_steps = 40  # total steps
  c.eval_every_steps = 20  # evaluate twice
  c.log_every_steps = 10  # log four times
  c.checkpoint_every_steps = 20  # checkpoints at 20 and 40
  c.keep_checkpoints = 2  # both kept
  return c
