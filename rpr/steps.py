"""The training state, the pure step functions, and their jitted programs.

``train_step`` is one Adam update with dropout keyed by the step;
``eval_step`` returns the sums a split's loss, likelihood and accuracy are
made of, so that batches and devices add up exactly. :func:`programs` jits
them with shardings, beside :mod:`rpr.predict`'s decoders, once per
configuration in a process.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rpr import metrics
from rpr import optim
from rpr import predict as predict_lib
from rpr.model import build
from rpr.model_config import ModelConfig

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  step: Array  # int32 []: optimizer updates done
  params: Any
  opt_state: Any
  rng: Array  # uint32 [2]: dropout key; step s uses fold_in(rng, s)


def init_state(rng: Array, model, tx: optax.GradientTransformation, input_length: int,
               target_length: int) -> TrainState:
  init_rng, dropout_rng = jax.random.split(rng)
  eval_model = build(model.config.replace(deterministic=True))
  params = eval_model.init(init_rng, jnp.ones((1, input_length), jnp.int32),
                           jnp.ones((1, target_length), jnp.int32))["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_rng)


def _all_finite(tree) -> Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def train_step(state: TrainState, batch: dict[str, Array], *, model,
               tx: optax.GradientTransformation, schedule: Callable, label_smoothing: float):
  """One update on ``batch`` (``inputs [b, L_in]``, ``targets [b, L_out]``) -> ``(state, step metrics)``."""
  dropout_rng = jax.random.fold_in(state.rng, state.step)

  def loss_fn(params):
    logits = model.apply({"params": params}, batch["inputs"], batch["targets"], rngs={"dropout": dropout_rng})
    loss_sum, weight_sum = metrics.cross_entropy(logits, batch["targets"], label_smoothing=label_smoothing)
    return loss_sum / jnp.maximum(weight_sum, 1.0), (logits, loss_sum, weight_sum)

  (_, (logits, loss_sum, weight_sum)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  correct, _ = metrics.token_accuracy(logits, batch["targets"])
  grad_norm = optax.tree.norm(grads)
  step_metrics = {
      "loss_sum": loss_sum, "weight_sum": weight_sum, "correct_sum": correct, "grad_norm": grad_norm,
      "learning_rate": schedule(state.step),
      "finite": jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm) & _all_finite(params),
  }
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), step_metrics


def eval_step(params, batch: dict[str, Array], *, model, label_smoothing: float):
  """Sums over the batch's non-PAD target tokens: loss, negative log-likelihood, correct tokens, tokens."""
  logits = model.apply({"params": params}, batch["inputs"], batch["targets"])
  loss_sum, weight_sum = metrics.cross_entropy(logits, batch["targets"], label_smoothing=label_smoothing)
  nll_sum, _ = metrics.cross_entropy(logits, batch["targets"], label_smoothing=0.0)
  correct, _ = metrics.token_accuracy(logits, batch["targets"])
  return {"loss_sum": loss_sum, "nll_sum": nll_sum, "weight_sum": weight_sum, "correct_sum": correct}


@dataclasses.dataclass(frozen=True)
class Programs:
  """A run's jitted programs: the initial state, a training step, an evaluation step and the decoders."""
  init: Callable  # rng -> the initial TrainState, replicated (jax.eval_shape of it: what a restore fills)
  step: Callable  # (state, batch) -> (state, step metrics)
  eval: Callable  # (params, batch) -> sums (rpr.steps.eval_step)
  predict: Callable  # (params, inputs, decode length) -> tokens, for Eval.eval_splits
  final_predict: Callable  # the same for Eval.final_eval_splits


@functools.lru_cache(maxsize=4)
def programs(model_config: ModelConfig, eval_config: ModelConfig, optim_config, num_train_steps: int,
             lengths: tuple[int, int], decoding: tuple, mesh: Mesh) -> Programs:
  """The jitted programs of a model and its evaluation variant (no dropout), an optimizer and its schedule, the
  first batch's ``(input, target)`` lengths, ``decoding`` (``(decode_method, final_decode_method, beam_size,
  beam_alpha)``) and a mesh. These are everything the programs depend on, all hashable, so that a second run of
  the same configuration in one process (a test, a notebook, seeds in a loop) reuses them, traced and compiled,
  instead of tracing and compiling them again. The seed is not among them: it is the init program's argument."""
  model, eval_model = build(model_config), build(eval_config)
  tx, schedule = optim.make_optimizer(optim_config, model_config.d_model, num_train_steps)
  replicated, batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  init_fn = functools.partial(init_state, model=model, tx=tx, input_length=lengths[0], target_length=lengths[1])
  smoothing = optim_config.label_smoothing
  step_fn = jax.jit(functools.partial(train_step, model=model, tx=tx, schedule=schedule, label_smoothing=smoothing),
                    in_shardings=(replicated, batch_sharding), out_shardings=(replicated, replicated),
                    donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=eval_model, label_smoothing=smoothing),
                    in_shardings=(replicated, batch_sharding), out_shardings=replicated)
  # Decoders: one compiled search per decode length (a multiple of 16: rpr.evaluation), output replicated.
  method, final_method, beam_size, alpha = decoding
  decoder = lambda method: jax.jit(
      functools.partial(predict_lib.predict, model_config=model_config, method=method, beam_size=beam_size,
                        alpha=alpha),
      static_argnums=2, in_shardings=(replicated, batch_sharding), out_shardings=replicated)
  predict_fn = decoder(method)
  return Programs(jax.jit(init_fn, out_shardings=replicated), step_fn, eval_fn, predict_fn,
                  predict_fn if final_method == method else decoder(final_method))
