"""Arithmetic (seed 002): which position schemes let a Transformer tell "12+1" from "21+1"?

The data set is every ``i+j`` and ``i-j``, character level: the encoder
reads ``"21+211"``, the decoder writes ``"232"``; 10,000 examples are held out
as ``test``. Seed 002 takes ``i, j`` in ``[0, 1000)`` (2,000,000 examples,
builder config ``n1000_addsub``, variant ``config=n1000_addsub``). This config
defaults to ``[0, 300)`` (``n300_addsub``, 180,000 examples, inputs of the same
1-7 characters), on which all 24 runs of the comparison fit in an hour on 2 CPU
cores; on the full set, t5, rope and learned positions need more than 5,000
steps to reach 99%. The data is generated as a TFDS data set into ``data_dir``
on first use (seconds for n300; ~1-2 minutes and ~210 MB for n1000).

Command (from the repository root), one run per position scheme::

  .venv/bin/python run.py --config=configs/arithmetic.py:pe=sinusoidal --workdir=workdirs/arith_sinusoidal
  .venv/bin/python run.py --config=configs/arithmetic.py:pe=none --workdir=workdirs/arith_none
  .venv/bin/python run.py --config=configs/arithmetic.py:pe=shaw,k=16 --workdir=workdirs/arith_shaw
  .venv/bin/python run.py --config=configs/arithmetic.py:pe=alibi,directional=1 --workdir=workdirs/arith_alibi_dir

Variant keys (comma separated): ``pe`` = none, sinusoidal, learned, shaw, t5,
rope or alibi (default sinusoidal); ``k`` = Shaw's clipping distance;
``directional`` = 0/1 for ALiBi; ``seed``; ``config`` = the data set's
builder config (e.g. ``n1000_addsub``). The whole comparison (every scheme,
3 seeds, report and attention maps) is ``python -m experiments.arithmetic``.

Expected result (``python -m experiments.arithmetic --workers=2``: 8 schemes x
3 seeds, 7,000 steps each, 51 minutes on 2 CPU cores; greedy exact match on
the 10k test split; experiments/results/arithmetic/report.md): sinusoidal,
learned, shaw (k=16), t5 and rope 100.00% on every seed, directional ALiBi
99.85% (99.67-99.94), symmetric ALiBi 88.9% (under its reversal bound, 91.2%),
none 12.3% (11.9-12.5; under the bag-of-characters bound, 15.2% over the
whole n300 data set). On the full n1000 set, an earlier seed-0 run of 5,000
steps gave sinusoidal 99.99%, shaw 99.44%, learned 98.5%, t5 97.0%, rope 96.0%
and none 2.4% (bound 4.3%).
"""

import ml_collections
from ml_collections import config_dict

from rpr.run_config import parse_variant

SCHEMES = ("none", "sinusoidal", "learned", "shaw", "t5", "rope", "alibi")


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  # Data.
  c.dataset = "arithmetic"  # rpr.data name: seed 002's i+j / i-j
  c.arithmetic_config = "n300_addsub"  # TFDS builder config: operands in [0, 300), 180,000 examples (variant config=)
  c.data_dir = "~/tensorflow_datasets"  # where the TFDS data is generated on first use
  c.seed = 0  # seeds the batch order, the parameter init and dropout
  c.batch_size = 128  # global training batch (all devices); per example, 64 and 128 learn alike
  c.eval_batch_size = 2000  # global evaluation batch: the 10k test split in 5 batches
  c.eval_splits = ("test",)  # the held-out 10,000 examples
  c.max_eval_batches = config_dict.placeholder(int)  # evaluate at most this many batches; None: the whole split

  # Model: preset tiny, then every key below that is not None.
  c.preset = "tiny"  # rpr.model preset
  c.position = "sinusoidal"  # scheme of encoder and decoder self-attention (variant pe=...)
  c.cross_position = "none"  # encoder-decoder attention: plain, as in Shaw et al.
  c.d_model = 64  # model width: 128 learns no faster per example and costs 3x per step
  c.num_heads = 8  # heads of 8: more heads learn the digit alignment faster than 4
  c.d_ff = 256  # feed-forward inner width
  c.num_encoder_layers = 2  # encoder depth
  c.num_decoder_layers = 2  # decoder depth
  c.dropout_rate = 0.0  # no dropout: the held-out split is scored, and training data is plentiful
  c.attention_dropout_rate = 0.0  # no attention dropout
  c.pre_layer_norm = True  # pre-LN: stable at a high learning rate without long warm-up
  c.share_embeddings = False  # separate input, output and logit tables: tied ones slow absolute encodings ~5x
  c.model_max_length = 16  # longest sequence: inputs have <= 7 characters, answers <= 4 + EOS
  c.max_distance = 16  # shaw: clipping distance k (inputs are <= 7 long, so any k >= 6 never clips)
  c.use_keys = True  # shaw: a^K term
  c.use_values = True  # shaw: a^V term
  c.share_heads = False  # shaw: tables per head
  c.num_buckets = 32  # t5: 16 buckets per direction, distances < 8 exact
  c.bucket_max_distance = 128  # t5: largest bucketed distance
  c.rope_base = 10000.0  # rope frequency base
  c.alibi_directional = False  # alibi: False = symmetric (unchanged ALiBi), True = halve the slope to the right
  c.dtype = "float32"  # activation dtype
  c.attention_implementation = "dense"  # or "chunked": linear memory in the lengths (same parameters)

  # Optimisation.
  c.optimizer = "adam"  # Adam
  c.learning_rate = 3e-3  # peak rate
  c.schedule = "cosine"  # linear warm-up, then cosine decay to 0 at num_train_steps
  c.warmup_steps = 100  # warm-up steps
  c.adam_b1 = 0.9  # Adam beta1
  c.adam_b2 = 0.98  # Adam beta2
  c.adam_eps = 1e-9  # Adam epsilon
  c.weight_decay = 0.0  # adamw only
  c.grad_clip_norm = 1.0  # clip the global gradient norm
  c.label_smoothing = 0.0  # exact answers: no smoothing
  c.num_train_steps = 7000  # optimizer steps: 896,000 examples, 5.3 epochs of n300

  # Evaluation and bookkeeping.
  c.eval_every_steps = 100_000  # more than num_train_steps: evaluate only at the end (greedy, whole test split)
  c.decode_method = "greedy"  # greedy decoding, as exact match is scored
  c.beam_size = 4  # beam width (unused with greedy)
  c.beam_alpha = 0.6  # beam length penalty (unused with greedy)
  c.log_every_steps = 500  # progress log and train/* metrics
  c.checkpoint_every_steps = 1000  # a killed run resumes from here (and the attention maps read the last one)
  c.keep_checkpoints = 1  # keep the final checkpoint only

  flags, settings = parse_variant(variant, flags=("quick",), keys=("pe", "k", "directional", "seed", "config"))
  if settings.get("pe", c.position) not in SCHEMES:
    raise ValueError(f"configs/arithmetic.py: pe={settings['pe']!r}; allowed: {list(SCHEMES)}")
  c.position = settings.get("pe", c.position)
  if "k" in settings:
    c.max_distance = int(settings["k"])
  if "directional" in settings:
    c.alibi_directional = settings["directional"] in ("1", "true", "True")
  if "seed" in settings:
    c.seed = int(settings["seed"])
  if "config" in settings:
    c.arithmetic_config = settings["config"]
  c.compare_positions = ()  # scheme names (rpr.compare): train once per scheme and print them side by side
  if "quick" in flags:  # what `python run.py` runs: one seed, one scheme with encoding and one without
    c.compare_positions = ("sinusoidal", "none")
    c.num_train_steps = 3000  # enough for sinusoidal positions (the sweep's relative schemes need more)
  return c
