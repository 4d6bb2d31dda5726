"""Every bad value fails in rpr.config.parse, naming the key, the value and what is allowed, before any writing."""

import importlib
import math
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from rpr import config as rpr_config
from rpr import data
from rpr import optim, train
from tests.test_properties import config_with
from tests.test_train import ROOT, tiny_config
from tests.test_train import ConfigError, parse, validate, train_run

# configs/tiny.py: copy, strings of 1-6 digits, the long split 7-8, model.max_length 64.
BAD = [
    (dict(long_max_length=6), r"config.long_max_length = 6 is not allowed; allowed: an int >= 7 \(max_length \+ 1"),
    (dict(num_eval_examples=0), r"config.num_eval_examples = 0 is not allowed; allowed: an int >= 1"),
    (dict(learning_rate=math.inf), r"config.learning_rate = inf is not allowed; allowed: a number > 0.0 and finite"),
    (dict(adam_eps=0.0), r"config.adam_eps = 0.0 is not allowed; allowed: a number > 0.0 and finite"),
    (dict(adam_eps=math.inf), r"config.adam_eps = inf is not allowed"),
    (dict(model={"max_length": 8}),
     r"config.model.max_length = 8 is not allowed; allowed: an int >= 9 \(the longest target: long_max_length 8"),
    (dict(eval_splits=("valid",), model={"max_length": 6}),
     r"config.model.max_length = 6 .*an int >= 7 \(the longest target: max_length 6 \+ EOS\)"),
    (dict(min_length=0), r"config.min_length = 0 is not allowed; allowed: an int >= 1"),
    (dict(min_length=7), r"config.max_length = 6 is not allowed; allowed: an int >= 7 \(min_length\)"),
    (dict(weight_decay=math.inf), r"config.weight_decay = inf is not allowed"),
    (dict(cooldown_fraction=1.5), r"config.cooldown_fraction = 1.5 is not allowed; allowed: a number >= 0.0 and <= 1"),
    # Huge values (issue 71): refused in one line before any allocation or any directory.
    (dict(batch_size=10 ** 9), r"config.batch_size = 1000000000 is not allowed; allowed: an int >= 1 and <= 1048576"),
    (dict(eval_batch_size=10 ** 9), r"config.eval_batch_size = 1000000000 is not allowed; .* <= 1048576"),
    (dict(num_eval_examples=10 ** 9), r"config.num_eval_examples = 1000000000 is not allowed; .* <= 10000000"),
    (dict(seed=18446744073709551617), r"config.seed = 18446744073709551617 is not allowed; allowed: an int >= 0 "
                                      r"and <= 4294967295"),
    (dict(seed=2 ** 32), r"config.seed = 4294967296 is not allowed"),
    (dict(model={"shaw": {"max_distance": 99999999999999999999}}),
     r"config.model.shaw: shaw option max_distance = 99999999999999999999 is not allowed; allowed: an int >= 0 and "
     r"<= 65536"),
    (dict(model={"shaw": {"max_distance": 10 ** 9}}), r"max_distance = 1000000000 is not allowed"),
    (dict(model={"d_model": 10 ** 9}), r"config.model.d_model = 1000000000 is not allowed; .* <= 65536"),
    (dict(model={"d_ff": 10 ** 9}), r"config.model.d_ff = 1000000000 is not allowed"),
    (dict(model={"num_encoder_layers": 10 ** 6}), r"config.model.num_encoder_layers = 1000000 is not allowed"),
    (dict(model={"max_length": 10 ** 9}), r"config.model.max_length = 1000000000 is not allowed; .* <= 1048576"),
    (dict(num_train_steps=10 ** 12), r"config.num_train_steps = 1000000000000 is not allowed"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[repr(o) for o, _ in BAD])
def test_bad_value_raises_config_error_naming_it_before_any_file_is_written(tmp_path, overrides, message):
  with pytest.raises(ConfigError, match=message):
    validate(tiny_config(**dict(overrides)), num_devices=1)
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=message):
    train_run(tiny_config(**dict(overrides)), str(workdir))
  assert not workdir.exists()


def test_checks_that_do_not_apply_pass():
  # long_max_length bounds the long split only: refused with it, accepted without it.
  with pytest.raises(ConfigError, match="long_max_length = 6"):
    validate(tiny_config(long_max_length=6), num_devices=1)
  validate(tiny_config(eval_splits=("valid",), long_max_length=6), num_devices=1)
  # grad_clip_norm = inf is accepted and means no clipping: a huge gradient moves Adam exactly as unclipped.
  config = tiny_config(grad_clip_norm=math.inf, schedule="constant", warmup_steps=1)
  validate(config, num_devices=1)
  # Adam's first step is sign(g) lr where |g| >> eps: clipping to 1 brings the small entry near eps.
  params, grads = {"w": jnp.zeros(2)}, {"w": jnp.array([1e6, 1e-3])}
  moved = {}
  for clip in (math.inf, None, 1.0):
    config.grad_clip_norm = clip
    opt, _ = optim.make_optimizer(parse(config).optim, 8, config.num_train_steps)
    moved[clip] = opt.update(grads, opt.init(params), params)[0]["w"]
  np.testing.assert_array_equal(moved[math.inf], moved[None])
  assert not np.allclose(moved[1.0], moved[None])  # the comparison can fail: a finite clip changes the step


def test_run_py_names_a_missing_key_of_a_sub_config_in_one_line_with_exit_status_2(tmp_path, run_py_here):
  # run.py's other one-line errors: test_properties.py (a bad value, a missing top-level key) and test_train.py
  # (a bad literal, a variant word, a workdir); the messages of every key's bad values: validate, above. run.py in
  # this process (conftest.py's run_py_here): test_properties.py's missing key is a run.py process's.
  workdir = tmp_path / "run"
  proc = run_py_here(["--config=configs/tiny.py", f"--workdir={workdir}", "--config.model.shaw.k=1"])
  lines = [l for l in proc.stderr.splitlines() if l.startswith("run.py: error:")]
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert re.search(r"--config.model.shaw.k: the config has no key 'k'", lines[0]), lines[0]
  assert "Traceback" not in proc.stderr and not workdir.exists()


def test_an_xla_flags_value_that_xla_would_cut_short_fails_before_any_work(tmp_path, monkeypatch, run_py_here):
  # The often-copied single-thread recipe with the device count after it: XLA reads no flag past the bare word.
  # run.py in this process (conftest.py's run_py_here), which reads XLA_FLAGS as a run.py process would.
  flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1 --xla_force_host_platform_device_count=2"
  workdir = tmp_path / "run"
  monkeypatch.setenv("XLA_FLAGS", flags)
  proc = run_py_here(["--config=configs/tiny.py", f"--workdir={workdir}"])
  lines = [l for l in proc.stderr.splitlines() if l.startswith("run.py: error:")]
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].endswith("XLA_FLAGS: XLA stops reading at 'intra_op_parallelism_threads=1' (no leading '--') and "
                           "would ignore --xla_force_host_platform_device_count=2; allowed: '--' flags, with any "
                           "other word last"), lines[0]
  assert not workdir.exists()


@pytest.mark.parametrize("value", ["", "--a=1 --b=2", "--a=1 bare other",
                                   "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"])
def test_xla_flags_that_xla_reads_whole_pass(value):
  rpr_config.check_xla_flags(value)  # a bare word last drops nothing


def test_every_flag_xla_would_ignore_is_named():
  with pytest.raises(ConfigError, match=r"stops reading at 'x=1' .* would ignore --b=2 --c; allowed"):
    rpr_config.check_xla_flags("--a=1 x=1 --b=2 y --c")


TYPED_BAD = [
    ("eval_by_length", 1, r"config.eval_by_length = 1 is not allowed; allowed: True or False$"),
    ("eval_by_length", 0.0, r"config.eval_by_length = 0.0 is not allowed; allowed: True or False$"),
    ("dataset", ["copy"], r"config.dataset: unknown data set \['copy'\]; allowed: \[.*'copy'"),
    ("optimizer", ["adam"], r"config.optimizer = \['adam'\] is not allowed; allowed: \['adam', 'adamw'\]"),
    ("model.position", ["shaw"], r"config.model.position = \['shaw'\] is not allowed; allowed: \[.*'shaw'"),
    ("model", 5, r"config.model = 5 is not allowed; allowed: a dict of rpr.model_config.ModelConfig's fields"),
    ("model.shaw", 5, r"config.model.shaw = 5 is not allowed; allowed: a dict of shaw's options \['add_sinusoidal', "
                      r"'max_distance'"),
    ("learning_rate", 10 ** 400, r"config.learning_rate = 10{400} is not allowed; allowed: a number > 0.0 and finite"),
    # The options of every scheme are checked, whichever the model uses (tiny: shaw).
    ("model.t5.num_buckets", 0, r"config.model.t5: t5 option num_buckets = 0 is not allowed; allowed: an int >= 2"),
    ("model.rope.rope_base", math.inf, r"config.model.rope: rope option rope_base = inf is not allowed; allowed: a "
                                       r"finite number > 1"),
    ("model.rope.rope_base", 10 ** 400, r"config.model.rope: rope option rope_base = 10{400} is not allowed"),
]


@pytest.mark.parametrize("path, value, message", TYPED_BAD, ids=[f"{p}={v!r:.10}" for p, v, _ in TYPED_BAD])
def test_a_value_of_the_wrong_type_or_beyond_the_floats_names_the_key(path, value, message):
  with pytest.raises(ConfigError, match=message):
    validate(config_with(path, value), num_devices=1)


def test_an_unknown_top_level_key_fails_naming_it():
  config = tiny_config()
  with config.unlocked():
    config.lerning_rate = 0.1
    config.foo = 1
  with pytest.raises(ConfigError, match=r"unknown config key\(s\) config.foo, config.lerning_rate; "
                     r"allowed: .*\['adam_b1', .*'corpus_dir', .*'learning_rate', .*'tokens_per_device'"):
    validate(config, num_devices=1)


def test_the_allowed_keys_are_base_py_s_and_those_the_data_sets_read():
  copy_keys = data.REGISTRY["copy"].keys
  assert set(base.get_config()) == set(rpr_config.ENGINE_KEYS) | set(copy_keys)
  assert not set(rpr_config.ENGINE_KEYS) & set(copy_keys)
  from rpr.data import wmt  # TFDS
  # The light registry lists wmt's keys (importing rpr.data.wmt imports TFDS): WmtTask's own, and two of its own.
  extra = {"tokens_per_device", "cache_dir"}
  assert set(data.REGISTRY["wmt14"].keys) - extra == set(wmt.CONFIG_KEYS) - set(rpr_config.ENGINE_KEYS)


# Every config file with the variants its docstring documents; a new file must be added here.
VARIANTS = {
    "base": [None],
    "default": ["", "sinusoidal"],
    "tiny": [""],
    "length": ["", "tiny", "pe=rope", "pe=t5,tiny", "pe=alibi,directional=1", "pe=shaw,k=4"],
    "arithmetic": ["", "quick", "pe=shaw,k=16", "pe=alibi,directional=1", "pe=learned", "config=n1000_addsub,seed=2"],
    "lm": ["", "tiny", "pe=rope,ctx=64", "pe=t5", "pe=learned", "seed=1"],
    "translation": ["", "tiny", "pe=rope", "short=30,seed=1", "pe=t5,tiny", "pe=sinusoidal"],
    "wmt14_ende": ["", "tiny", "model=big", "pe=absolute", "tiny,pe=absolute,model=big",
                   "table1,model=big,pe=relative", "table2,k=0", "table3,av=off,ak=on"],
}


def test_every_config_file_and_variant_validates():
  files = sorted(p[:-3] for p in os.listdir(os.path.join(ROOT, "configs"))
                 if p.endswith(".py") and p not in ("__init__.py", "sweeps.py"))  # sweeps.py: no config, sweeps' parts
  assert files == sorted(VARIANTS)
  for name, variants in VARIANTS.items():
    module = importlib.import_module(f"configs.{name}")
    for variant in variants:
      config = module.get_config() if variant is None else module.get_config(variant)
      validate(config, num_devices=1)


def test_a_huge_vocabulary_is_refused_naming_the_data_set_key():
  from configs import lm

  with pytest.raises(ConfigError, match=r"config.vocab_size = 1000000000 is not allowed; allowed: an int >= 3 and "
                     r"<= 1048576 or None \(None: the data set's default\)"):
    config = lm.get_config("tiny")
    config.vocab_size = 10 ** 9
    validate(config)


def test_each_data_set_reads_its_own_typed_section():
  from configs import lm, translation
  from rpr.data import sections

  assert {n: e.section for n, e in data.REGISTRY.items()} == {
      "copy": sections.Synthetic, "reverse": sections.Synthetic, "arithmetic": sections.Arithmetic,
      "wmt14": sections.Wmt14, "bible_fr_en": sections.Bible, "sotu": sections.Sotu}
  bible = parse(translation.get_config()).data
  assert isinstance(bible.own, sections.Bible) and bible.max_length == 160 and bible.get("tokens_per_batch") == 1024
  assert bible.get("min_length") is None  # copy's key, set aside for this data set
  sotu = parse(lm.get_config()).data
  assert sotu.lm_context_length == 256 and sotu.batch_size == 8
  with pytest.raises(ConfigError, match=r"config.batch_size = None is not allowed; allowed: an int >= 1 \(data set "
                     r"'copy' batches rows\)"):
    validate(tiny_config(batch_size=None))


def test_validation_runs_once_per_run(tmp_path, monkeypatch, caplog):
  # run.py's and the sweep runner's parse, then train_and_evaluate: the tree is checked once, the model with it,
  # and so a note of the model's validation is said once a run (here k = 64 = model.max_length clips nothing).
  import logging

  from rpr import model as model_lib
  from tests.test_model_config import notes
  from tests.test_train import FAST

  calls = {"run": 0, "model": 0}
  run_validate, model_validate = rpr_config.validate, model_lib.ModelConfig.validate

  def counted(name, fn):
    def wrapper(*args, **kwargs):
      calls[name] += 1
      return fn(*args, **kwargs)
    return wrapper

  monkeypatch.setattr(rpr_config, "validate", counted("run", run_validate))
  monkeypatch.setattr(model_lib.ModelConfig, "validate", counted("model", model_validate))
  config = tiny_config(**dict(FAST, num_train_steps=2, model={**FAST["model"], "shaw": {"max_distance": 64}}))
  with caplog.at_level(logging.INFO, logger="absl"):  # absl's level, whatever a test before set it to
    out = train_run(config, str(tmp_path))
  assert out["step"] == 2 and calls == {"run": 1, "model": 1}
  said = notes(caplog)
  assert len(said) == 1 and "max_distance = 64" in said[0] and "acts as 63 (max_length - 1)" in said[0], said


def test_the_model_s_note_waits_for_the_whole_tree_so_that_an_error_is_the_only_line(caplog):
  import logging

  from tests.test_model_config import notes

  far = {"shaw": {"max_distance": 64}}  # k = 64 = model.max_length: a note once the tree is valid
  with caplog.at_level(logging.INFO, logger="absl"):  # absl's level, whatever a test before set it to
    with pytest.raises(ConfigError, match=r"config.average_last = 5 is not allowed"):
      validate(tiny_config(model=far, average_last=5))  # a rule between sections, checked after the model's
    assert notes(caplog) == []
    validate(tiny_config(model=far))
  assert len(notes(caplog)) == 1
