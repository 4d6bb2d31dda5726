"""The training state and the pure step functions that ``rpr.train`` jits with shardings.

``train_step`` is one Adam update with dropout keyed by the step;
``eval_step`` returns the sums a split's loss, likelihood and accuracy are
made of, so that batches and devices add up exactly.
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from rpr import metrics
from rpr.model import build

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
