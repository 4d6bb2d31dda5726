"""The run config, typed: one frozen tree parsed once at the boundary, validated once, written to and read from disk.

``parse(config_dict)`` turns the ``ml_collections.ConfigDict`` of a config
file and its ``--config.<key>`` flags into a :class:`RunConfig`, and
:func:`validate` holds it to the declarations beside its fields
(:mod:`rpr.fields`) and to the rules between them; a bad value fails with a
:class:`ConfigError` of one line naming the key, the value and what is
allowed. Below ``run.py`` and the sweep runner nothing takes a ConfigDict:
:mod:`rpr.train` takes the tree, and each part of the engine the section it
reads (:class:`Data` for the data set, :class:`~rpr.model_config.ModelConfig`,
:class:`Optim`, :class:`Eval`, :class:`Budget`).

The user-facing names stay those of ``configs/base.py``: keys are flat but
for ``model`` (ModelConfig's fields and one dict of options per position
scheme, ``model.shaw.use_values``), and :meth:`RunConfig.to_dict` writes that
shape to ``config.json``; :meth:`RunConfig.from_dict` reads it back (:mod:`rpr.record` adds
the migration of older records and the resume rules).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional

from rpr import data
from rpr import fields
from rpr import optim
from rpr import plateau
from rpr.attention import positions
from rpr.data import synthetic
from rpr.fields import refuse, setting
from rpr.model_config import ModelConfig

DECODE_METHODS = ("greedy", "beam")
# Bounds that stop a huge value in one line before any allocation (issue 71).
MAX_BATCH = 2 ** 20  # rows of one global batch
MAX_SEED = 2 ** 32 - 1  # jax.random.PRNGKey takes a 32-bit seed without x64
MAX_STEPS = 10 ** 9


class ConfigError(ValueError):
  """A user error in the run config or its workdir: the message names the bad thing and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Data:
  """What is trained on: the data set by name, its seed and batch sizes, and its own keys (``own``).

  The data set's factory (:mod:`rpr.data`) is given this section: its own keys
  read as attributes of it (``section.max_length``) and through ``section.get``.
  """
  dataset: Optional[str] = setting(None, str, optional=True)  # a name in rpr.data: required (from_dict checks it)
  seed: int = setting(0, int, lo=0, hi=MAX_SEED)  # the batch order, the parameter init and dropout
  batch_size: Optional[int] = setting(64, int, lo=1, hi=MAX_BATCH, optional=True,
                                      why=" (None: a token-budget data set's batches)")
  eval_batch_size: int = setting(128, int, lo=1, hi=MAX_BATCH)
  own: Any = None  # the data set's section (rpr.data.sections), filled from the keys of the same names

  def __getattr__(self, name: str):
    own = self.__dict__.get("own")
    if own is not None and not name.startswith("__") and name in fields.names(type(own)):
      return getattr(own, name)
    raise AttributeError(f"config has no data key {name!r}")

  def get(self, key: str, default=None):
    try:
      return getattr(self, key)
    except AttributeError:
      return default

  def to_dict(self) -> dict:
    own = dataclasses.asdict(self.own) if self.own is not None else {}
    return {**{k: getattr(self, k) for k in fields.names(Data)}, **own}

  def check(self) -> None:
    entry = data.entry(self.dataset)
    if self.batch_size is None and not entry.batch_by_tokens:
      refuse("batch_size", None, f"an int >= 1 (data set {self.dataset!r} batches rows)")
    fields.check(self.own)


@dataclasses.dataclass(frozen=True)
class Optim:
  """The optimizer, its learning-rate schedule and the loss's label smoothing (:mod:`rpr.optim`)."""
  optimizer: str = setting("adam", str, choices=optim.OPTIMIZERS)
  learning_rate: float = setting(3e-3, float, lo=0.0, lo_open=True)
  schedule: str = setting("rsqrt", str, choices=optim.SCHEDULES)
  warmup_steps: int = setting(200, int, lo=1, hi=MAX_STEPS)
  cooldown_fraction: float = setting(0.0, float, lo=0.0, hi=1.0)
  adam_b1: float = setting(0.9, float, lo=0.0, hi=1.0)
  adam_b2: float = setting(0.98, float, lo=0.0, hi=1.0)
  adam_eps: float = setting(1e-9, float, lo=0.0, lo_open=True)
  weight_decay: float = setting(0.0, float, lo=0.0)
  grad_clip_norm: Optional[float] = setting(None, float, lo=0.0, lo_open=True, finite=False, optional=True)
  label_smoothing: float = setting(0.1, float, lo=0.0, hi=1.0, hi_open=True)


@dataclasses.dataclass(frozen=True)
class Eval:
  """What each evaluation scores and how it decodes (:mod:`rpr.evaluation`, :mod:`rpr.predict`)."""
  eval_splits: tuple = setting(("valid", "long"), tuple, item=str)
  final_eval_splits: tuple = setting((), tuple, item=str)  # at the last step only
  max_eval_batches: Optional[int] = setting(None, int, lo=1, optional=True)
  eval_by_length: bool = setting(False, bool)
  source_length_buckets: tuple = setting((), tuple, item=int, lo=1, increasing=True,
                                         why=" (each bucket's largest source length)")
  decode_method: str = setting("greedy", str, choices=DECODE_METHODS)
  final_decode_method: Optional[str] = setting(None, str, choices=DECODE_METHODS, optional=True)
  decode_extra_length: int = setting(50, int, lo=1, hi=2 ** 20)
  beam_size: int = setting(4, int, lo=1, hi=1024)
  beam_alpha: float = setting(0.6, float, lo=0.0)
  average_last: int = setting(1, int, lo=1)  # the mean of the newest N checkpoints scored at the end


@dataclasses.dataclass(frozen=True)
class Budget:
  """How long the run trains and what it keeps: steps, the plateau rule (:mod:`rpr.plateau`), logs, checkpoints."""
  num_train_steps: int = setting(2000, int, lo=0, hi=MAX_STEPS)
  eval_every_steps: int = setting(500, int, lo=1)
  log_every_steps: int = setting(100, int, lo=1)
  checkpoint_every_steps: int = setting(500, int, lo=1)
  keep_checkpoints: int = setting(3, int, lo=1)
  tensorboard: bool = setting(True, bool)
  plateau_metric: Optional[str] = setting(None, str, optional=True)  # "<split>/<metric>"; checked by RunConfig
  plateau_min_steps: int = setting(0, int, lo=0)
  plateau_window: float = setting(0.25, float, lo=0.0, lo_open=True, hi=1.0, hi_open=True)
  plateau_min_gain: float = setting(0.0, float, lo=0.0)
  plateau_smoothing: int = setting(1, int, lo=1)

  def plateau_rule(self) -> Optional[plateau.Rule]:
    """The :class:`rpr.plateau.Rule` that the ``plateau_*`` keys set; None without ``plateau_metric`` (train to
    ``num_train_steps``)."""
    if self.plateau_metric is None:
      return None
    return plateau.Rule(self.plateau_metric, self.plateau_min_steps, self.plateau_window, self.plateau_min_gain,
                        self.plateau_smoothing)


SECTIONS = {"data": Data, "optim": Optim, "eval": Eval, "budget": Budget}
ENGINE_KEYS = (*(k for cls in SECTIONS.values() for k in fields.names(cls)), "model")
PLATEAU_KEYS = tuple(k for k in fields.names(Budget) if k.startswith("plateau_"))
# ModelConfig fields the engine sets itself, and those a run config gives as one dict per scheme (model.<scheme>).
ENGINE_FIELDS = ("vocab_size", "deterministic", "decode")
OPTION_FIELDS = ("position_options", "cross_position_options")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One run: what it trains on, the model, the optimizer, the evaluation and the budget."""
  data: Data = Data()
  model: ModelConfig = ModelConfig(vocab_size=None)
  optim: Optim = Optim()
  eval: Eval = Eval()
  budget: Budget = Budget()

  def to_dict(self) -> dict:
    """The flat shape of the config files and ``config.json``: what :meth:`from_dict` reads back to this tree."""
    out = {**self.data.to_dict()}
    for section in (self.optim, self.eval, self.budget):
      out.update(dataclasses.asdict(section))
    m = self.model
    model = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name not in ENGINE_FIELDS + OPTION_FIELDS}
    for scheme, options in ((m.position, m.position_options), (m.cross_position, m.cross_position_options)):
      if dataclasses.fields(options):
        model[scheme] = dataclasses.asdict(options)
    return {**out, "model": model}

  @classmethod
  def from_dict(cls, values: Mapping) -> "RunConfig":
    """The tree of a flat config (a config file's ``to_dict()`` or ``config.json``'s ``config``), not validated.

    A key that neither the engine nor any registered data set reads is refused; the keys of another data set
    than ``dataset`` are set aside (configs/base.py gives copy/reverse's to every config).
    """
    allowed = set(ENGINE_KEYS).union(*(e.keys for e in data.REGISTRY.values()))
    unknown = sorted(set(values) - allowed)
    if unknown:
      raise ValueError(f"unknown config key(s) {', '.join('config.' + k for k in unknown)}; allowed: the engine's "
                       f"(configs/base.py) and those a data set reads (rpr.data.register(section=...)): "
                       f"{sorted(allowed)}")
    dataset = values.get("dataset")
    if not isinstance(dataset, str) or dataset not in data.REGISTRY:
      raise ValueError(f"config.dataset: unknown data set {dataset!r}; allowed: {data.names()}")
    own = data.REGISTRY[dataset].section(**_pick(data.REGISTRY[dataset].section, values))
    return cls(data=Data(**_pick(Data, values), own=own), model=_model(values.get("model", {})),
                     optim=Optim(**_pick(Optim, values)), eval=Eval(**_pick(Eval, values)),
                     budget=Budget(**_pick(Budget, values)))

  def check(self) -> None:
    """The rules between sections."""
    entry, e = data.entry(self.data.dataset), self.eval
    for key in ("eval_splits", "final_eval_splits"):
      if entry.splits is not None and any(s not in entry.splits for s in getattr(e, key)):
        refuse(key, getattr(e, key), f"names from {list(entry.splits)} (data set {self.data.dataset!r})")
    splits = evaluated_splits(e)
    if len(set(splits)) < len(splits):
      refuse("final_eval_splits", e.final_eval_splits, f"splits not in eval_splits {e.eval_splits}")
    if e.average_last > self.budget.keep_checkpoints:
      refuse("average_last", e.average_last, f"an int <= keep_checkpoints ({self.budget.keep_checkpoints}): the "
             "checkpoints it averages must be kept")
    metric = self.budget.plateau_metric
    if metric is not None and metric.split("/", 1)[0] not in e.eval_splits:
      refuse("plateau_metric", metric, f"None or '<split>/<metric>' of a split in eval_splits {e.eval_splits}")
    if metric is not None and metric.rsplit("/", 1)[-1] not in plateau.HIGHER + plateau.LOWER:
      refuse("plateau_metric", metric, f"'<split>/<name>' with name in {list(plateau.HIGHER + plateau.LOWER)}")
    if self.data.dataset in synthetic.KINDS:  # decoding stops at model.max_length: the longest target must fit
      d = self.data
      key = "long_max_length" if "long" in splits else "max_length"
      if key == "long_max_length" and d.long_max_length < d.max_length + 1:
        refuse("long_max_length", d.long_max_length,
               f"an int >= {d.max_length + 1} (max_length + 1: the long split is longer)")
      if self.model.max_length < d.get(key) + 1:
        refuse("model.max_length", self.model.max_length,
               f"an int >= {d.get(key) + 1} (the longest target: {key} {d.get(key)} + EOS)")


def validate(config: RunConfig) -> RunConfig:
  """Raises ``ValueError`` naming the first bad key of ``config`` and what it allows; returns ``config``.

  The one validation of a run: each section's fields against their declarations, each section's own rules,
  then the rules between sections; then the model's notes, once (after every check, so that an error is the only
  line).
  """
  fields.check(config.data)
  config.model.validate(notes=False)
  for section in (config.optim, config.eval, config.budget):
    fields.check(section)
  config.check()
  config.model.log_notes()
  return config


def evaluated_splits(section, final: bool = True) -> tuple[str, ...]:
  """The splits an evaluation scores: ``eval_splits``, and at the last step (``final``) ``final_eval_splits``."""
  return (*section.eval_splits, *(getattr(section, "final_eval_splits", None) or () if final else ()))


# ----------------------------------------------------------------------------
# From and to the flat shape of the config files and config.json.


def _pick(cls, values: Mapping) -> dict:
  """The keys of ``values`` that the section ``cls`` declares. JSON gives lists where the config files give
  tuples: a tuple field holds a tuple (hashable, equal to the config file's); any other value is left as given."""
  tuples = lambda v: tuple(v) if isinstance(v, list) else v
  return {f.name: tuples(values[f.name]) if fields.spec(f).kind is tuple else values[f.name]
          for f in dataclasses.fields(cls) if fields.spec(f) is not None and f.name in values}


def _model(values) -> ModelConfig:
  """``config.model``: ModelConfig's fields by name, and one dict of options per scheme (``model.shaw``)."""
  if not isinstance(values, Mapping):
    refuse("model", values, "a dict of rpr.model_config.ModelConfig's fields (configs/base.py)")
  values = dict(values)
  options = {name: values.pop(name) for name in list(values) if name in positions.SCHEMES}
  for name, given in options.items():
    if not isinstance(given, Mapping):
      refuse(f"model.{name}", given, f"a dict of {name}'s options {sorted(positions.defaults(name))}")
    try:  # the options of every scheme given are typed here, whichever the model uses
      options[name] = positions.parse_options(name, given)
    except ValueError as e:
      raise ValueError(f"config.model.{name}: {e}") from None
  allowed = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in ENGINE_FIELDS + OPTION_FIELDS]
  unknown = sorted(set(values) - set(allowed))
  if unknown:
    raise ValueError(f"config.model has unknown key(s) {unknown}; allowed: {allowed}, and one dict of options per "
                     f"position scheme: {sorted(n for n in positions.SCHEMES if positions.defaults(n))}")
  for key, scheme in (("position_options", "position"), ("cross_position_options", "cross_position")):
    name = values.get(scheme, getattr(ModelConfig, scheme))
    if isinstance(name, str) and name in options:
      values[key] = options[name]
  try:
    return ModelConfig(**values, vocab_size=None)
  except ValueError as e:
    raise ValueError(f"config.{e}") from None


def parse(config, num_devices: Optional[int] = None) -> RunConfig:
  """The validated :class:`RunConfig` of ``config`` (a ConfigDict or a flat mapping), or :class:`ConfigError`.

  The one call at the boundary (run.py, the sweep runner). ``num_devices``: also checks that the batches split
  over that many devices (:func:`check_devices`). The workdir's rules are :func:`rpr.record.check_resume`'s.
  """
  check_xla_flags(os.environ.get("XLA_FLAGS", ""))
  values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  try:
    tree = validate(RunConfig.from_dict(values))
    if num_devices is not None:
      check_devices(tree, num_devices)
  except (ValueError, TypeError) as e:
    raise ConfigError(str(e).strip('"')) from None
  return tree


def check_devices(config: RunConfig, num_devices: int) -> None:
  """Raises :class:`ConfigError` unless each batch splits evenly over ``num_devices`` (the 'data' mesh axis)."""
  for key in ("batch_size", "eval_batch_size"):
    value = getattr(config.data, key)
    if value is not None and value % num_devices:
      raise ConfigError(f"config.{key} = {value} must be divisible by the number of devices ({num_devices}): the "
                        "batch is split evenly over the 'data' mesh axis")


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
