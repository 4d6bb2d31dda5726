"""Learning-rate schedules and the optimizer, chosen by name from the config.

Schedules map the optimizer's update count ``t = 0, 1, ...`` to a learning
rate; they use ``s = t + 1`` so the first update is not taken with rate 0.

* ``vaswani``: Vaswani et al. (2017), eq. 3:
  ``lr = learning_rate * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)``
  (the paper has ``learning_rate = 1``);
* ``rsqrt``: the same shape scaled so that ``learning_rate`` is the peak,
  reached at ``s = warmup``: ``lr = learning_rate * min(s / warmup, sqrt(warmup / s))``;
* ``constant``: ``learning_rate`` after a linear warm-up of ``warmup`` steps;
* ``cosine``: the same warm-up, then a cosine decay to 0 at ``config.num_train_steps``:
  ``lr = learning_rate * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2``.
  Short runs end sharper when the rate reaches 0.

``config.cooldown_fraction = f > 0`` ends any of them at 0: over the last
``f * total`` updates the rate is multiplied by a linear ramp from 1 to 0,
``min(1, (total - t) / (f * total))`` (a "cool-down", as in warmup-stable-decay
schedules). Before the cool-down starts the rate does not depend on
``total``, so runs of different budgets share their first ``(1 - f) * total``
updates.
"""

from __future__ import annotations

import math
from typing import Callable

import jax.numpy as jnp
import optax

SCHEDULES = ("vaswani", "rsqrt", "constant", "cosine")
OPTIMIZERS = ("adam", "adamw")


def vaswani(learning_rate: float, d_model: int, warmup_steps: int) -> optax.Schedule:
  def schedule(count):
    s = jnp.asarray(count, jnp.float32) + 1.0
    return learning_rate * d_model ** -0.5 * jnp.minimum(s ** -0.5, s * warmup_steps ** -1.5)
  return schedule


def rsqrt(learning_rate: float, warmup_steps: int) -> optax.Schedule:
  def schedule(count):
    s = jnp.asarray(count, jnp.float32) + 1.0
    return learning_rate * jnp.minimum(s / warmup_steps, jnp.sqrt(warmup_steps / s))
  return schedule


def constant(learning_rate: float, warmup_steps: int) -> optax.Schedule:
  def schedule(count):
    s = jnp.asarray(count, jnp.float32) + 1.0
    return learning_rate * jnp.minimum(1.0, s / max(warmup_steps, 1))
  return schedule


def cosine(learning_rate: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  def schedule(count):
    s = jnp.asarray(count, jnp.float32) + 1.0
    warm = s / max(warmup_steps, 1)
    progress = jnp.clip((s - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0, 1.0)
    return learning_rate * jnp.where(s < warmup_steps, warm, 0.5 * (1.0 + jnp.cos(jnp.pi * progress)))
  return schedule


def cooldown(schedule: optax.Schedule, fraction: float, total_steps: int) -> optax.Schedule:
  """``schedule`` times a linear ramp from 1 to 0 over the last ``fraction`` of ``total_steps`` updates."""
  length = fraction * total_steps

  def cooled(count):
    t = jnp.asarray(count, jnp.float32)
    return schedule(count) * jnp.clip((total_steps - t) / length, 0.0, 1.0)
  return cooled


def make_schedule(config, d_model: int, num_train_steps: int) -> optax.Schedule:
  """The schedule named ``config.schedule`` (the run's :class:`rpr.config.Optim`), with ``config.cooldown_fraction``'s
  cool-down (module docstring) ending at ``num_train_steps``."""
  base = _base_schedule(config, d_model, num_train_steps)
  fraction = config.cooldown_fraction
  return cooldown(base, fraction, num_train_steps) if fraction > 0 else base


def _base_schedule(config, d_model: int, num_train_steps: int) -> optax.Schedule:
  name, lr, warmup = config.schedule, config.learning_rate, config.warmup_steps
  if name == "vaswani":
    return vaswani(lr, d_model, warmup)
  if name == "rsqrt":
    return rsqrt(lr, warmup)
  if name == "constant":
    return constant(lr, warmup)
  if name == "cosine":
    return cosine(lr, warmup, num_train_steps)
  raise ValueError(f"config.schedule: unknown schedule {name!r}; allowed: {list(SCHEDULES)}")


def make_optimizer(config, d_model: int, num_train_steps: int) -> tuple[optax.GradientTransformation, Callable]:
  """``(optimizer, schedule)`` of the run's :class:`rpr.config.Optim` ``config``: Adam(W) with ``config.adam_*``,
  optionally after global-norm clipping; the schedule ends at ``num_train_steps`` (cosine, cool-down)."""
  schedule = make_schedule(config, d_model, num_train_steps)
  kw = dict(b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)
  if config.optimizer == "adam":
    opt = optax.adam(schedule, **kw)
  elif config.optimizer == "adamw":
    opt = optax.adamw(schedule, weight_decay=config.weight_decay, **kw)
  else:
    raise ValueError(f"config.optimizer: unknown optimizer {config.optimizer!r}; allowed: {list(OPTIMIZERS)}")
  clip = config.grad_clip_norm
  if clip is not None and not math.isinf(clip):
    opt = optax.chain(optax.clip_by_global_norm(clip), opt)
  return opt, schedule
