"""The run config: every check in one place, and the model config it describes.

``validate(config, num_devices)`` runs before any data or model is built; a
bad value fails with a ``ValueError`` naming the config key and what is
allowed. ``model_config(config, vocab_size)`` is
``ModelConfig(**config.model, vocab_size=vocab_size)``, validated: the
``model`` sub-dict holds the model's fields by name.
"""

from __future__ import annotations

import math
import numbers
import os

from rpr import data
from rpr import model as model_lib
from rpr import optim

DECODE_METHODS = ("greedy", "beam")


class ConfigError(ValueError):
  """A user error in the run config or its workdir: the message names the bad thing and what is allowed."""
# ModelConfig fields the engine sets itself, not the run config.
ENGINE_FIELDS = ("vocab_size", "deterministic", "decode")


def model_config(config, vocab_size: int) -> model_lib.ModelConfig:
  """``ModelConfig(**config.model, vocab_size=vocab_size)``, validated (errors name ``config.model.<key>``)."""
  values = config.model.to_dict() if hasattr(config.model, "to_dict") else dict(config.model)
  fields = [f for f in model_lib.ModelConfig.__dataclass_fields__ if f not in ENGINE_FIELDS]
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(f"config.model has unknown key(s) {unknown}; allowed: {fields}")
  try:
    return model_lib.ModelConfig(**values, vocab_size=vocab_size).validate()
  except ValueError as e:
    raise ValueError(f"config.{e}") from None


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


def validate(config, num_devices: int, workdir: str | None = None) -> None:
  """Raises :class:`ConfigError` naming the first bad key of ``config`` (or the workdir) and what it allows."""
  if workdir is not None and os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir {workdir!r} is a file; allowed: a directory (created if missing)")
  try:
    _validate(config, num_devices)
  except ConfigError:
    raise
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    message = str(e).strip('"')
    if isinstance(e, (KeyError, AttributeError)):
      message = f"config has no key {message}; see configs/base.py or --print_config"
    raise ConfigError(message) from None


def _validate(config, num_devices: int) -> None:
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

  # Model: any vocabulary will do, the task is not built yet.
  model_config(config, vocab_size=3)

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
  _int(config, "decode_extra_length", 1)
  _real(config, "beam_alpha", 0.0)
  for key in ("eval_every_steps", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    _int(config, key, 1)
  if config.get("eval_by_length") not in (None, True, False):
    _fail("eval_by_length", config.get("eval_by_length"), "True, False or None")
