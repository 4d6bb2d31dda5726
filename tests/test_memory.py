"""A run's memory estimated before any work (rpr.memory): a lower bound of the parameters and activations, held to
the machine's memory; run.py refuses a run that cannot fit in one line before the workdir is made, unless
--skip_memory_check."""


import jax
import jax.numpy as jnp
import pytest
from absl import flags

from rpr import config as config_lib
from rpr import memory
from rpr import model
from tests.test_model import count, init_shapes
from tests.test_train import ROOT, tiny_config
from tests.test_workdir import one_error_line


@pytest.mark.parametrize("name", ["tiny", "base", "big"])
def test_the_parameter_estimate_is_a_close_lower_bound(name):
  c = model.preset(name)
  actual, estimate = count(init_shapes(c)), memory.parameters(c, c.vocab_size)
  assert 0.97 * actual <= estimate <= actual, (estimate, actual)  # only biases and layer norms left out
  lm = c.replace(num_encoder_layers=0)  # a LanguageModel: no cross-attention
  shapes = jax.eval_shape(lambda: model.build(lm).init(jax.random.PRNGKey(0), jnp.ones((1, 0), jnp.int32),
                                                       jnp.ones((1, 4), jnp.int32)))["params"]
  assert 0.97 * count(shapes) <= memory.parameters(lm, c.vocab_size) <= count(shapes)


def test_a_run_that_cannot_fit_is_refused_naming_the_estimate_and_what_to_lower():
  config = config_lib.parse(tiny_config())
  memory.check(config)  # the tiny run fits
  with pytest.raises(config_lib.ConfigError) as e:
    memory.check(config, available=memory.parameters(config.model, 0) * 16 - 1)
  assert "\n" not in str(e.value) and "21,632 parameters" in str(e.value) and "--skip_memory_check" in str(e.value)
  rows = config_lib.parse(tiny_config(batch_size=2 ** 20, max_length=512, long_max_length=513, eval_splits=(),
                                      model={"max_length": 1024}))
  assert memory.activations(rows) > 2 ** 40  # a million rows of 513 tokens with dense attention: terabytes
  with pytest.raises(config_lib.ConfigError, match=r"one training step's activations: [\d,.]+ GiB"):
    memory.check(rows, available=2 ** 40)


HUGE = ["--config=configs/tiny.py", "--config.model.d_model=65536", "--config.model.d_ff=262144"]


def test_run_py_refuses_a_model_no_machine_holds_before_the_workdir_is_made(tmp_path, run_py_here):
  workdir = tmp_path / "never"
  proc = run_py_here([*HUGE, f"--workdir={workdir}"])  # run.py in this process: its flag parser and main
  line = one_error_line(proc)
  assert "120,261,443,584 parameters" in line and "more than this machine's" in line, line
  assert not workdir.exists()


def test_skip_memory_check_lets_run_py_go_on(tmp_path, monkeypatch, run_module):
  started = []
  monkeypatch.setattr(run_module, "_start", lambda config, single: started.append(config.model.d_model))
  monkeypatch.setattr(memory, "machine_bytes", lambda: 1)  # a machine the tiny run does not fit
  argv = ["run.py", f"--config={ROOT / 'configs' / 'tiny.py'}", f"--workdir={tmp_path / 'run'}"]
  flags.FLAGS(argv)
  with pytest.raises(config_lib.ConfigError, match="more than this machine's 0.0 GiB"):
    run_module._run()
  assert not (tmp_path / "run").exists() and not started
  flags.FLAGS.unparse_flags()
  flags.FLAGS([*argv, "--skip_memory_check"])
  run_module._run()
  assert started == [32]
