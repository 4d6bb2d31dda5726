"""The run config: every check in one place, and the model config it describes.

``validate(config, num_devices)`` runs before any data or model is built; a
bad value fails with a ``ValueError`` naming the config key and what is
allowed. ``model_config(config, vocab_size)`` turns the flat run config into
a :class:`rpr.model.ModelConfig`: the preset ``config.preset``, then every
model key that is not None (None keeps the preset's value).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp

from rpr import data
from rpr import layers
from rpr import model as model_lib
from rpr import optim
from rpr import positions

DECODE_METHODS = ("greedy", "beam")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# Run-config key -> ModelConfig field; None in the run config keeps the preset's value.
MODEL_KEYS = {
    "d_model": "d_model",
    "num_heads": "num_heads",
    "d_ff": "d_ff",
    "num_encoder_layers": "num_encoder_layers",
    "num_decoder_layers": "num_decoder_layers",
    "dropout_rate": "dropout_rate",
    "attention_dropout_rate": "attention_dropout_rate",
    "pre_layer_norm": "pre_layer_norm",
    "share_embeddings": "share_embeddings",
    "model_max_length": "max_length",
    "attention_implementation": "attention_implementation",
}
# Run-config keys that are PositionConfig fields of the same name.
POSITION_KEYS = ("max_distance", "use_keys", "use_values", "share_heads", "num_buckets", "bucket_max_distance",
                 "rope_base", "alibi_directional")


def model_config(config, vocab_size: int) -> model_lib.ModelConfig:
  """The ModelConfig of ``config`` (preset + overrides + position schemes), validated."""
  overrides = {field: config[key] for key, field in MODEL_KEYS.items() if config.get(key) is not None}
  base = model_lib.preset(config.preset)
  pos = {k: config[k] for k in POSITION_KEYS if config.get(k) is not None}
  overrides["position_config"] = dataclasses.replace(base.position_config, **pos)
  if config.get("position") is not None:
    overrides["encoder_position"] = overrides["decoder_position"] = config.position
  if config.get("cross_position") is not None:
    overrides["cross_position"] = config.cross_position
  overrides["dtype"] = DTYPES[config.dtype]
  return model_lib.preset(config.preset, vocab_size=vocab_size, **overrides)


def parse_variant(variant: str, flags=(), keys=()) -> tuple[set[str], dict[str, str]]:
  """Splits a config variant ``"table2,k=4"`` into flags ``{"table2"}`` and settings ``{"k": "4"}``.

  ``flags`` and ``keys`` are the allowed bare words and ``key=value`` keys; an
  unknown or repeated word fails naming the allowed ones. Values stay strings.
  """
  found, settings = set(), {}
  for word in (w.strip() for w in variant.split(",")):
    if not word:
      continue
    key, eq, value = word.partition("=")
    if eq and key in keys and key not in settings:
      settings[key] = value
    elif not eq and word in flags and word not in found:
      found.add(word)
    else:
      raise ValueError(f"config variant {variant!r}: bad or repeated word {word!r}; allowed: flags "
                       f"{sorted(flags)}, keys {sorted(k + '=...' for k in keys)}")
  return found, settings


def _fail(key: str, value, allowed) -> None:
  raise ValueError(f"config.{key} = {value!r} is not allowed; allowed: {allowed}")


def _int(config, key: str, minimum: int, optional: bool = False) -> None:
  v = config.get(key)
  if optional and v is None:
    return
  if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
    _fail(key, v, f"an int >= {minimum}" + (" or None" if optional else ""))


def _real(config, key: str, lo: float, hi: float = math.inf, lo_open: bool = False, optional: bool = False) -> None:
  v = config.get(key)
  if optional and v is None:
    return
  ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(v)
  ok = ok and (v > lo if lo_open else v >= lo) and v <= hi
  if not ok:
    _fail(key, v, f"a number {'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi < math.inf else "")
          + (" or None" if optional else ""))


def _choice(config, key: str, allowed) -> None:
  if config.get(key) not in allowed:
    _fail(key, config.get(key), list(allowed))


def validate(config, num_devices: int) -> None:
  """Raises ``ValueError`` naming the first bad key of ``config`` and what it allows."""
  # Data.
  entry = data.entry(config.get("dataset"))
  for key in ("batch_size", "eval_batch_size"):
    # Token-budget data sets (wmt14) size their training batches themselves.
    _int(config, key, 1, optional=key == "batch_size" and entry.batch_by_tokens)
    if config[key] is not None and config[key] % num_devices:
      raise ValueError(f"config.{key} = {config[key]} must be divisible by the number of devices "
                       f"({num_devices}): the batch is split evenly over the 'data' mesh axis")
  splits = config.get("eval_splits")
  if not isinstance(splits, (tuple, list)) or not all(isinstance(s, str) for s in splits):
    _fail("eval_splits", splits, "a tuple of split names")
  if entry.splits is not None:
    for s in splits:
      if s not in entry.splits:
        _fail("eval_splits", tuple(splits), f"names from {list(entry.splits)} (data set {config.dataset!r})")
  _int(config, "seed", 0)
  _int(config, "max_eval_batches", 1, optional=True)

  # Model.
  _choice(config, "preset", model_lib.PRESETS)
  _choice(config, "position", sorted(positions.SCHEMES))
  _choice(config, "cross_position", model_lib.cross_schemes())
  _choice(config, "dtype", list(DTYPES))
  if config.get("attention_implementation") is not None:
    _choice(config, "attention_implementation", list(layers.IMPLEMENTATIONS))
  for key in ("d_model", "num_heads", "d_ff", "num_encoder_layers", "num_decoder_layers", "model_max_length"):
    _int(config, key, 1, optional=True)
  for key in ("dropout_rate", "attention_dropout_rate"):
    _real(config, key, 0.0, 1.0, optional=True)
    if config.get(key) == 1.0:
      _fail(key, 1.0, "a rate in [0, 1) or None")
  base = model_lib.preset(config.preset)
  d_model = config.get("d_model") or base.d_model
  num_heads = config.get("num_heads") or base.num_heads
  if d_model % num_heads:
    raise ValueError(f"config.num_heads = {num_heads} does not divide config.d_model = {d_model}; allowed: a "
                     f"divisor of {d_model}")
  _int(config, "max_distance", 0, optional=True)
  for key in ("num_buckets", "bucket_max_distance"):
    _int(config, key, 2, optional=True)
  _real(config, "rope_base", 1.0, lo_open=True, optional=True)
  for key in ("use_keys", "use_values", "share_heads", "alibi_directional", "pre_layer_norm", "share_embeddings"):
    if config.get(key) not in (None, True, False):
      _fail(key, config.get(key), "True, False or None")
  try:
    model_config(config, vocab_size=max(3, base.vocab_size))  # any vocabulary: the task is not built yet
  except ValueError as e:
    raise ValueError(f"config describes an invalid model: {e}") from None

  # Optimisation.
  _choice(config, "optimizer", optim.OPTIMIZERS)
  _choice(config, "schedule", optim.SCHEDULES)
  _real(config, "learning_rate", 0.0, lo_open=True)
  _int(config, "warmup_steps", 1)
  _real(config, "adam_b1", 0.0, 1.0)
  _real(config, "adam_b2", 0.0, 1.0)
  _real(config, "adam_eps", 0.0)
  _real(config, "weight_decay", 0.0)
  _real(config, "grad_clip_norm", 0.0, lo_open=True, optional=True)
  _real(config, "label_smoothing", 0.0, 1.0)
  if config.label_smoothing == 1.0:
    _fail("label_smoothing", 1.0, "a number in [0, 1)")
  _int(config, "num_train_steps", 0)

  # Evaluation and bookkeeping.
  _choice(config, "decode_method", DECODE_METHODS)
  _int(config, "beam_size", 1)
  _real(config, "beam_alpha", 0.0)
  for key in ("eval_every_steps", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    _int(config, key, 1)
  if config.get("eval_by_length") not in (None, True, False):
    _fail("eval_by_length", config.get("eval_by_length"), "True, False or None")
