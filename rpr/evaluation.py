"""Evaluation of a trained model on a task's splits: likelihood, decoded exact match, BLEU and chrF.

:func:`evaluate` scores some splits with given parameters; it decodes with a
``predict_fn`` (:func:`rpr.predict.predict`, jitted by :mod:`rpr.assemble`)
bounded per row by the input length (:func:`decode_limits`), never by the
reference. :class:`Evaluation`, built once per run by :mod:`rpr.assemble`,
is what the training loop calls at its evaluation steps: the splits of the
run's :class:`rpr.config.Eval`, at the last step also the final splits, the
mean of the last checkpoints (``average_last``) and the decoded hypotheses
written to the workdir.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Callable, Optional

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh

from rpr import checkpoint
from rpr import metrics
from rpr import progress as progress_lib
from rpr import records
from rpr.sharding import pad_rows, shard_batch

DECODED = "decoded"  # <workdir>/decoded/<split>[_avg].txt.gz: the final evaluations' hypotheses


# An evaluation with more left than this says how to cap it.
HINT_AFTER_SECONDS = 120.0


def decode_limits(inputs: np.ndarray, pad_id: int, extra: int, cap: int) -> np.ndarray:
  """Per row, the most tokens decoding may write: its input length (non-PAD tokens) + ``extra``, at most ``cap``.

  Tensor2tensor's rule (input length + 50). It reads only the inputs, so no
  hypothesis depends on its reference: not through the limit, not through
  the batch's padded width.
  """
  return np.minimum(np.sum(inputs != pad_id, axis=1) + extra, cap)


def evaluate(config, task, params, mesh: Mesh, eval_fn: Callable, predict_fn: Callable,
             max_decode_length: int, splits=None, decoded: dict | None = None) -> dict[str, float]:
  """Loss, token accuracy, exact match (decoded) and, for text tasks, BLEU and chrF on each split.

  ``config``: the run's :class:`rpr.config.Eval`. ``splits``: the names evaluated (default ``config.eval_splits``).

  A language-model task (``task.is_lm``) is scored by likelihood only:
  ``<split>/perplexity`` (exp of the unsmoothed per-token negative
  log-likelihood) and ``<split>/tokens`` (tokens scored) replace the decoded
  metrics.

  BLEU scores the decoded hypotheses against ``task.references(split)``, the
  raw reference texts (decoded ``targets`` have been through the vocabulary's
  normalisation). With ``config.eval_by_length`` the exact match is also
  given per input length ``n`` (non-PAD input tokens) as
  ``<split>/exact_match_by_length/<n>``; with ``config.source_length_buckets``
  a text task's BLEU and chrF are also given per bucket of input lengths
  (:func:`by_length_buckets`). ``decoded``, if given, receives each text
  split's hypotheses, in the order of its references (``decoded[split]``).
  """
  results = {}
  lm = getattr(task, "is_lm", False)
  splits = config.eval_splits if splits is None else splits
  # Listed first so the progress lines have a total: a few thousand rows per split, already in memory.
  batches = {split: list(itertools.islice(task.eval_batches(split), config.max_eval_batches)) for split in splits}
  progress = _progress(batches, "loss" if lm else "loss and decoding", config.max_eval_batches is None)
  for split in splits:
    sums = {"loss_sum": 0.0, "nll_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0}
    matches, lengths, hyps = [], [], []
    for batch in batches[split]:
      batch = pad_rows(batch, mesh.size)
      sharded = shard_batch(batch, mesh)
      for k, v in jax.device_get(eval_fn(params, sharded)).items():
        sums[k] += float(v)
      if lm:  # scored by likelihood alone: nothing to decode
        progress.update(cost=_cost(batch), note=f"in {split}" if len(splits) > 1 else "")
        continue
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
      progress.update(cost=_cost(batch), note=f"in {split}" if len(splits) > 1 else "")
    tokens = max(sums["weight_sum"], 1.0)
    results[f"{split}/loss"] = sums["loss_sum"] / tokens
    results[f"{split}/accuracy"] = sums["correct_sum"] / tokens
    if lm:
      results[f"{split}/perplexity"] = float(np.exp(sums["nll_sum"] / tokens))  # per token, never smoothed
      results[f"{split}/tokens"] = sums["weight_sum"]
      continue
    results[f"{split}/exact_match"] = float(np.mean(np.concatenate(matches))) if matches else 0.0
    if config.eval_by_length and matches:
      by_length = metrics.mean_by_length(np.concatenate(matches), np.concatenate(lengths))
      results.update({f"{split}/exact_match_by_length/{n}": v for n, v in by_length.items()})
    if task.is_text:
      # Eval rows come in the order of the references, so a prefix of batches is a prefix of them.
      references = task.references(split)[:len(hyps)]
      results[f"{split}/bleu"] = metrics.bleu(hyps, references)
      results[f"{split}/chrf"] = metrics.chrf(hyps, references)
      if decoded is not None:
        decoded[split] = hyps
      if config.source_length_buckets:
        results.update(by_length_buckets(split, hyps, references, np.concatenate(lengths),
                                         config.source_length_buckets))
  progress.finish()
  return results


def _cost(batch) -> int:
  """A batch's share of the evaluation's time, for the ETA: its padded width (the decoding steps it may take);
  batches come sorted by length, so counting batches alone would promise the long ones too soon."""
  return batch["inputs"].shape[1] + batch["targets"].shape[1]


def _progress(batches: dict, what: str, uncapped: bool) -> progress_lib.Progress:
  """One progress over every split's batches; a long uncapped evaluation says how to cap it (a short run's
  test split can take many times its training: beam search over thousands of sentences)."""
  hint = "cap it for a short run with --config.max_eval_batches=N (N batches per split)" if uncapped else ""
  return progress_lib.Progress(f"evaluation of {'+'.join(batches)} ({what})", sum(map(len, batches.values())),
                               "batches", total_cost=sum(_cost(b) for v in batches.values() for b in v),
                               hint=hint, hint_after=HINT_AFTER_SECONDS)


def bucket_names(bounds) -> list[str]:
  """``(10, 11, 20)`` -> ``["1-10", "11", "12-20", "21+"]``: buckets given by their largest length, the last open."""
  lows = [1, *(b + 1 for b in bounds)]
  return [f"{lo}-{hi}" if hi > lo else f"{hi}" for lo, hi in zip(lows, bounds)] + [f"{lows[-1]}+"]


def by_length_buckets(split: str, hyps, references, lengths: np.ndarray, bounds) -> dict[str, float]:
  """Corpus BLEU and chrF of the sentences whose source length falls in each bucket of ``bounds``, with their count.

  Keys ``<split>/bleu_by_length/<bucket>``, ``/chrf_by_length/`` and
  ``/sentences_by_length/`` (:func:`bucket_names`); an empty bucket is left out.
  """
  which = np.searchsorted(np.asarray(bounds), np.asarray(lengths), side="left")  # length <= bounds[i]: bucket i
  out = {}
  for i, name in enumerate(bucket_names(bounds)):
    rows = np.flatnonzero(which == i)
    if rows.size:
      h, r = [hyps[j] for j in rows], [references[j] for j in rows]
      out[f"{split}/bleu_by_length/{name}"] = metrics.bleu(h, r)
      out[f"{split}/chrf_by_length/{name}"] = metrics.chrf(h, r)
      out[f"{split}/sentences_by_length/{name}"] = float(rows.size)
  return out


@dataclasses.dataclass
class Evaluation:
  """What the training loop evaluates with, built once per run (:func:`rpr.assemble.prepare`).

  ``config``: the run's :class:`rpr.config.Eval`; ``predict_fn`` decodes ``eval_splits`` (``decode_method``),
  ``final_predict_fn`` the ``final_eval_splits`` (``final_decode_method``); ``ckpt`` and ``abstract_state``
  restore the checkpoints that ``average_last`` averages.
  """
  config: Any
  workdir: str
  task: Any
  mesh: Mesh
  eval_fn: Callable
  predict_fn: Callable
  final_predict_fn: Callable
  max_decode_length: int
  ckpt: checkpoint.Checkpoints
  abstract_state: Any

  def __call__(self, params, step: int, final: bool) -> dict[str, float]:
    """``eval_splits`` scored with ``params``; at the last step (``final``) also what :meth:`final` adds."""
    results = self._scores(self.config.eval_splits, self.predict_fn, params)
    return {**results, **self.final(params, step)} if final else results

  def final(self, params, step: int) -> dict[str, float]:
    """The last evaluation's additions: ``final_eval_splits`` (their hypotheses written to the workdir), and
    with ``average_last`` the mean of the newest checkpoints (:meth:`averaged`)."""
    return {**self._scores(self.config.final_eval_splits, self.final_predict_fn, params, save=""),
            **self.averaged(step)}

  def averaged(self, step: int) -> dict[str, float]:
    """With ``average_last = N > 1``: ``eval_splits`` and ``final_eval_splits`` scored again with the mean of the
    newest N checkpoints' parameters at or before ``step`` (Vaswani et al.), as ``<split>_avg/<metric>``; the
    final state's own scores keep their names. The training state is left as it is. N = 1: nothing."""
    n = self.config.average_last
    if n <= 1:
      return {}
    self.ckpt.wait()
    steps = sorted(s for s in self.ckpt.manager.all_steps() if s <= step)[-n:]
    if len(steps) < n:
      logging.warning("config.average_last = %d, but only %d checkpoint(s) exist: averaging steps %s.", n,
                      len(steps), steps)
    logging.info("Evaluating the mean of the parameters of the checkpoints of steps %s.", steps)
    params = self.ckpt.average_params(self.abstract_state, steps)
    results = {**self._scores(self.config.eval_splits, self.predict_fn, params),
               **self._scores(self.config.final_eval_splits, self.final_predict_fn, params, save="_avg")}
    return {"{}_avg/{}".format(*k.split("/", 1)): v for k, v in results.items()}

  def _scores(self, splits, predict_fn, params, save: Optional[str] = None) -> dict[str, float]:
    """``save`` (a suffix: "" for the final state, "_avg" for the averaged one): each text split's hypotheses go to
    ``<workdir>/decoded/<split><save>.txt.gz``, one line per reference, so that tests over the test set (a paired
    bootstrap) can be rerun from the workdir; written before the metrics, so a run killed between the two
    rewrites them when it resumes."""
    if not splits:
      return {}
    decoded = {} if save is not None else None
    results = evaluate(self.config, self.task, params, self.mesh, self.eval_fn, predict_fn, self.max_decode_length,
                       splits, decoded)
    if decoded and jax.process_index() == 0:
      os.makedirs(os.path.join(self.workdir, DECODED), exist_ok=True)
      for split, hyps in decoded.items():
        lines = [h.replace("\n", " ") + "\n" for h in hyps]
        records.replace_lines(os.path.join(self.workdir, DECODED, f"{split}{save}.txt.gz"), lines, compressed=True)
    return results
