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
import dataclasses
import functools
import json
import os
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rpr import checkpoint
from rpr import data
from rpr import failures
from rpr import optim
from rpr import plateau
from rpr import provenance
from rpr import predict as predict_lib
from rpr import records
from rpr import run_config
from rpr import stop
from rpr import writers
from rpr.evaluation import decode_limits, evaluate  # noqa: F401 (re-exported)
from rpr.model import ModelConfig, build
from rpr.sharding import host_batch, make_mesh, pad_rows, shard_batch  # noqa: F401 (re-exported)
from rpr.steps import TrainState, eval_step, init_state, train_step  # noqa: F401 (re-exported)

Array = jax.Array


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss, gradient or parameter."""


# ----------------------------------------------------------------------------
# The loop.


def _check_finite(step: int, m: dict, ckpt: checkpoint.Checkpoints) -> None:
  if bool(m["finite"]):
    return
  m = jax.device_get(m)
  loss = float(m["loss_sum"]) / max(float(m["weight_sum"]), 1.0)
  raise NonFiniteError(
      f"non-finite training state at step {step}: loss {loss}, gradient norm {float(m['grad_norm'])}, "
      f"learning rate {float(m['learning_rate'])}. Training stopped without saving this state; "
      + (f"the latest checkpoint (step {latest}) in {ckpt.directory} is the last good one"
         if (latest := ckpt.latest_step()) is not None else "no checkpoint was saved before it")
      + ". Lower config.learning_rate, set config.grad_clip_norm or lengthen config.warmup_steps.")


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
  from rpr import workdir as workdir_lib

  workdir_lib.write_record(workdir, {"config": json.loads(config.to_json_best_effort()),
                                     "model_config": model_config.to_dict(), **provenance.environment()})


@dataclasses.dataclass
class _Run:
  """What the loop needs, built before step 1: the task, the model, the restored state, the compiled steps."""
  config: Any
  workdir: str
  mesh: Mesh
  task: Any
  model_config: ModelConfig
  state: TrainState
  ckpt: checkpoint.Checkpoints
  step_fn: Callable
  eval_fn: Callable
  predict_fn: Callable  # decodes eval_splits
  final_predict_fn: Callable  # decodes final_eval_splits (config.final_decode_method)
  abstract_state: Any  # TrainState of jax.ShapeDtypeStructs with their shardings (restores)
  records: list  # metrics.jsonl up to the restored step, then what this run writes (process 0; [] elsewhere)


def _prepare(config, workdir: str, allow_config_change=(), restore_unverified: bool = False,
             trust_checkpoints: bool = False) -> _Run:
  """Validates, builds the task and model, restores the newest checkpoint that restores (or initialises)."""
  mesh = make_mesh()
  run_config.validate(config, num_devices=mesh.size, workdir=workdir, allow_changes=allow_config_change,
                      trust_checkpoints=trust_checkpoints)
  from rpr import workdir as workdir_lib

  workdir_lib.refuse_finished_without_checkpoint(workdir, config.num_train_steps)
  task = data.get_task_once(config, workdir, mesh.size)
  model_config = run_config.model_config(config, task.vocab.size)
  if (model_config.num_encoder_layers == 0) != getattr(task, "is_lm", False):
    raise run_config.ConfigError(
        f"config.model.num_encoder_layers = {model_config.num_encoder_layers} does not fit data set "
        f"{config.dataset!r}: a decoder-only model (0 encoder layers) needs a language-model data set and "
        "an encoder-decoder model (>= 1) a data set with inputs")
  os.makedirs(workdir, exist_ok=True)
  model, eval_model = build(model_config), build(model_config.replace(deterministic=True))
  tx, schedule = optim.make_optimizer(config, model_config.d_model)
  replicated, batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  first = task.train_batch(0, slice(0, 1))  # its lengths
  init_fn = functools.partial(init_state, model=model, tx=tx, input_length=first["inputs"].shape[1],
                              target_length=first["targets"].shape[1])
  rng = jax.random.PRNGKey(config.seed)
  ckpt = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), every=config.checkpoint_every_steps,
                                keep=config.keep_checkpoints, allow_unverified=restore_unverified)
  abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
                                    jax.eval_shape(init_fn, rng))
  if ckpt.latest_step() is not None:
    state = ckpt.restore(abstract)  # the newest that restores; CheckpointError if none does
    logging.info("Resumed from the checkpoint of step %d in %s.", int(state.step), workdir)
  else:
    state = jax.jit(init_fn, out_shardings=replicated)(rng)
    n = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    logging.info("Initialised %s parameters on %d device(s).", f"{n:,}", mesh.size)
  _save_config(config, model_config, workdir)  # after the restore: a workdir that does not restore stays as it was
  step_fn = jax.jit(
      functools.partial(train_step, model=model, tx=tx, schedule=schedule, label_smoothing=config.label_smoothing),
      in_shardings=(replicated, batch_sharding), out_shardings=(replicated, replicated), donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, model=eval_model, label_smoothing=config.label_smoothing),
                    in_shardings=(replicated, batch_sharding), out_shardings=replicated)
  predict_fn = predict_lib.make_predict_fn(config, model_config, batch_sharding, replicated)
  final_method = config.get("final_decode_method") or config.decode_method
  final_predict_fn = (predict_fn if final_method == config.decode_method else
                      predict_lib.make_predict_fn(config, model_config, batch_sharding, replicated,
                                                  method=final_method))
  kept, metrics = [], os.path.join(workdir, "metrics.jsonl")
  if jax.process_index() == 0:
    aside = records.set_aside(metrics) if int(state.step) == 0 else None  # none to resume: kept, not rewound
    if aside:
      logging.warning("No checkpoint to resume from: training starts at step 0, and the records of the run "
                      "before are kept in %s.", aside)
    kept, dropped = records.rewind_jsonl(metrics, int(state.step))
    if dropped:
      logging.info("Dropped %d record(s) past step %d from metrics.jsonl: they are trained again.", dropped,
                   int(state.step))
  return _Run(config, workdir, mesh, task, model_config, state, ckpt, step_fn, eval_fn, predict_fn,
              final_predict_fn, abstract, kept)


def train_and_evaluate(config, workdir: str, allow_config_change=(), restore_unverified: bool = False,
                       trust_checkpoints: bool = False) -> dict[str, float]:
  """Trains ``config`` in ``workdir`` (resuming from its latest checkpoint) and returns the final metrics.

  The run holds the workdir's lock (:mod:`rpr.workdir`) throughout.
  Resuming refuses config changes outside ``run_config.RESUME_SAFE_KEYS``
  and ``allow_config_change``, and checkpoints without a ``config.json``
  unless ``trust_checkpoints``; ``restore_unverified`` lets a checkpoint
  without complete checksums restore.

  The final dict holds ``step``, the last ``train/*`` summary and the last
  evaluation (``<split>/loss``, ``/accuracy``, ``/exact_match``, ``/bleu``,
  ``/chrf``; ``/perplexity`` for a language model); ``stopped_by_signal`` is
  1.0 when SIGTERM ended the run before ``num_train_steps`` (no final
  evaluation then).
  """
  from rpr import workdir as workdir_lib

  run_config.validate(config, num_devices=jax.device_count())  # a bad config fails before the workdir is made
  t0, environment = time.time(), provenance.environment()
  with stop.handle_signals(), (workdir_lib.lock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()):
    run = _prepare(config, workdir, allow_config_change, restore_unverified, trust_checkpoints)
    first = int(run.state.step)
    # This process's span, committed with the records (processes.jsonl): after each save, and at its end,
    # up to the newest step it saved or recorded (a stop by signal saves a step that may have no record).
    reached = [first]
    span = lambda last, running: (workdir_lib.record_process(workdir, t0, (first, last), running, environment)
                                  if jax.process_index() == 0 else None)
    on_save = lambda step: (reached.append(step), span(step, True))
    writer = writers.create(workdir, jax.process_index(), config.get("tensorboard", True))
    # The run's hyper-parameters for TensorBoard's HParams dashboard, beside the metrics it writes.
    writer.write_hparams(writers.hparams(config.to_dict()))
    try:
      return _loop(run, writer, on_save=on_save)
    finally:  # each step runs (the save in flight waited for); the first error is the one raised (rpr/failures.py)
      last = lambda: max(reached + [r["step"] for r in run.records])
      failures.clean_up(run.ckpt.close, writer.close, lambda: span(last(), False),
                        lambda: jax.process_index() == 0 and workdir_lib.set_aside_unresumable(workdir))


def _write(run: _Run, writer, step: int, scalars: dict) -> None:
  writer.write_scalars(step, scalars)
  run.records.append({"step": step, **scalars})


def _evaluate_and_write(run: _Run, writer, step: int, final: bool) -> dict[str, float]:
  """Evaluates ``eval_splits``, and at the last step ``final_eval_splits`` too; writes and logs the metrics.

  The final splits are decoded with ``config.final_decode_method``. With a
  plateau rule (:mod:`rpr.plateau`), an evaluation before the last step also
  writes ``plateau/gain``; when the rule holds, the run saves its checkpoint,
  evaluates the final splits and writes ``plateau/reached``: the last step.
  """
  config, rule = run.config, plateau.Rule.from_config(run.config)
  t0 = time.time()
  results = _evaluate(run, config.eval_splits, run.predict_fn, run.state.params)
  reached = False
  if rule is not None and not final:
    curve = plateau.curve(run.records, rule.metric) + [(step, results[rule.metric])]
    if (gain := rule.gain(curve, step)) is not None:
      results["plateau/gain"] = gain
    reached = _agreed(rule.reached(curve, step))
  if final:
    results.update(_evaluate(run, config.get("final_eval_splits", ()), run.final_predict_fn, run.state.params))
    results.update(_averaged(run, step, config.eval_splits))
  if results:
    _write(run, writer, step, results)
    logging.info("eval step %d (%.1fs): %s", step, time.time() - t0,
                 ", ".join(f"{k} {v:.4f}" for k, v in results.items()))
  if reached:
    results.update(_finish_at_plateau(run, writer, step))
  return results


def _agreed(flag: bool) -> bool:
  """Process 0's ``flag`` on every process (only process 0 holds the metrics history)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils

  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def _finish_at_plateau(run: _Run, writer, step: int) -> dict[str, float]:
  """The plateau rule held at ``step``: saves it, evaluates the final splits, writes ``plateau/reached``."""
  if run.ckpt.latest_step() != step:
    run.ckpt.save(step, run.state, force=True)
  run.ckpt.wait()
  logging.info("Plateau reached at step %d (config.plateau_metric %s): the final evaluation.", step,
               run.config.plateau_metric)
  t0 = time.time()
  results = {**_evaluate(run, run.config.get("final_eval_splits", ()), run.final_predict_fn, run.state.params),
             **_averaged(run, step, run.config.eval_splits), "plateau/reached": 1.0}
  _write(run, writer, step, results)
  logging.info("final eval step %d (%.1fs): %s", step, time.time() - t0,
               ", ".join(f"{k} {v:.4f}" for k, v in results.items()))
  return results


def _evaluate(run: _Run, splits, predict_fn, params) -> dict[str, float]:
  if not splits:
    return {}
  return evaluate(run.config, run.task, params, run.mesh, run.eval_fn, predict_fn, run.model_config.max_length,
                  splits)


def _averaged(run: _Run, step: int, splits) -> dict[str, float]:
  """With ``config.average_last = N > 1``: ``splits`` and ``final_eval_splits`` scored again with the mean of the
  newest N checkpoints' parameters at or before ``step`` (Vaswani et al.), as ``<split>_avg/<metric>``; the
  final state's own scores keep their names. The training state is left as it is. N = 1: nothing."""
  n = run.config.get("average_last", 1)
  if n <= 1:
    return {}
  run.ckpt.wait()
  steps = sorted(s for s in run.ckpt.manager.all_steps() if s <= step)[-n:]
  if len(steps) < n:
    logging.warning("config.average_last = %d, but only %d checkpoint(s) exist: averaging steps %s.", n,
                    len(steps), steps)
  logging.info("Evaluating the mean of the parameters of the checkpoints of steps %s.", steps)
  params = run.ckpt.average_params(run.abstract_state, steps)
  results = {**_evaluate(run, splits, run.predict_fn, params),
             **_evaluate(run, run.config.get("final_eval_splits", ()), run.final_predict_fn, params)}
  return {"{}_avg/{}".format(*k.split("/", 1)): v for k, v in results.items()}


def _log(run: _Run, writer, history: list, done: int, rate: float) -> dict[str, float]:
  summary = {**_summarise(history), "train/steps_per_sec": rate}
  failures.warn_if_loss_grew(run.records, done, summary["train/loss"], run.task.vocab.size)
  _write(run, writer, done, summary)
  steps = run.config.num_train_steps
  logging.info("step %d/%d: loss %.4f, accuracy %.4f, %.2f steps/s, ETA %s", done, steps, summary["train/loss"],
               summary["train/accuracy"], rate, _eta((steps - done) / max(rate, 1e-9)))
  return summary


def _loop(run: _Run, writer, on_save: Callable[[int], None] = lambda step: None) -> dict[str, float]:
  """Steps from the restored one to ``num_train_steps``: logs, evaluates and saves when due; stops on a signal."""
  config, ckpt, mesh = run.config, run.ckpt, run.mesh
  final: dict[str, float] = {}
  num_steps, start = config.num_train_steps, int(run.state.step)
  if stop.requested() and start < num_steps:  # before step 1 of this process: nothing new to save
    logging.warning("Stopped by signal before training; the workdir %s resumes from step %d.", run.workdir, start)
    return {"step": float(start), "stopped_by_signal": 1.0}
  if 0 < start < num_steps:  # a restart: an evaluation its predecessor was due to write, or its plateau
    done_before = _resume_evaluation(run, writer, start)
    if done_before is not None:
      return {**final, **done_before, "step": float(start)}
  history, previous, t_log, step_log = [], None, time.time(), start
  for step in range(start, num_steps):
    # PAD rows (weight 0) make a token-budget batch's row count divisible by the devices.
    run.state, m = run.step_fn(run.state, host_batch(run.task, step, mesh))
    if previous is not None:  # one step behind, so the host does not wait for the step just launched
      _check_finite(*previous, ckpt)
    previous = (step + 1, m)  # named, like its records, by the step its update reaches
    history.append(m)
    done = step + 1
    log_due = done % config.log_every_steps == 0 or done == num_steps
    stopping = _stop_agreed(ckpt, done, log_due)
    eval_due = done % config.eval_every_steps == 0 or done == num_steps
    save_due = ckpt.due(done) or done == num_steps or stopping
    if log_due or eval_due or save_due:
      _check_finite(done, m, ckpt)
    if log_due:
      now = time.time()
      final.update(_log(run, writer, history, done, (done - step_log) / max(now - t_log, 1e-9)))
      history, t_log, step_log = [], now, done
    if save_due:
      ckpt.save(done, run.state, force=True)  # logged once written and checksummed
      on_save(done)
    if stopping:
      ckpt.wait()
      logging.warning("Stopped by signal after step %d; its checkpoint is in %s. Run again with the same "
                      "workdir to resume.", done, run.workdir)
      return {**final, "step": float(done), "stopped_by_signal": 1.0}
    if eval_due:
      final.update(_evaluate_and_write(run, writer, done, final=done == num_steps))
      if final.get("plateau/reached"):
        return {**final, "step": float(done)}
  if start >= num_steps:  # nothing left to train: the final evaluation, unless it is written already
    at_step = {k: v for r in run.records if r["step"] == start for k, v in r.items()}
    if _agreed(all(f"{s}/loss" in at_step for s in run_config.evaluated_splits(config))):
      final.update(at_step)
    else:
      final.update(_evaluate_and_write(run, writer, start, final=True))
  final["step"] = float(run.state.step)
  return final


def _resume_evaluation(run: _Run, writer, step: int) -> Optional[dict[str, float]]:
  """At a restored ``step``: the evaluation due there if none was written; the final metrics if the run is done.

  A run killed between a checkpoint and the evaluation of the same step
  evaluates it now. A run whose plateau rule held at ``step`` (it saved,
  then stopped) is finished: its final evaluation is written if it is
  missing, and its metrics are returned (None: train on).
  """
  config, rule = run.config, plateau.Rule.from_config(run.config)
  at_step = {k: v for r in run.records if r["step"] == step for k, v in r.items()}
  if step % config.eval_every_steps == 0 and not _agreed(all(f"{s}/loss" in at_step for s in config.eval_splits)):
    results = _evaluate_and_write(run, writer, step, final=False)
    return results if results.get("plateau/reached") else None
  if rule is None or not _agreed(rule.reached(plateau.curve(run.records, rule.metric), step)):
    return None
  if _agreed("plateau/reached" in at_step):
    logging.info("The plateau rule held at step %d and the final evaluation is written: nothing to do.", step)
    return at_step
  return _finish_at_plateau(run, writer, step)


def _stop_agreed(ckpt: checkpoint.Checkpoints, step: int, log_due: bool) -> bool:
  """Whether every process stops after ``step``: a local SIGTERM, or on many hosts a shared decision.

  Hosts must save the same step, so with several processes a SIGTERM counts
  only at log steps, where the flags are all-gathered, or when JAX's
  preemption service (``jax.distributed``) reports a preemption.
  """
  if jax.process_count() == 1:
    return stop.requested()
  if ckpt.manager.reached_preemption(step):
    return True
  if log_due:
    from jax.experimental import multihost_utils

    return bool(np.max(multihost_utils.process_allgather(np.int32(stop.requested()))))
  return False


def _eta(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
