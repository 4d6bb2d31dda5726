"""The training loop of a prepared run (:class:`rpr.assemble.Run`): steps, logs, evaluations, checkpoints and
the plateau rule, up to ``num_train_steps``; SIGTERM saves after the current step and returns.

Batches are ``task.train_batch(step)``, so a resumed run is identical to a
straight one. A non-finite loss, gradient or parameter stops training with
:class:`NonFiniteError` before that state is saved, so the latest checkpoint
stays the last good one.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import jax
import numpy as np
from absl import logging

from rpr import checkpoint
from rpr import failures
from rpr import stop
from rpr.assemble import Run
from rpr.config import evaluated_splits

class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss, gradient or parameter."""


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


def _evaluate_and_write(run: Run, writer, step: int, final: bool) -> dict[str, float]:
  """Evaluates (:class:`rpr.evaluation.Evaluation`: ``eval_splits``, and at the last step the final splits);
  writes and logs the metrics.

  With a plateau rule (:mod:`rpr.plateau`), an evaluation before the last step also writes ``plateau/gain``;
  when the rule holds, the run saves its checkpoint, evaluates the final splits and writes ``plateau/reached``:
  the last step.
  """
  rule, t0 = run.rule, time.time()
  results = run.evaluation(run.state.params, step, final)
  reached = False
  if rule is not None and not final:
    gain, reached = rule.judge(run.records, step, results[rule.metric])
    if gain is not None:
      results["plateau/gain"] = gain
    reached = _agreed(reached)
  if results:
    _write(run, writer, step, results)
    logging.info("eval step %d (%.1fs): %s", step, time.time() - t0, _listed(results))
  if reached:
    results.update(_finish_at_plateau(run, writer, step))
  return results


def _agreed(flag: bool) -> bool:
  """Process 0's ``flag`` on every process (only process 0 holds the metrics history)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils

  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def _finish_at_plateau(run: Run, writer, step: int) -> dict[str, float]:
  """The plateau rule held at ``step``: saves it, evaluates the final splits, writes ``plateau/reached``."""
  if run.ckpt.latest_step() != step:
    run.ckpt.save(step, run.state, force=True)
  run.ckpt.wait()
  logging.info("Plateau reached at step %d (config.plateau_metric %s): the final evaluation.", step,
               run.rule.metric)
  t0 = time.time()
  results = {**run.evaluation.final(run.state.params, step), "plateau/reached": 1.0}
  _write(run, writer, step, results)
  logging.info("final eval step %d (%.1fs): %s", step, time.time() - t0, _listed(results))
  return results


def _log(run: Run, writer, history: list, done: int, rate: float) -> dict[str, float]:
  summary = {**_summarise(history), "train/steps_per_sec": rate}
  failures.warn_if_loss_grew(run.records, done, summary["train/loss"], run.task.vocab.size)
  _write(run, writer, done, summary)
  steps = run.budget.num_train_steps
  logging.info("step %d/%d: loss %.4f, accuracy %.4f, %.2f steps/s, ETA %s", done, steps, summary["train/loss"],
               summary["train/accuracy"], rate, _eta((steps - done) / max(rate, 1e-9)))
  return summary


def _write(run: Run, writer, step: int, results: dict[str, float]) -> None:
  """``results`` of ``step`` to the writer (metrics.jsonl, TensorBoard) and to the run's records (the plateau rule's
  history), in that order: a record is in memory only once it is written."""
  writer.write_scalars(step, results)
  run.records.append({"step": step, **results})


def _listed(results: dict[str, float]) -> str:
  return ", ".join(f"{k} {v:.4f}" for k, v in results.items())


def train(run: Run, writer, on_save: Callable[[int], None] = lambda step: None) -> dict[str, float]:
  """Steps from the restored one to ``num_train_steps``: logs, evaluates and saves when due; stops on a signal."""
  budget, ckpt = run.budget, run.ckpt
  final: dict[str, float] = {}
  num_steps, start = budget.num_train_steps, int(run.state.step)
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
    run.state, m = run.step_fn(run.state, run.batch(step))
    stop.stepping()  # compiled and launched: a signal now stops after a step, with a checkpoint
    if previous is not None:  # one step behind, so the host does not wait for the step just launched
      _check_finite(*previous, ckpt)
    previous = (step + 1, m)  # named, like its records, by the step its update reaches
    history.append(m)
    done = step + 1
    log_due = done % budget.log_every_steps == 0 or done == num_steps
    stopping = _stop_agreed(ckpt, done, log_due)
    eval_due = done % budget.eval_every_steps == 0 or done == num_steps
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
    if _agreed(all(f"{s}/loss" in at_step for s in evaluated_splits(run.evaluation.config))):
      final.update(at_step)
    else:
      final.update(_evaluate_and_write(run, writer, start, final=True))
  final["step"] = float(run.state.step)
  return final


def _resume_evaluation(run: Run, writer, step: int) -> Optional[dict[str, float]]:
  """At a restored ``step``: the evaluation due there if none was written; the final metrics if the run is done.

  A run killed between a checkpoint and the evaluation of the same step
  evaluates it now. A run whose plateau rule held at ``step`` (it saved,
  then stopped) is finished: its final evaluation is written if it is
  missing, and its metrics are returned (None: train on).
  """
  rule = run.rule
  at_step = {k: v for r in run.records if r["step"] == step for k, v in r.items()}
  evaluated = all(f"{s}/loss" in at_step for s in run.evaluation.config.eval_splits)
  if step % run.budget.eval_every_steps == 0 and not _agreed(evaluated):
    results = _evaluate_and_write(run, writer, step, final=False)
    return results if results.get("plateau/reached") else None
  if rule is None or not _agreed(rule.judge(run.records, step)[1]):
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
