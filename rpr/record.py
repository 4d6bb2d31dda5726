"""A run's ``config.json``: written from the typed config, read back into it (older records migrated), and the rules
for resuming a workdir with a config that differs from its record.

``config.json`` holds ``config`` (:meth:`rpr.config.RunConfig.to_dict`: the flat shape of
the config files), ``model_config`` (the model as it was built, vocabulary
size included) and the machine and code (:mod:`rpr.provenance`). Records
written by earlier versions read through :func:`migrate`. Resuming refuses
a change of a key outside :data:`RESUME_SAFE_KEYS` and the keys the run
explicitly allows (``run.py --allow_config_change=...``).
"""

from __future__ import annotations

import json
import os

from absl import logging

from rpr import config as config_lib
from rpr import provenance
from rpr import records
from rpr import workdir as workdir_lib
from rpr.attention import positions
from rpr.config import ConfigError, RunConfig
from rpr.model_config import ModelConfig

# Keys a resumed run may change: how far it trains, how often it logs, evaluates and saves, and how it
# evaluates. The updates stay those of a straight run, except num_train_steps under the cosine schedule or a
# cool-down (cooldown_fraction > 0), which decay to 0 at num_train_steps (so it is safe only without them).
RESUME_SAFE_KEYS = ("num_train_steps", "eval_every_steps", "log_every_steps", "checkpoint_every_steps",
                    "keep_checkpoints", "eval_splits", "final_eval_splits", "eval_batch_size", "max_eval_batches",
                    "num_eval_examples", "eval_by_length", "source_length_buckets", "decode_method",
                    "decode_extra_length", "beam_size", "beam_alpha", "final_decode_method", "average_last",
                    "tensorboard", *config_lib.PLATEAU_KEYS)
# The first records held the model's fields at the top level, some under other names; these two keys are gone.
_RENAMED = {"model_max_length": "max_length"}
_DROPPED = ("preset", "compare_positions")
# Scheme options renamed since: scheme -> {recorded name: its name now}. T5's horizon had a name that also read as
# Shaw's clipping distance.
_RENAMED_OPTIONS = {"t5": {"bucket_max_distance": "horizon"}}


def migrate(recorded: dict) -> dict:
  """A recorded config (``config.json``'s ``config``) in the shape :meth:`rpr.config.RunConfig.from_dict` reads.

  The first records kept the model's fields and every scheme's options at
  the top level; later ones kept the options in one dict for every scheme,
  ``model.position_options``: each option goes to the scheme that declares
  it (``model.<scheme>`` wins where both give one), under its current name
  (:data:`_RENAMED_OPTIONS`). A key a record lacks takes its declared
  default, which is how a run without it ran.
  """
  recorded = {k: v for k, v in recorded.items() if k not in _DROPPED}
  model = recorded.get("model")
  if model is None:
    recorded, model = _model_from_top_level(recorded)
  if not isinstance(model, dict):
    return recorded
  model = dict(model)
  flat = model.pop("position_options", None)
  for name in positions.SCHEMES:
    defaults = positions.defaults(name)
    if not defaults:
      continue
    given = _renamed(name, model.get(name) if isinstance(model.get(name), dict) else {})
    if isinstance(flat, dict):
      given = {**{k: v for k, v in _renamed(name, flat).items() if k in defaults}, **given}
    model[name] = {**defaults, **given}
  return {**recorded, "model": model}


def _renamed(scheme: str, options: dict) -> dict:
  """``options`` of ``scheme`` with each recorded name that has changed replaced by its current one."""
  names = _RENAMED_OPTIONS.get(scheme, {})
  return {names.get(k, k): v for k, v in options.items()}


def _model_from_top_level(recorded: dict) -> tuple[dict, dict]:
  """The first records' model fields and options, moved under ``model`` (``max_length`` and ``vocab_size`` at the
  top level were the data set's then too)."""
  fields = set(ModelConfig.__dataclass_fields__) - {"max_length", "vocab_size"}
  options = {k for name in positions.SCHEMES for k in positions.defaults(name)}
  options |= {old for names in _RENAMED_OPTIONS.values() for old in names}
  top, model, flat = {}, {}, {}
  for key, value in recorded.items():
    name = _RENAMED.get(key, key)
    if name in fields or key in _RENAMED:
      model[name] = value
    elif key in options or key == "alibi_directional":
      flat[key] = value
    else:
      top[key] = value
  if flat.pop("alibi_directional", False) and model.get("position") == "alibi":
    model["position"] = "alibi_directional"
  return top, {**model, "position_options": flat}


def read(path: str) -> RunConfig:
  """The :class:`~rpr.config.RunConfig` a ``config.json`` at ``path`` records, migrated, not validated."""
  with open(path, encoding="utf-8") as f:
    return RunConfig.from_dict(migrate(json.load(f)["config"]))


def load(workdir: str) -> RunConfig:
  """The validated config of the run in ``workdir`` (its ``config.json``)."""
  return config_lib.validate(read(os.path.join(workdir, "config.json")))


def write(workdir: str, record: dict) -> dict:
  """``<workdir>/config.json`` = ``record`` (``config``: :meth:`~rpr.config.RunConfig.to_dict`; ``model_config``: the
  model as built) and the environment, replaced atomically, so a kill never leaves half of one (process 0 only);
  returns what it holds (on every process)."""
  import jax

  record = {**record, **provenance.environment()}
  if jax.process_index() == 0:
    records.replace_lines(os.path.join(workdir, "config.json"), [json.dumps(record, indent=2, sort_keys=True)])
  return record


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
  return out


def check_resume(config: RunConfig, workdir: str, allow_changes=(), quiet: bool = False,
                 trust_checkpoints: bool = False) -> dict:
  """Refuses to go on in ``workdir`` with a config that differs from its ``config.json`` in an unsafe key, or from
  a history that cannot be resumed.

  Every start compares the config with ``config.json`` when there is one,
  whether or not a checkpoint was saved yet, both read into the typed tree.
  Keys of :data:`RESUME_SAFE_KEYS` and of ``allow_changes`` (dotted for the
  model's: ``model.dropout_rate``) may change; any other change fails with
  one line naming each key, its old and its new value. A workdir with
  checkpoints or metrics but no ``config.json`` is refused unless
  ``trust_checkpoints`` (the user confirms that this config trained them).
  A workdir whose ``metrics.jsonl`` records a finished run (to ``num_train_steps``, or to where a plateau rule
  stopped it) but whose ``checkpoints/`` holds no step (a fresh clone of committed results, or checkpoints
  deleted to save disk) is refused with :class:`rpr.workdir.Unusable`: training would start over and set its
  records aside, and that is the user's call, not a rerun's.
  A change of the recorded environment (:func:`rpr.provenance.environment`) is logged.
  ``quiet``: nothing is logged.

  Returns the config as ``config.json`` records it (:meth:`~rpr.config.RunConfig.to_dict`), the one compared here,
  for :func:`write` once the run has restored.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir {workdir!r} is a file; allowed: a directory (created if missing)")
  path, steps = os.path.join(workdir, "config.json"), workdir_lib.checkpoint_steps(workdir)
  metrics = os.path.join(workdir, "metrics.jsonl")
  history = steps or (os.path.isfile(metrics) and os.path.getsize(metrics) > 0)
  resumed = os.path.isfile(path)
  if not resumed and history and not trust_checkpoints:
    held = f"checkpoints (steps {', '.join(map(str, steps))})" if steps else "metrics.jsonl"
    raise ConfigError(f"--workdir {workdir!r} holds {held} but no config.json, so what trained them is unknown; "
                      "allowed: pass --trust_checkpoints to go on with this config, or use a new --workdir")
  new, old, record = _flat(json.loads(json.dumps(recorded := config.to_dict()))), {}, {}
  if resumed:
    try:
      with open(path, encoding="utf-8") as f:
        record = json.load(f)
      old = _flat(json.loads(json.dumps(RunConfig.from_dict(migrate(record["config"])).to_dict())))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise ConfigError(f"{path} does not read as a run record ({type(e).__name__}: {e}); allowed: the config.json "
                        "of the run that wrote the checkpoints") from None
  unknown = sorted(set(allow_changes) - new.keys() - old.keys())
  if unknown:
    raise ConfigError(f"--allow_config_change: unknown config key(s) {unknown}; allowed: keys of --print_config, "
                      "dotted below model (model.dropout_rate)")
  ends = config.optim.schedule == "cosine" or config.optim.cooldown_fraction > 0  # the rate depends on the end
  safe = set(RESUME_SAFE_KEYS) - ({"num_train_steps"} if ends else set())
  differs = lambda k: k not in old or k not in new or old[k] != new[k]
  changed = sorted(filter(differs, old.keys() | new.keys())) if resumed else []
  show = lambda d, k: repr(d[k]) if k in d else "(absent)"
  refused = [k for k in changed if k not in safe | set(allow_changes)]
  if refused:
    raise ConfigError(f"the config differs from {path}, the record of the run in this workdir: "
                      + ", ".join(f"{k} {show(old, k)} -> {show(new, k)}" for k in refused)
                      + f"; resume with the same config, pass --allow_config_change={','.join(refused)}, or use a "
                      "new --workdir (safe to change: rpr.record.RESUME_SAFE_KEYS)")
  if not steps:  # a finished run's records, its checkpoints gone: nothing to resume, and not to be trained over
    last, plateau = records.last_step(metrics)
    if plateau or last >= config.budget.num_train_steps > 0:
      raise workdir_lib.Unusable(f"--workdir {workdir!r} holds a finished run (metrics.jsonl to step {last}) but no "
                                 "checkpoint, so there is nothing to resume; allowed: a new --workdir, or move "
                                 "metrics.jsonl away to train it again from step 0")
  if not quiet:
    for k in changed:
      log = logging.info if k in safe else logging.warning
      log("Resuming %s with config.%s changed: %s -> %s.", workdir, k, show(old, k), show(new, k))
    for k, v in provenance.environment().items():
      if k in record and record[k] != v and k not in provenance.SAME_NUMBERS:
        logging.warning("Resuming %s with %s %r, recorded %r: the run goes on, but may not repeat a straight run "
                        "bit for bit.", workdir, k, v, record[k])
  return recorded
