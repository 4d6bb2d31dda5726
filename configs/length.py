"""Length generalisation (Shaw et al.'s second claim): train on strings of up to L digits, test up to 2L.

The task is ``reverse`` (rpr.data.synthetic): output position i must copy
input position n-1-i, so order matters at every length. Training strings have
1..L = 12 digits; ``valid`` holds 1..12 and ``long`` 13..24 digits (never
trained on), 1,200 examples each, about 100 per length. With
``eval_by_length`` every evaluation also gives the exact match (greedy
decoding) of each input length, ``<split>/exact_match_by_length/<n>``.
Everything but the position scheme is fixed here (the default experiment's
recipe, configs/default.py): 2+2 layers, d_model 64, 2,000 steps of batch 64.

Variants: ``pe=<scheme>`` (rpr.attention.SCHEMES; default shaw), ``k=<int>`` (Shaw's clipping distance,
default 8), ``directional=0|1`` (ALiBi with a halved slope to the right, pe=alibi only),
``tiny`` (a few steps of a tiny model, for tests). Command for one scheme::

  .venv/bin/python run.py --config=configs/length.py:pe=shaw --workdir=workdirs/length/shaw

Every scheme, 3 seeds (their report, accuracy against length, was written by the retired report writer:
experiments/README.md)::

  .venv/bin/python -m experiments sweep length

Results, with their seeds: experiments/results/length/README.md.
"""

import ml_collections

from configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  where = "configs/length.py"
  flags, settings = base.parse_variant(variant, where, flags=("tiny",), keys=base.SCHEME_KEYS)
  c = base.get_config()
  c.dataset = "reverse"  # order matters at every length
  c.min_length = 1  # shortest training string
  c.max_length = 12  # L: longest training (and valid) string
  c.long_max_length = 24  # 2L: the long split has 13..24 digits
  c.num_eval_examples = 1200  # per split: about 100 per length
  c.eval_batch_size = 200  # six eval batches per split
  c.eval_by_length = True  # <split>/exact_match_by_length/<n>
  # The recipe of the measured results, pinned here so that changes to base.py do not move them.
  c.batch_size = 64  # training batch
  c.model.d_model, c.model.num_heads, c.model.d_ff = 64, 4, 128  # width, heads of 16, feed-forward width
  c.model.num_encoder_layers = c.model.num_decoder_layers = 2  # 2+2 layers
  c.model.dropout_rate = 0.0  # no dropout
  c.model.max_length = 64  # learned tables and decode caches
  c.model.position = "shaw"
  base.set_k(c, 8)  # Shaw's clipping distance
  c.optimizer, c.schedule = "adam", "rsqrt"  # Adam (0.9, 0.98, 1e-9), peak at warmup_steps
  c.learning_rate, c.warmup_steps = 3e-3, 200  # peak rate and warm-up
  c.label_smoothing = 0.1  # as in Vaswani et al.
  c.num_train_steps = 2000  # optimizer steps
  c.decode_method = "greedy"  # exact match of greedy decoding
  c.eval_every_steps = 1000  # evaluate at the middle and the end
  c.checkpoint_every_steps = 2000  # the final checkpoint only
  c.keep_checkpoints = 1
  if "tiny" in flags:  # seconds on a CPU
    c.max_length = 4
    c.long_max_length = 8
    c.batch_size = 16
    c.num_eval_examples = 32
    c.eval_batch_size = 16
    c.model.d_model = 32
    c.model.num_heads = 2
    c.model.d_ff = 64
    c.model.num_encoder_layers = c.model.num_decoder_layers = 1
    base.set_k(c, 2)
    c.warmup_steps = 5
    c.num_train_steps = 10
    c.eval_every_steps = 10
    c.checkpoint_every_steps = 10
    c.log_every_steps = 5
  base.set_scheme(c, settings, where, variant)
  return c


# ----------------------------------------------------------------------------
# The named sweeps of this config (configs/sweeps.py; run by `python -m experiments sweep <name>`).


def get_sweeps() -> dict:
  from configs.sweeps import run, seeded, sweep
  from rpr.attention import positions

  here = "configs/length.py"
  return {
      "length": sweep(
          "Length generalisation on reverse: every position scheme, train 1-12 digits, test 1-24, 3 seeds",
          seeded([run(s, here, f"pe={s}") for s in positions.SCHEMES] + [run("shaw_k4", here, "pe=shaw,k=4")])),
      "length_tiny": sweep(
          "The tiny length config with two schemes and two seeds (seconds; for tests)",
          seeded((run(s, here, f"tiny,pe={s}") for s in ("shaw", "sinusoidal")), seeds=(0, 1))),
  }
