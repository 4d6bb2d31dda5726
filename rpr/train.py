"""Training and evaluation of an encoder-decoder Transformer: ``train_and_evaluate(config, workdir)``.

Data parallel with ``jax.jit`` and shardings: a 1-D mesh over every device
(axis ``"data"``), batches split on their first axis, parameters and optimizer
state replicated. The same code runs on one CPU, several GPUs or a TPU pod
slice (start every host with ``jax.distributed.initialize()`` first).

The workdir holds the run: ``config.json``, ``metrics.jsonl``, TensorBoard
events and ``checkpoints/``. Re-running with the same workdir resumes from
the latest checkpoint (parameters, optimizer state, step, rng); batches are
``task.train_batch(step)``, so the data position is restored with the step
and a resumed run is identical to a straight one. SIGTERM makes the loop save
a checkpoint after the current step and return. A non-finite loss, gradient
or parameter stops training with :class:`NonFiniteError` before that state
is saved, so the latest checkpoint stays the last good one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import threading
import time
from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rpr import checkpoint
from rpr import data
from rpr import metrics
from rpr import optim
from rpr import predict as predict_lib
from rpr import run_config
from rpr.model import ModelConfig, Transformer

Array = jax.Array


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss, gradient or parameter."""


@flax.struct.dataclass
class TrainState:
  step: Array  # int32 []: optimizer updates done
  params: Any
  opt_state: Any
  rng: Array  # uint32 [2]: dropout key; step s uses fold_in(rng, s)


# ----------------------------------------------------------------------------
# Mesh and batches.


def make_mesh(devices=None) -> Mesh:
  """1-D mesh named ``"data"`` over ``devices`` (default: every device of every process)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), ("data",))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, Array]:
  """Global host batch -> arrays split over the ``data`` axis.

  Every process holds the same global batch (``train_batch(step)`` is pure)
  and places only the rows of its own devices.
  """
  sharding = NamedSharding(mesh, P("data"))
  return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
          for k, v in batch.items()}


def pad_rows(batch: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Appends all-PAD rows so the batch size is a multiple of ``multiple``; they have weight 0 everywhere."""
  short = -len(batch["inputs"]) % multiple
  if not short:
    return batch
  return {k: np.pad(v, ((0, short),) + ((0, 0),) * (v.ndim - 1)) for k, v in batch.items()}


# ----------------------------------------------------------------------------
# Steps (pure functions; jitted with shardings in train_and_evaluate).


def init_state(rng: Array, model: Transformer, tx: optax.GradientTransformation, input_length: int,
               target_length: int) -> TrainState:
  init_rng, dropout_rng = jax.random.split(rng)
  eval_model = Transformer(model.config.replace(deterministic=True))
  params = eval_model.init(init_rng, jnp.ones((1, input_length), jnp.int32),
                           jnp.ones((1, target_length), jnp.int32))["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_rng)


def _all_finite(tree) -> Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def train_step(state: TrainState, batch: dict[str, Array], *, model: Transformer,
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


def eval_step(params, batch: dict[str, Array], *, model: Transformer, label_smoothing: float):
  """Sums over the batch's non-PAD target tokens: loss, correct tokens, tokens."""
  logits = model.apply({"params": params}, batch["inputs"], batch["targets"])
  loss_sum, weight_sum = metrics.cross_entropy(logits, batch["targets"], label_smoothing=label_smoothing)
  correct, _ = metrics.token_accuracy(logits, batch["targets"])
  return {"loss_sum": loss_sum, "weight_sum": weight_sum, "correct_sum": correct}


# ----------------------------------------------------------------------------
# Evaluation.


def decode_limits(inputs: np.ndarray, pad_id: int, extra: int, cap: int) -> np.ndarray:
  """Per row, the most tokens decoding may write: its input length (non-PAD tokens) + ``extra``, at most ``cap``.

  Tensor2tensor's rule (input length + 50). It reads only the inputs, so no
  hypothesis depends on its reference: not through the limit, not through
  the batch's padded width.
  """
  return np.minimum(np.sum(inputs != pad_id, axis=1) + extra, cap)


def evaluate(config, task, params, mesh: Mesh, eval_fn: Callable, predict_fn: Callable,
             max_decode_length: int) -> dict[str, float]:
  """Loss, token accuracy, exact match (decoded) and, for text tasks, BLEU on each of ``config.eval_splits``.

  BLEU scores the decoded hypotheses against ``task.references(split)``, the
  raw reference texts (decoded ``targets`` have been through the vocabulary's
  normalisation). With ``config.eval_by_length`` the exact match is also
  given per input length ``n`` (non-PAD input tokens) as
  ``<split>/exact_match_by_length/<n>``.
  """
  results = {}
  for split in config.eval_splits:
    sums = {"loss_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0}
    matches, lengths, hyps = [], [], []
    for i, batch in enumerate(task.eval_batches(split)):
      if config.max_eval_batches is not None and i >= config.max_eval_batches:
        break
      batch = pad_rows(batch, mesh.size)
      sharded = shard_batch(batch, mesh)
      for k, v in jax.device_get(eval_fn(params, sharded)).items():
        sums[k] += float(v)
      limits = decode_limits(batch["inputs"], task.vocab.pad_id, config.decode_extra_length, max_decode_length)
      # One compiled search per multiple of 16 tokens; each row is then cut at its own limit.
      length = int(min(max_decode_length, -(-limits.max() // 16) * 16))
      predictions = np.asarray(jax.device_get(predict_fn(params, sharded["inputs"], length)))
      predictions = np.where(np.arange(predictions.shape[1]) < limits[:, None], predictions, task.vocab.pad_id)
      match, valid = metrics.exact_match(predictions, batch["targets"])
      matches.append(match[valid])
      lengths.append(np.sum(batch["inputs"][valid] != task.vocab.pad_id, axis=1))
      if task.is_text:
        hyps += [task.vocab.decode(p) for p in predictions[valid]]
    tokens = max(sums["weight_sum"], 1.0)
    results[f"{split}/loss"] = sums["loss_sum"] / tokens
    results[f"{split}/accuracy"] = sums["correct_sum"] / tokens
    results[f"{split}/exact_match"] = float(np.mean(np.concatenate(matches))) if matches else 0.0
    if config.get("eval_by_length") and matches:
      by_length = metrics.mean_by_length(np.concatenate(matches), np.concatenate(lengths))
      results.update({f"{split}/exact_match_by_length/{n}": v for n, v in by_length.items()})
    if task.is_text:
      # Eval rows come in the order of the references, so a prefix of batches is a prefix of them.
      results[f"{split}/bleu"] = metrics.bleu(hyps, task.references(split)[:len(hyps)])
  return results


# ----------------------------------------------------------------------------
# The loop.


class _StopRequest:
  """Set by SIGTERM; the loop saves a checkpoint after the current step and returns."""

  def __init__(self):
    self.requested = False

  def __call__(self, signum, frame):
    logging.warning("Received signal %d: saving a checkpoint after this step, then stopping.", signum)
    self.requested = True


@contextlib.contextmanager
def _handle_sigterm(stop: _StopRequest):
  if threading.current_thread() is not threading.main_thread():  # signals go to the main thread only
    yield
    return
  previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}  # kill and Ctrl-C
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def _check_finite(step: int, m: dict, ckpt: checkpoint.Checkpoints) -> None:
  if bool(m["finite"]):
    return
  m = jax.device_get(m)
  loss = float(m["loss_sum"]) / max(float(m["weight_sum"]), 1.0)
  raise NonFiniteError(
      f"non-finite training state at step {step}: loss {loss}, gradient norm {float(m['grad_norm'])}, "
      f"learning rate {float(m['learning_rate'])}. Training stopped without saving this state; the latest "
      f"checkpoint (step {ckpt.latest_step()}) in {ckpt.manager.directory} is the last good one. Lower "
      "config.learning_rate, set config.grad_clip_norm or lengthen config.warmup_steps.")


def _summarise(history: list[dict]) -> dict[str, float]:
  h = jax.device_get(history)
  tokens = max(sum(float(m["weight_sum"]) for m in h), 1.0)
  return {
      "train/loss": sum(float(m["loss_sum"]) for m in h) / tokens,
      "train/accuracy": sum(float(m["correct_sum"]) for m in h) / tokens,
      "train/grad_norm": float(np.mean([float(m["grad_norm"]) for m in h])),
      "train/learning_rate": float(h[-1]["learning_rate"]),
  }


def _save_config(config, model_config: ModelConfig, workdir: str) -> None:
  if jax.process_index() != 0:
    return
  # XLA's CPU threading changes reduction orders, so a result reproduces bit for bit only with the same flags.
  record = {"config": json.loads(config.to_json_best_effort()), "model_config": model_config.to_dict(),
            "num_devices": jax.device_count(), "num_processes": jax.process_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax_version": jax.__version__}
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2, sort_keys=True)


def train_and_evaluate(config, workdir: str) -> dict[str, float]:
  """Trains ``config`` in ``workdir`` (resuming from its latest checkpoint) and returns the final metrics.

  The final dict holds ``step``, the last ``train/*`` summary and the last
  evaluation (``<split>/loss``, ``/accuracy``, ``/exact_match``, ``/bleu``);
  ``stopped_by_signal`` is 1.0 when SIGTERM ended the run before
  ``num_train_steps`` (no final evaluation then).
  """
  mesh = make_mesh()
  run_config.validate(config, num_devices=mesh.size, workdir=workdir)
  os.makedirs(workdir, exist_ok=True)

  task = data.get_task(config, workdir, num_devices=mesh.size)
  model_config = run_config.model_config(config, task.vocab.size)
  model = Transformer(model_config)
  eval_model = Transformer(model_config.replace(deterministic=True))
  tx, schedule = optim.make_optimizer(config, model_config.d_model)
  _save_config(config, model_config, workdir)
  from rpr import writers  # TensorBoard pulls in TensorFlow: import when a run starts

  writer = writers.create(workdir, jax.process_index())

  replicated, batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  first = task.train_batch(0)
  init_fn = functools.partial(init_state, model=model, tx=tx, input_length=first["inputs"].shape[1],
                              target_length=first["targets"].shape[1])
  rng = jax.random.PRNGKey(config.seed)
  ckpt = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), every=config.checkpoint_every_steps,
                                keep=config.keep_checkpoints)
  if ckpt.latest_step() is not None:
    abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
                                      jax.eval_shape(init_fn, rng))
    state = ckpt.restore(abstract)
    logging.info("Resumed from the checkpoint of step %d in %s.", int(state.step), workdir)
  else:
    state = jax.jit(init_fn, out_shardings=replicated)(rng)
    n = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    logging.info("Initialised %s parameters on %d device(s).", f"{n:,}", mesh.size)

  step_fn = jax.jit(
      functools.partial(train_step, model=model, tx=tx, schedule=schedule, label_smoothing=config.label_smoothing),
      in_shardings=(replicated, batch_sharding), out_shardings=(replicated, replicated), donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=eval_model, label_smoothing=config.label_smoothing),
                    in_shardings=(replicated, batch_sharding), out_shardings=replicated)
  predict_fn = predict_lib.make_predict_fn(config, model_config, batch_sharding, replicated)

  def run_eval(step: int) -> dict[str, float]:
    if not config.eval_splits:
      return {}
    t0 = time.time()
    results = evaluate(config, task, state.params, mesh, eval_fn, predict_fn, model_config.max_length)
    writer.write_scalars(step, results)
    logging.info("eval step %d (%.1fs): %s", step, time.time() - t0,
                 ", ".join(f"{k} {v:.4f}" for k, v in results.items()))
    return results

  stop = _StopRequest()
  final: dict[str, float] = {}
  num_steps, start = config.num_train_steps, int(state.step)
  history, previous = [], None
  t_log, step_log = time.time(), start
  try:
    with _handle_sigterm(stop):
      for step in range(start, num_steps):
        # PAD rows (weight 0) make a token-budget batch's row count divisible by the devices.
        state, m = step_fn(state, shard_batch(pad_rows(task.train_batch(step), mesh.size), mesh))
        if previous is not None:  # one step behind, so the host does not wait for the step just launched
          _check_finite(*previous, ckpt)
        previous = (step, m)
        history.append(m)
        done = step + 1
        log_due = done % config.log_every_steps == 0 or done == num_steps
        stopping = _stop_agreed(stop, ckpt, done, log_due)
        eval_due = done % config.eval_every_steps == 0 or done == num_steps
        save_due = ckpt.due(done) or done == num_steps or stopping
        if log_due or eval_due or save_due:
          _check_finite(step, m, ckpt)
        if log_due:
          summary = _summarise(history)
          now = time.time()
          rate = (done - step_log) / max(now - t_log, 1e-9)
          summary["train/steps_per_sec"] = rate
          writer.write_scalars(done, summary)
          final.update(summary)
          logging.info("step %d/%d: loss %.4f, accuracy %.4f, %.2f steps/s, ETA %s", done, num_steps,
                       summary["train/loss"], summary["train/accuracy"], rate,
                       _eta((num_steps - done) / max(rate, 1e-9)))
          history, t_log, step_log = [], now, done
        if save_due and ckpt.save(done, state, force=True):
          logging.info("Saved the checkpoint of step %d.", done)
        if stopping:
          logging.warning("Stopped by signal after step %d; its checkpoint is in %s. Run again with the same "
                          "workdir to resume.", done, workdir)
          final.update(step=float(done), stopped_by_signal=1.0)
          return final
        if eval_due:
          final.update(run_eval(done))
      if start >= num_steps:  # nothing left to train: evaluate the restored state
        final.update(run_eval(int(state.step)))
  finally:
    ckpt.close()  # waits for an asynchronous save in flight (also when stopping on an error)
    writer.close()
  final["step"] = float(state.step)
  return final


def _stop_agreed(stop: _StopRequest, ckpt: checkpoint.Checkpoints, step: int, log_due: bool) -> bool:
  """Whether every process stops after ``step``: a local SIGTERM, or on many hosts a shared decision.

  Hosts must save the same step, so with several processes a SIGTERM counts
  only at log steps, where the flags are all-gathered, or when JAX's
  preemption service (``jax.distributed``) reports a preemption.
  """
  if jax.process_count() == 1:
    return stop.requested
  if ckpt.manager.reached_preemption(step):
    return True
  if log_due:
    from jax.experimental import multihost_utils

    return bool(np.max(multihost_utils.process_allgather(np.int32(stop.requested))))
  return False


def _eta(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
