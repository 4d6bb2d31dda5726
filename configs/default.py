"""Base experiment: reverse digit strings with Shaw relative positions, on a CPU.

Other configs (tiny, length, wmt14_ende) start from this one. ``python run.py``
without flags runs ``configs/arithmetic.py:quick`` instead (see run.py).

Command (from the repository root)::

  .venv/bin/python run.py --config=configs/default.py --workdir=workdirs/reverse

Expected result (measured on 2 shared CPU cores): 2,000 steps in 2.5-4 minutes;
at the end ``valid/exact_match`` (1-12 digits, greedy decoding) about 0.99
and ``long/exact_match`` (13-16 digits, lengths never trained on) about 0.8
(0.81 in our run). Re-running resumes from ``workdirs/reverse/checkpoints``.

Variant ``configs/default.py:sinusoidal`` trains the absolute baseline
(``position = "sinusoidal"``), everything else equal::

  .venv/bin/python run.py --config=configs/default.py:sinusoidal --workdir=workdirs/default_sinusoidal

Expected: ``valid/exact_match`` about 0.99 as well, but ``long/exact_match``
near 0 (0.02 in our run): relative positions generalise to longer strings,
absolute ones do not.
"""

import ml_collections
from ml_collections import config_dict


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  # Data.
  c.dataset = "reverse"  # data set name in rpr.data (copy, reverse, ...)
  c.seed = 0  # seeds the batches, the parameter init and dropout
  c.batch_size = 64  # global training batch (all devices); divisible by the device count
  c.eval_batch_size = 128  # global evaluation batch; divisible by the device count
  c.min_length = 1  # copy/reverse: shortest training string
  c.max_length = 12  # copy/reverse: longest training (and valid) string
  c.long_max_length = 16  # copy/reverse: the long split has lengths max_length+1 .. long_max_length
  c.num_eval_examples = 512  # copy/reverse: examples per evaluation split
  c.eval_splits = ("valid", "long")  # evaluated splits; metrics are named <split>/<metric>
  c.max_eval_batches = config_dict.placeholder(int)  # evaluate at most this many batches per split; None: all
  c.eval_by_length = False  # also report <split>/exact_match_by_length/<n> per input length n

  # Model: a preset of rpr.model, then every key below that is not None.
  c.preset = "tiny"  # rpr.model preset: tiny, base or big
  c.position = "shaw"  # position scheme of encoder and decoder self-attention (rpr.positions.SCHEMES)
  c.cross_position = "none"  # scheme of the encoder-decoder attention (Shaw et al.: none)
  c.d_model = 64  # model width; None: preset's
  c.num_heads = 4  # attention heads, must divide d_model; None: preset's
  c.d_ff = 128  # feed-forward inner width; None: preset's
  c.num_encoder_layers = 2  # None: preset's
  c.num_decoder_layers = 2  # None: preset's
  c.dropout_rate = 0.0  # residual and embedding dropout; None: preset's
  c.attention_dropout_rate = config_dict.placeholder(float)  # dropout on attention weights; None: preset's
  c.pre_layer_norm = config_dict.placeholder(bool)  # True: pre-LN, False: post-LN; None: preset's
  c.share_embeddings = config_dict.placeholder(bool)  # tie input/output embeddings; None: preset's
  c.model_max_length = config_dict.placeholder(int)  # longest sequence (learned tables, decode cache); None: preset's
  c.max_distance = 8  # Shaw's clipping distance k; None: preset's
  c.use_keys = config_dict.placeholder(bool)  # Shaw's a^K term; None: preset's
  c.use_values = config_dict.placeholder(bool)  # Shaw's a^V term; None: preset's
  c.share_heads = config_dict.placeholder(bool)  # one Shaw table for all heads; None: preset's
  c.num_buckets = config_dict.placeholder(int)  # t5 buckets; None: preset's
  c.bucket_max_distance = config_dict.placeholder(int)  # t5 largest bucketed distance; None: preset's
  c.rope_base = config_dict.placeholder(float)  # rope frequency base; None: preset's
  c.alibi_directional = config_dict.placeholder(bool)  # alibi: halve the slope to the right; None: preset's
  c.dtype = "float32"  # activation dtype: float32 or bfloat16 (parameters stay float32)
  c.attention_implementation = "dense"  # or "chunked": linear memory in the lengths (same parameters)

  # Optimisation.
  c.optimizer = "adam"  # adam or adamw
  c.learning_rate = 3e-3  # peak rate for rsqrt/constant; the multiplier of d_model^-0.5 ... for vaswani
  c.schedule = "rsqrt"  # vaswani (paper eq. 3), rsqrt (peak = learning_rate at warmup_steps) or constant
  c.warmup_steps = 200  # linear warm-up steps
  c.adam_b1 = 0.9  # Adam beta1 (Vaswani et al.)
  c.adam_b2 = 0.98  # Adam beta2 (Vaswani et al.)
  c.adam_eps = 1e-9  # Adam epsilon (Vaswani et al.)
  c.weight_decay = 0.0  # adamw only: decoupled weight decay
  c.grad_clip_norm = config_dict.placeholder(float)  # clip gradients to this global norm; None: no clipping
  c.label_smoothing = 0.1  # eps of label smoothing (Vaswani et al.: 0.1)
  c.num_train_steps = 2000  # total optimizer steps (a resumed run continues up to here)

  # Evaluation and bookkeeping.
  c.eval_every_steps = 500  # evaluate every this many steps, and at the end
  c.decode_method = "greedy"  # greedy or beam
  c.beam_size = 4  # beam search width
  c.beam_alpha = 0.6  # beam search length penalty ((5 + len) / 6)^alpha
  c.log_every_steps = 100  # progress log and train/* metrics every this many steps
  c.checkpoint_every_steps = 500  # checkpoint every this many steps (and at the end and on SIGTERM)
  c.keep_checkpoints = 3  # keep the newest this many checkpoints

  if variant == "sinusoidal":
    c.position = "sinusoidal"
  elif variant:
    raise ValueError(f"unknown variant {variant!r} of configs/default.py; allowed: '', 'sinusoidal'")
  return c
