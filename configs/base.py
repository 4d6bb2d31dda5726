"""The base config every experiment starts from, every key commented, and the one variant parser.

Keys are flat except ``model``, which holds :class:`rpr.model_config.ModelConfig`'s
fields by name, and beside them one dict per position scheme with options:
``model.<scheme>`` holds the fields of that scheme's ``Options`` dataclass
(rpr/attention/positions/<scheme>.py), which is where their defaults and meanings
live. The model takes the options of the schemes it uses
(``model.position``, ``model.cross_position``). Override any key on the
command line: ``--config.num_train_steps=100``, ``--config.model.d_model=128``,
``--config.model.shaw.max_distance=4``.
``python run.py --config=... --print_config`` prints the resolved config.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import ml_collections
from ml_collections import config_dict

from rpr.attention import positions


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  # Data.
  c.dataset = "reverse"  # data set name in rpr.data (copy, reverse, arithmetic, wmt14)
  c.seed = 0  # seeds the batch order, the parameter init and dropout
  c.batch_size = 64  # global training batch (all devices); divisible by the device count
  c.eval_batch_size = 128  # global evaluation batch; divisible by the device count
  c.min_length = 1  # copy/reverse: shortest training string
  c.max_length = 12  # copy/reverse: longest training (and valid) string
  c.long_max_length = 16  # copy/reverse: the long split has lengths max_length+1 .. long_max_length
  c.num_eval_examples = 512  # copy/reverse: examples per evaluation split
  c.eval_splits = ("valid", "long")  # evaluated splits; metrics are named <split>/<metric>
  c.final_eval_splits = ()  # evaluated at the last step only, beside eval_splits (e.g. a test split)
  c.max_eval_batches = config_dict.placeholder(int)  # evaluate at most this many batches per split; None: all
  c.eval_by_length = False  # also report <split>/exact_match_by_length/<n> per input length n
  # Text tasks: BLEU, chrF and sentence count per source-length bucket, given by its largest length (in source
  # tokens), the last bucket open: (10, 20) gives <split>/bleu_by_length/1-10, /11-20 and /21+. (): none.
  c.source_length_buckets = ()

  c.model = _model()

  # Optimisation.
  c.optimizer = "adam"  # adam or adamw
  c.learning_rate = 3e-3  # peak rate for rsqrt/constant/cosine; the multiplier of d_model^-0.5 ... for vaswani
  c.schedule = "rsqrt"  # vaswani (paper eq. 3), rsqrt (peak = learning_rate at warmup_steps), constant or cosine
  c.warmup_steps = 200  # linear warm-up steps
  # A linear cool-down to 0 over this fraction of num_train_steps, on top of the schedule (0: none; rpr/optim.py).
  c.cooldown_fraction = 0.0
  c.adam_b1 = 0.9  # Adam beta1 (Vaswani et al.)
  c.adam_b2 = 0.98  # Adam beta2 (Vaswani et al.)
  c.adam_eps = 1e-9  # Adam epsilon (Vaswani et al.)
  c.weight_decay = 0.0  # adamw only: decoupled weight decay
  c.grad_clip_norm = config_dict.placeholder(float)  # clip gradients to this global norm; None: no clipping
  c.label_smoothing = 0.1  # eps of label smoothing (Vaswani et al.: 0.1)
  c.num_train_steps = 2000  # total optimizer steps (a resumed run continues up to here)
  # Stop before num_train_steps once the run has stopped improving (rpr/plateau.py): at an evaluation step S >=
  # plateau_min_steps, the mean of the last plateau_smoothing evaluations of plateau_metric gained less than
  # plateau_min_gain over the last plateau_window of the steps. None: train to num_train_steps.
  c.plateau_metric = config_dict.placeholder(str)  # e.g. "validation/bleu" (an eval_splits metric)
  c.plateau_min_steps = 0  # never stop before this step
  c.plateau_window = 0.25  # the fraction of the steps the gain is measured over
  c.plateau_min_gain = 0.0  # in the metric's units
  c.plateau_smoothing = 1  # evaluations averaged into one value

  # Evaluation and bookkeeping.
  c.eval_every_steps = 500  # evaluate every this many steps, and at the end
  c.decode_method = "greedy"  # greedy or beam
  # How final_eval_splits are decoded at the last step (None: decode_method); "beam" beside a greedy
  # decode_method gives cheap greedy learning curves and a beam-search test score.
  c.final_decode_method = config_dict.placeholder(str)
  c.decode_extra_length = 50  # decode at most (input length + this) tokens, capped by model.max_length
  c.beam_size = 4  # beam search width
  c.beam_alpha = 0.6  # beam search length penalty ((5 + len) / 6)^alpha
  # The last evaluation scores the mean of the parameters of the newest this many checkpoints (Vaswani et
  # al. average 5 for base, 20 for big); 1: the final state. Needs keep_checkpoints >= it.
  c.average_last = 1
  c.log_every_steps = 100  # progress log and train/* metrics every this many steps
  # Also write TensorBoard events (with the config as HParams) beside metrics.jsonl. They need TensorFlow,
  # which takes seconds to import; False: metrics.jsonl only.
  c.tensorboard = True
  c.checkpoint_every_steps = 500  # checkpoint every this many steps (and at the end and on SIGTERM)
  c.keep_checkpoints = 3  # keep the newest this many checkpoints
  return c


def _model() -> ml_collections.ConfigDict:
  """``config.model``: rpr.model_config.ModelConfig's fields (vocab_size comes from the data set)."""
  m = ml_collections.ConfigDict()
  m.d_model = 64  # model width
  m.num_heads = 4  # attention heads, must divide d_model
  m.d_ff = 128  # feed-forward inner width
  m.num_encoder_layers = 2  # encoder depth
  m.num_decoder_layers = 2  # decoder depth
  m.dropout_rate = 0.0  # residual and embedding dropout
  m.attention_dropout_rate = 0.0  # dropout on the attention weights
  m.position = "shaw"  # scheme of encoder and decoder (rpr.attention.SCHEMES)
  m.cross_position = "none"  # scheme of the encoder-decoder attention (Shaw et al.: none)
  # Each scheme's options, as model.<scheme>.<option>: their defaults and meanings are the fields of the
  # scheme's Options (rpr/attention/positions/); shaw: max_distance, use_keys, use_values, share_heads,
  # add_sinusoidal; t5: num_buckets, horizon; rope: rope_base; learned: learned_init_std.
  for name in positions.SCHEMES:
    if positions.defaults(name):
      m[name] = ml_collections.ConfigDict(positions.defaults(name))
  m.pre_layer_norm = False  # True: pre-LN, False: post-LN (Vaswani, Shaw)
  m.share_embeddings = True  # tie input/output embeddings
  m.max_length = 64  # longest sequence: learned position tables, decode caches
  m.dtype = "float32"  # activation dtype: float32 or bfloat16 (parameters stay float32)
  m.attention_implementation = "dense"  # or "chunked": linear memory in the lengths (same parameters)
  return m


# ----------------------------------------------------------------------------
# Variants: "file.py:flag,key=value,...", parsed one way for every config file.


def integer(minimum: int = 0) -> Callable[[str], int]:
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise ValueError(f"an int >= {minimum}") from None
    if value < minimum:
      raise ValueError(f"an int >= {minimum}")
    return value
  return parse


def boolean(text: str) -> bool:
  words = {"1": True, "true": True, "True": True, "0": False, "false": False, "False": False}
  if text not in words:
    raise ValueError(f"one of {sorted(words)}")
  return words[text]


def choice(allowed: Iterable[str]) -> Callable[[str], str]:
  allowed = list(allowed)

  def parse(text: str) -> str:
    if text not in allowed:
      raise ValueError(f"one of {allowed}")
    return text
  return parse


def scheme(text: str) -> str:
  """A position scheme name from the registry."""
  return choice(sorted(positions.SCHEMES))(text)


def parse_variant(variant: str, where: str, flags: Iterable[str] = (),
                  keys: Mapping[str, Callable[[str], Any]] = {}) -> tuple[set[str], dict[str, Any]]:
  """Splits ``"tiny,pe=shaw,k=4"`` into flags ``{"tiny"}`` and typed settings ``{"pe": "shaw", "k": 4}``.

  ``flags`` are the allowed bare words; ``keys`` maps each allowed key to its
  parser (:func:`integer`, :func:`boolean`, :func:`choice`, :func:`scheme`).
  An unknown, repeated or unparsable word fails naming ``where`` (the config
  file), the word and what is allowed.
  """
  flags = set(flags)
  found, settings = set(), {}
  for word in (w.strip() for w in variant.split(",")):
    if not word:
      continue
    key, eq, text = word.partition("=")
    if eq and key in keys and key not in settings:
      try:
        settings[key] = keys[key](text)
      except ValueError as e:
        raise ValueError(f"{where}: variant {variant!r}: {key}={text!r} is not allowed; allowed: {e}") from None
    elif not eq and word in flags and word not in found:
      found.add(word)
    else:
      raise ValueError(f"{where}: variant {variant!r}: unknown or repeated word {word!r}; allowed: flags "
                       f"{sorted(flags)}, keys {sorted(k + '=...' for k in keys)}")
  return found, settings


def set_scheme(c: ml_collections.ConfigDict, settings: Mapping[str, Any], where: str, variant: str) -> None:
  """Applies the shared variant keys ``pe`` (scheme), ``k`` (Shaw only) and ``directional`` (ALiBi only)."""
  position = settings.get("pe", c.model.position)
  if settings.get("directional"):
    if position != "alibi":
      raise ValueError(f"{where}: variant {variant!r}: directional=1 is ALiBi's (pe=alibi), not pe={position}")
    position = "alibi_directional"
  if "k" in settings:
    if position != "shaw":
      raise ValueError(f"{where}: variant {variant!r}: k= is Shaw's clipping distance; pe={position} has none")
    set_k(c, settings["k"])
  c.model.position = position


def set_k(c: ml_collections.ConfigDict, k: int) -> None:
  """Shaw's clipping distance, by its shorthand ``k`` (the variant key ``k=``): the config key
  ``model.shaw.max_distance``, whose one default is Shaw's ``Options``' (rpr/attention/positions/shaw.py)."""
  c.model.shaw.max_distance = k


# The variant keys of set_scheme, for parse_variant.
SCHEME_KEYS = {"pe": scheme, "k": integer(0), "directional": boolean}
