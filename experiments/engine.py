"""The one seam between experiments/ and the rpr engine: every call into its config handling, training loop, data
sets and model building goes through here.

The sweeps hold their configs as ``ConfigDict``s (what ``run.py --config`` reads); here each is parsed into the
typed :class:`rpr.config.RunConfig` at the boundary, once per run (``rpr.config.parse``). Engine modules outside
the config (records, plateau rule, workdir lock, stop signals, allocator) are imported where they are used. JAX
is imported only by the functions that need it, so reading records and printing a sweep stay light.
"""

from __future__ import annotations

import importlib
import pathlib
from typing import Any, Mapping, Optional

from rpr import config as _config
from rpr import record as _record
from rpr import records as _records

dedupe, end_step, plateau_step = _records.dedupe, _records.end_step, _records.plateau_step
evaluated_splits = _config.evaluated_splits  # the splits a run of a config evaluates at its last step


def load_config(config: str, variant: str = "", settings: Mapping[str, Any] = ()):
  """``get_config(variant)`` of ``configs/<file>.py``, locked (an unknown key fails), with ``settings`` set by
  dotted key (``model.shaw.use_values``), as run.py's ``--config=<file>:<variant> --config.<key>=<value>`` does."""
  module = importlib.import_module("configs." + pathlib.Path(config).stem)
  out = module.get_config(variant)
  out.lock()
  out.update_from_flattened_dict(dict(settings))  # locked: an unknown key raises
  return out


def validate(config, workdir: Optional[str] = None, num_devices: Optional[int] = None):
  """The parsed and validated ``config`` (:class:`rpr.config.RunConfig`), checked against ``workdir``'s history
  and this process's devices by default."""
  if num_devices is None:
    import jax

    num_devices = jax.device_count()
  parsed = _config.parse(config, num_devices)
  if workdir is not None:
    _record.check_resume(parsed, workdir, quiet=True)
  return parsed


def train(config, workdir: str) -> dict:
  """One training run (``rpr.train.train_and_evaluate``) of a parsed config (:func:`validate`): resumes from
  ``workdir``'s checkpoint; its final metrics (``stopped_by_signal`` set when a signal stopped it)."""
  from rpr import train as train_lib  # JAX: only when something trains

  return train_lib.train_and_evaluate(config, workdir)


def prepare_data(configs) -> int:
  """Makes the files ``configs`` share (generated data, vocabulary) once per data set config; how many distinct
  data configs had files to make or check."""
  from rpr import data

  seen = set()
  for config in configs:
    name = config.get("dataset")
    key = (name, *(repr(config.get(k)) for k in data.entry(name).keys))
    if key not in seen:
      seen.add(key)
      data.prepare(_config.parse(config).data)
  return sum(data.entry(k[0]).prepare is not None for k in seen)


def recorded_config(raw: dict) -> dict:
  """A workdir's ``config.json`` as the current engine reads it: migrated, and every engine key it lacks set to
  its default (a record written before a key existed ran as its default does)."""
  from configs import base

  defaults = base.get_config().to_dict()
  config = _record.migrate(raw)
  return {**{k: defaults[k] for k in _config.ENGINE_KEYS if k in defaults and k not in config}, **config}


def task_and_model(config, data_dir: str, num_devices: int):
  """``(task, model_config, model, (tx, schedule))`` of a run config, built as ``rpr.train`` builds them."""
  from rpr import data, optim
  from rpr.model import build

  parsed = _config.parse(config, num_devices)
  task = data.get_task(parsed.data, data_dir, num_devices)
  model_config = parsed.model.replace(vocab_size=task.vocab.size)
  return task, model_config, build(model_config), optim.make_optimizer(parsed.optim, model_config.d_model,
                                                                       parsed.budget.num_train_steps)


def preset_model(name: str, **overrides):
  """The Transformer of the named model preset (``base``, ``big``, ``tiny``) with ``overrides``."""
  from rpr import model as model_lib

  return model_lib.Transformer(model_lib.preset(name, **overrides))


def steps():
  """``rpr.steps``, as training runs it: ``init_state`` (a model's parameters and optimizer state) and
  ``train_step`` (one optimizer step on a batch); imported on first use, as it brings JAX."""
  from rpr import steps as steps_lib

  return steps_lib
