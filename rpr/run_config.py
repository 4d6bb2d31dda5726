"""The run config: every check in one place, and the model config it describes.

``validate(config, num_devices, workdir)`` runs before any data or model is
built and before anything is written; a bad value fails with a
:class:`ConfigError` naming the config key and what is allowed, and so does
resuming a workdir (one with ``config.json`` and a checkpoint) with a config
that differs in a key outside :data:`RESUME_SAFE_KEYS` and the keys the run
explicitly allows (``run.py --allow_config_change=...``).
``model_config(config, vocab_size)`` is ``ModelConfig(**config.model,
vocab_size=vocab_size)``, validated: the ``model`` sub-dict holds the
model's fields by name.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from typing import Mapping

import jax
import ml_collections
from absl import logging

from rpr import data
from rpr import model as model_lib
from rpr import optim
from rpr import plateau
from rpr import provenance
from rpr.attention import positions
from rpr.data import synthetic

DECODE_METHODS = ("greedy", "beam")
# Keys a resumed run may change: how far it trains, how often it logs, evaluates and saves, and how it
# evaluates. The updates stay those of a straight run, except num_train_steps under the cosine schedule or a
# cool-down (cooldown_fraction > 0), which decay to 0 at num_train_steps (so it is safe only without them).
PLATEAU_KEYS = ("plateau_metric", "plateau_min_steps", "plateau_window", "plateau_min_gain", "plateau_smoothing")
RESUME_SAFE_KEYS = ("num_train_steps", "eval_every_steps", "log_every_steps", "checkpoint_every_steps",
                    "keep_checkpoints", "eval_splits", "final_eval_splits", "eval_batch_size", "max_eval_batches",
                    "num_eval_examples", "eval_by_length", "source_length_buckets", "decode_method",
                    "decode_extra_length", "beam_size", "beam_alpha", "final_decode_method", "average_last",
                    "tensorboard", *PLATEAU_KEYS)
# The top-level keys the engine reads (configs/base.py's, but for copy/reverse's); a data set reads its own too
# (rpr.data.register(keys=...)), and a config key that neither reads is refused.
ENGINE_KEYS = ("dataset", "seed", "batch_size", "eval_batch_size", "eval_splits", "final_eval_splits",
               "max_eval_batches", "eval_by_length", "source_length_buckets", "model", "optimizer", "learning_rate",
               "schedule", "cooldown_fraction", "warmup_steps", "adam_b1", "adam_b2", "adam_eps", "weight_decay",
               "grad_clip_norm", "label_smoothing", "num_train_steps", "eval_every_steps", "decode_method",
               "decode_extra_length", "beam_size", "beam_alpha", "log_every_steps", "checkpoint_every_steps",
               "keep_checkpoints", "final_decode_method", "average_last", "tensorboard", *PLATEAU_KEYS)


def evaluated_splits(config, final: bool = True) -> tuple[str, ...]:
  """The splits an evaluation step scores: ``eval_splits``, and at the last step (``final``) ``final_eval_splits``."""
  return (*config.eval_splits, *(config.get("final_eval_splits", ()) if final else ()))


class ConfigError(ValueError):
  """A user error in the run config or its workdir: the message names the bad thing and what is allowed."""


# ModelConfig fields the engine sets itself, not the run config.
ENGINE_FIELDS = ("vocab_size", "deterministic", "decode")
# ModelConfig fields a run config gives as one dict per scheme (model.<scheme>), not by these names.
OPTION_FIELDS = ("position_options", "cross_position_options")
_DICTS = (Mapping, ml_collections.ConfigDict)


def model_config(config, vocab_size: int) -> model_lib.ModelConfig:
  """The validated :class:`~rpr.model.ModelConfig` of ``config.model`` (errors name ``config.model.<key>``).

  ``config.model`` holds ModelConfig's fields by name and one dict of options
  per position scheme (``model.shaw``, ``model.t5``, ...): every scheme's
  options are checked, and the model takes those of ``position`` and
  ``cross_position``.
  """
  if not isinstance(config.model, _DICTS):
    _fail("model", config.model, "a dict of rpr.model.ModelConfig's fields (configs/base.py)")
  values = config.model.to_dict() if hasattr(config.model, "to_dict") else dict(config.model)
  options = {name: values.pop(name) for name in list(values) if name in positions.SCHEMES}
  for name, given in options.items():
    if not isinstance(given, _DICTS):
      _fail(f"model.{name}", given, f"a dict of {name}'s options {sorted(positions.defaults(name))}")
    try:
      options[name] = positions.parse_options(name, given)
    except ValueError as e:
      raise ValueError(f"config.model.{name}: {e}") from None
  fields = [f for f in model_lib.ModelConfig.__dataclass_fields__ if f not in ENGINE_FIELDS + OPTION_FIELDS]
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(f"config.model has unknown key(s) {unknown}; allowed: {fields}, and one dict of options per "
                     f"position scheme: {sorted(n for n in positions.SCHEMES if positions.defaults(n))}")
  for key, scheme in (("position_options", "position"), ("cross_position_options", "cross_position")):
    name = values.get(scheme, model_lib.ModelConfig.__dataclass_fields__[scheme].default)
    if isinstance(name, str) and name in options:
      values[key] = options[name]
  try:
    return model_lib.ModelConfig(**values, vocab_size=vocab_size).validate()
  except ValueError as e:
    raise ValueError(f"config.{e}") from None


def _fail(key: str, value, allowed) -> None:
  raise ValueError(f"config.{key} = {value!r} is not allowed; allowed: {allowed}")


def _int(config, key: str, minimum: int, optional: bool = False, why: str = "") -> None:
  v = config.get(key)
  if optional and v is None:
    return
  if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
    _fail(key, v, f"an int >= {minimum}{why}" + (" or None" if optional else ""))


def _float(v) -> float:
  try:
    return float(v)
  except OverflowError:  # an int beyond the floats: 10**400
    return math.inf if v > 0 else -math.inf


def _real(config, key: str, lo: float, hi: float = math.inf, lo_open: bool = False, optional: bool = False,
          finite: bool = True) -> None:
  v = config.get(key)
  if optional and v is None:
    return
  ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(f := _float(v))
  ok = ok and (f > lo if lo_open else f >= lo) and f <= hi and (math.isfinite(f) or not finite)
  if not ok:
    bound = f" and <= {hi}" if hi < math.inf else " and finite" if finite else ""
    _fail(key, v, f"a number {'>' if lo_open else '>='} {lo}{bound}" + (" or None" if optional else ""))


def _choice(config, key: str, allowed) -> None:
  if not isinstance(config.get(key), str) or config.get(key) not in allowed:
    _fail(key, config.get(key), list(allowed))


def check_xla_flags(value: str) -> None:
  """Raises :class:`ConfigError` if XLA would ignore part of the ``XLA_FLAGS`` value ``value``.

  XLA stops reading the value at its first word without a leading ``--`` (such as the often-copied
  ``intra_op_parallelism_threads=1``): every flag after that word is dropped without a word, so a run meant for
  two devices trains on one.
  """
  words = value.split()
  bare = next((i for i, w in enumerate(words) if not w.startswith("--")), len(words))
  ignored = [w for w in words[bare + 1:] if w.startswith("--")]
  if ignored:
    raise ConfigError(f"XLA_FLAGS: XLA stops reading at {words[bare]!r} (no leading '--') and would ignore "
                      f"{' '.join(ignored)}; allowed: '--' flags, with any other word last")


def validate(config, num_devices: int, workdir: str | None = None, allow_changes=(), quiet: bool = False,
             trust_checkpoints: bool = False) -> None:
  """Raises :class:`ConfigError` naming the first bad key of ``config`` (or the workdir) and what it allows.

  With ``workdir``, also refuses to resume it with a changed config (see :func:`check_resume`; ``quiet``: without
  logging the changes it allows, nor starting JAX's runtime to compare the environment).
  """
  if workdir is not None and os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir {workdir!r} is a file; allowed: a directory (created if missing)")
  check_xla_flags(os.environ.get("XLA_FLAGS", ""))
  try:
    _validate(config, num_devices)
    if workdir is not None:
      check_resume(config, workdir, allow_changes, quiet, trust_checkpoints)
  except ConfigError:
    raise
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    message = str(e).strip('"')
    if isinstance(e, (KeyError, AttributeError)):
      message = f"config has no key {message}; see configs/base.py or --print_config"
    raise ConfigError(message) from None


def _validate(config, num_devices: int) -> None:
  allowed = set(ENGINE_KEYS).union(*(e.keys for e in data.REGISTRY.values()))
  unknown = sorted(set(config.keys()) - allowed)
  if unknown:
    raise ValueError(f"unknown config key(s) {', '.join('config.' + k for k in unknown)}; allowed: the engine's "
                     f"(configs/base.py) and those a data set reads (rpr.data.register(keys=...)): {sorted(allowed)}")

  # Data.
  dataset = config.get("dataset")
  if not isinstance(dataset, (str, type(None))):
    raise ValueError(f"config.dataset: unknown data set {dataset!r}; allowed: {data.names()}")
  entry = data.entry(dataset)
  for key in ("batch_size", "eval_batch_size"):
    # Token-budget data sets (wmt14) size their training batches themselves.
    _int(config, key, 1, optional=key == "batch_size" and entry.batch_by_tokens)
    if config[key] is not None and config[key] % num_devices:
      raise ValueError(f"config.{key} = {config[key]} must be divisible by the number of devices "
                       f"({num_devices}): the batch is split evenly over the 'data' mesh axis")
  for key in ("eval_splits", "final_eval_splits"):
    splits = config.get(key, ())
    if not isinstance(splits, (tuple, list)) or not all(isinstance(s, str) for s in splits):
      _fail(key, splits, "a tuple of split names")
    if entry.splits is not None and any(s not in entry.splits for s in splits):
      _fail(key, tuple(splits), f"names from {list(entry.splits)} (data set {config.dataset!r})")
  splits = evaluated_splits(config)
  if len(set(splits)) < len(splits):
    _fail("final_eval_splits", tuple(config.final_eval_splits),
          f"splits not in eval_splits {tuple(config.eval_splits)}")
  synthetic_data = config.dataset in synthetic.KINDS
  if synthetic_data:
    _int(config, "min_length", 1)
    _int(config, "max_length", config.min_length, why=" (min_length)")
    if "long" in splits:  # strings of max_length + 1 .. long_max_length
      _int(config, "long_max_length", config.max_length + 1, why=" (max_length + 1: the long split is longer)")
    _int(config, "num_eval_examples", 1)
  _int(config, "seed", 0)
  _int(config, "max_eval_batches", 1, optional=True)

  # Model: any vocabulary will do, the task is not built yet.
  model_config(config, vocab_size=3)
  if synthetic_data:  # decoding stops at model.max_length: the longest target must fit, EOS included
    key = "long_max_length" if "long" in splits else "max_length"
    if config.model.max_length < config[key] + 1:
      _fail("model.max_length", config.model.max_length,
            f"an int >= {config[key] + 1} (the longest target: {key} {config[key]} + EOS)")

  # Optimisation.
  _choice(config, "optimizer", optim.OPTIMIZERS)
  _choice(config, "schedule", optim.SCHEDULES)
  _real(config, "learning_rate", 0.0, lo_open=True)
  _int(config, "warmup_steps", 1)
  _real(config, "cooldown_fraction", 0.0, 1.0)
  _real(config, "adam_b1", 0.0, 1.0)
  _real(config, "adam_b2", 0.0, 1.0)
  _real(config, "adam_eps", 0.0, lo_open=True)
  _real(config, "weight_decay", 0.0)
  _real(config, "grad_clip_norm", 0.0, lo_open=True, optional=True, finite=False)  # inf: no clipping
  _real(config, "label_smoothing", 0.0, 1.0)
  if config.label_smoothing == 1.0:
    _fail("label_smoothing", 1.0, "a number in [0, 1)")
  _int(config, "num_train_steps", 0)

  _validate_evaluation(config)


def _validate_evaluation(config) -> None:
  """The evaluation and bookkeeping keys."""
  _choice(config, "decode_method", DECODE_METHODS)
  if config.get("final_decode_method") is not None:
    _choice(config, "final_decode_method", DECODE_METHODS)
  _validate_plateau(config)
  _int(config, "beam_size", 1)
  _int(config, "decode_extra_length", 1)
  _real(config, "beam_alpha", 0.0)
  for key in ("eval_every_steps", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    _int(config, key, 1)
  _int(config, "average_last", 1)
  if config.average_last > config.keep_checkpoints:
    _fail("average_last", config.average_last, f"an int <= keep_checkpoints ({config.keep_checkpoints}): the "
          "checkpoints it averages must be kept")
  for key in ("eval_by_length", "tensorboard"):
    if not isinstance(config.get(key, False), bool):
      _fail(key, config.get(key), "True or False")
  buckets = config.get("source_length_buckets", ())
  if (not isinstance(buckets, (tuple, list))
      or not all(isinstance(b, numbers.Integral) and not isinstance(b, bool) and b >= 1 for b in buckets)
      or list(buckets) != sorted(set(buckets))):
    _fail("source_length_buckets", buckets, "a tuple of increasing ints >= 1 (each bucket's largest source length)")


def _validate_plateau(config) -> None:
  metric = config.get("plateau_metric")
  if metric is None:
    return
  split = metric.split("/", 1)[0] if isinstance(metric, str) else None
  if split not in config.eval_splits:
    _fail("plateau_metric", metric, f"None or '<split>/<metric>' of a split in eval_splits {tuple(config.eval_splits)}")
  if metric.rsplit("/", 1)[-1] not in plateau.HIGHER + plateau.LOWER:
    _fail("plateau_metric", metric, f"'<split>/<name>' with name in {list(plateau.HIGHER + plateau.LOWER)}")
  _int(config, "plateau_min_steps", 0)
  _real(config, "plateau_window", 0.0, 1.0, lo_open=True)
  if config.plateau_window == 1.0:
    _fail("plateau_window", 1.0, "a number in (0, 1)")
  _real(config, "plateau_min_gain", 0.0)
  _int(config, "plateau_smoothing", 1)


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
  return out


# Top-level keys added after runs were committed, with the value that gives what those runs did.
ADDED_KEYS = {"cooldown_fraction": 0.0}


def migrate(recorded: dict) -> dict:
  """A recorded config (``config.json``) in the shape this module reads: each scheme's options in ``model.<scheme>``.

  Options held in one dict for every scheme, ``model.position_options``, go
  each to the scheme that declares it (``model.<scheme>`` wins where both give
  one). An option a record lacks is set to its default, which is how a run
  without that option ran; so is a top-level key added since (``ADDED_KEYS``).
  """
  recorded = {**ADDED_KEYS, **recorded}
  model = recorded.get("model")
  if not isinstance(model, dict):
    return recorded
  model = dict(model)
  flat = model.pop("position_options", None)
  for name in positions.SCHEMES:
    defaults = positions.defaults(name)
    if not defaults:
      continue
    given = model.get(name) if isinstance(model.get(name), dict) else {}
    if isinstance(flat, dict):
      given = {**{k: v for k, v in flat.items() if k in defaults}, **given}
    model[name] = {**defaults, **given}
  return {**recorded, "model": model}


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run in ``workdir`` recorded (``config.json``), in the shape this module reads (:func:`migrate`)."""
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    return ml_collections.ConfigDict(migrate(json.load(f)["config"]))


def check_resume(config, workdir: str, allow_changes=(), quiet: bool = False, trust_checkpoints: bool = False) -> None:
  """Refuses to go on in ``workdir`` with a config that differs from its ``config.json`` in an unsafe key.

  Every start compares the config with ``config.json`` when there is one,
  whether or not a checkpoint was saved yet. Keys of
  :data:`RESUME_SAFE_KEYS` and of ``allow_changes`` (dotted for the
  model's: ``model.dropout_rate``) may change; any other change fails with
  one line naming each key, its old and its new value. A workdir with
  checkpoints or metrics but no ``config.json`` is refused unless
  ``trust_checkpoints`` (the user confirms that this config trained them).
  A change of the recorded environment (:func:`rpr.provenance.environment`) is logged.
  ``quiet``: nothing is logged.
  """
  path, checkpoints = os.path.join(workdir, "config.json"), os.path.join(workdir, "checkpoints")
  steps = sorted((int(n) for n in os.listdir(checkpoints) if n.isdigit()), reverse=True) if os.path.isdir(
      checkpoints) else []
  metrics = os.path.join(workdir, "metrics.jsonl")
  history = steps or (os.path.isfile(metrics) and os.path.getsize(metrics) > 0)
  resumed = os.path.isfile(path)
  if not resumed and history and not trust_checkpoints:
    held = f"checkpoints (steps {', '.join(map(str, steps))})" if steps else "metrics.jsonl"
    raise ConfigError(f"--workdir {workdir!r} holds {held} but no config.json, so what trained them is unknown; "
                      "allowed: pass --trust_checkpoints to go on with this config, or use a new --workdir")
  new, old, record = _flat(json.loads(config.to_json_best_effort())), {}, {}
  if resumed:
    try:
      with open(path, encoding="utf-8") as f:
        record = json.load(f)
      old = _flat(migrate(record["config"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ConfigError(f"{path} does not read as a run record ({type(e).__name__}: {e}); allowed: the config.json "
                        "of the run that wrote the checkpoints") from None
  unknown = sorted(set(allow_changes) - new.keys() - old.keys())
  if unknown:
    raise ConfigError(f"--allow_config_change: unknown config key(s) {unknown}; allowed: keys of --print_config, "
                      "dotted below model (model.dropout_rate)")
  if not resumed:
    return
  ends = config.get("schedule") == "cosine" or config.get("cooldown_fraction", 0.0) > 0  # the rate depends on the end
  safe = set(RESUME_SAFE_KEYS) - ({"num_train_steps"} if ends else set())
  changed = sorted(k for k in old.keys() | new.keys() if k not in old or k not in new or old[k] != new[k])
  show = lambda d, k: repr(d[k]) if k in d else "(absent)"
  refused = [k for k in changed if k not in safe | set(allow_changes)]
  if refused:
    raise ConfigError(f"the config differs from {path}, the record of the run in this workdir: "
                      + ", ".join(f"{k} {show(old, k)} -> {show(new, k)}" for k in refused)
                      + f"; resume with the same config, pass --allow_config_change={','.join(refused)}, or use a "
                      "new --workdir (safe to change: rpr.run_config.RESUME_SAFE_KEYS)")
  if quiet:
    return
  for k in changed:
    log = logging.info if k in safe else logging.warning
    log("Resuming %s with config.%s changed: %s -> %s.", workdir, k, show(old, k), show(new, k))
  for k, v in provenance.environment().items():
    if k in record and record[k] != v and k not in provenance.SAME_NUMBERS:
      logging.warning("Resuming %s with %s %r, recorded %r: the run goes on, but may not repeat a straight run bit "
                      "for bit.", workdir, k, v, record[k])
