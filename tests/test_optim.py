"""rpr.optim: the schedules' formulas, the optimizer chain."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rpr import config as rpr_config
from rpr import optim


def _args(d_model, **kw):
  optim_section, steps = _config(**kw)
  return optim_section, d_model, steps


def _config(num_train_steps=2000, **kw):
  """The Optim section with ``kw`` (Vaswani's schedule by default), and the steps its schedule ends at."""
  return rpr_config.Optim(**dict(dict(schedule="vaswani", learning_rate=1.0, warmup_steps=4000), **kw)), num_train_steps


def test_vaswani_schedule_is_equation_3():
  s = optim.make_schedule(*_args(512))
  for count in (0, 99, 3999, 4000, 99999):
    step = count + 1
    expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
    np.testing.assert_allclose(float(s(count)), expected, rtol=1e-5)


def test_rsqrt_peaks_at_learning_rate_and_constant_warms_up():
  s = optim.make_schedule(*_args(512, schedule="rsqrt", learning_rate=2e-3, warmup_steps=100))
  np.testing.assert_allclose(float(s(99)), 2e-3, rtol=1e-6)
  np.testing.assert_allclose(float(s(399)), 2e-3 * math.sqrt(100 / 400), rtol=1e-6)
  assert float(s(49)) == pytest.approx(1e-3)
  c = optim.make_schedule(*_args(8, schedule="constant", learning_rate=0.5, warmup_steps=10))
  assert [float(c(i)) for i in (0, 4, 9, 1000)] == pytest.approx([0.05, 0.25, 0.5, 0.5])


@pytest.mark.parametrize("name", optim.SCHEDULES)
def test_a_cooldown_ramps_every_schedule_linearly_to_zero_and_leaves_the_steps_before_it_alone(name):
  kw = dict(schedule=name, learning_rate=1e-2, warmup_steps=10, num_train_steps=1000)
  plain = optim.make_schedule(*_args(8, **kw))
  cooled = optim.make_schedule(*_args(8, **kw, cooldown_fraction=0.2))
  longer = optim.make_schedule(*_args(8, **dict(kw, num_train_steps=5000), cooldown_fraction=0.2))
  for count in (0, 9, 500, 800):  # before the last 200 updates: the schedule itself
    assert float(cooled(count)) == float(plain(count))
    if name != "cosine":  # and, but for the cosine's own end, that of a longer budget
      assert float(cooled(count)) == float(longer(count))
  for count in (850, 900, 999):
    np.testing.assert_allclose(float(cooled(count)), float(plain(count)) * (1000 - count) / 200, rtol=1e-6)
  assert float(cooled(1000)) == 0.0


def test_cosine_warms_up_then_decays_to_zero_at_the_last_step():
  s = optim.make_schedule(*_args(8, schedule="cosine", learning_rate=1e-2, warmup_steps=10, num_train_steps=110))
  assert [float(s(i)) for i in (0, 4, 9)] == pytest.approx([1e-3, 5e-3, 1e-2])
  assert float(s(59)) == pytest.approx(5e-3)  # s = 60: half-way through the decay
  assert float(s(109)) == pytest.approx(0.0, abs=1e-9) and float(s(500)) == pytest.approx(0.0, abs=1e-9)
  assert all(float(s(i)) >= float(s(i + 1)) for i in range(9, 109))


def test_clipping_bounds_the_first_adam_input():
  params = {"w": jnp.zeros(3)}
  grads = {"w": jnp.array([30.0, 40.0, 0.0])}  # norm 50
  tx, _ = optim.make_optimizer(*_args(8, grad_clip_norm=1.0, schedule="constant", warmup_steps=1))
  state = tx.init(params)
  _, state = tx.update(grads, state, params)
  # The Adam first moment saw the clipped gradient: (1 - b1) * g / 50.
  mu = state[1][0].mu["w"]
  np.testing.assert_allclose(np.asarray(mu), 0.1 * np.array([0.6, 0.8, 0.0]), rtol=1e-6)


def test_unknown_names_fail_with_the_allowed_ones():
  with pytest.raises(ValueError, match=r"config.schedule.*allowed.*vaswani"):
    optim.make_schedule(*_args(8, schedule="cyclic"))
  with pytest.raises(ValueError, match=r"config.optimizer.*allowed.*adam"):
    optim.make_optimizer(*_args(8, optimizer="sgd"))
