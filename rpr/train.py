"""Training and evaluation of an encoder-decoder Transformer: ``train_and_evaluate(config, workdir)``.

``config`` is the typed :class:`rpr.config.RunConfig` that ``rpr.config.parse``
made of a config file at the boundary (run.py, the sweep runner).

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

What a run needs is built in :mod:`rpr.assemble` (after the resume checks,
:func:`rpr.record.check_resume`) and trained in :mod:`rpr.loop`; this module
holds the run's frame: the workdir's lock, this process's span in
``processes.jsonl`` (:class:`rpr.workdir.Span`), the writer and the clean-up.
"""

from __future__ import annotations

import contextlib
import time

import jax

from rpr import assemble
from rpr import failures
from rpr import loop
from rpr import provenance
from rpr import stop
from rpr import workdir as workdir_lib
from rpr import writers
from rpr.config import RunConfig
from rpr.evaluation import decode_limits, evaluate  # noqa: F401 (re-exported)
from rpr.loop import NonFiniteError  # noqa: F401 (re-exported: run.py reports it in one line)
from rpr.model import build  # noqa: F401 (re-exported)
from rpr.model_config import ModelConfig  # noqa: F401 (re-exported)
from rpr.sharding import host_batch, make_mesh, pad_rows, shard_batch  # noqa: F401 (re-exported)
from rpr.steps import TrainState, eval_step, init_state, train_step  # noqa: F401 (re-exported)


def train_and_evaluate(config: RunConfig, workdir: str, allow_config_change=(), restore_unverified: bool = False,
                       trust_checkpoints: bool = False) -> dict[str, float]:
  """Trains ``config`` in ``workdir`` (resuming from its latest checkpoint) and returns the final metrics.

  ``config``: a :class:`rpr.config.RunConfig` validated at the boundary, for these devices
  (``rpr.config.parse(config_dict, jax.device_count())``; run.py and the sweep runner). The run holds the workdir's lock
  (:mod:`rpr.workdir`) throughout. Resuming refuses config changes outside ``rpr.record.RESUME_SAFE_KEYS``
  and ``allow_config_change``, and checkpoints without a ``config.json`` unless ``trust_checkpoints``;
  ``restore_unverified`` lets a checkpoint without complete checksums restore.

  The final dict holds ``step``, the last ``train/*`` summary and the last
  evaluation (``<split>/loss``, ``/accuracy``, ``/exact_match``, ``/bleu``,
  ``/chrf``; ``/perplexity`` for a language model); ``stopped_by_signal`` is
  1.0 when SIGTERM ended the run before ``num_train_steps`` (no final
  evaluation then).
  """
  mesh = make_mesh()
  t0, environment = time.time(), provenance.environment()
  with stop.handle_signals(), (workdir_lib.lock(workdir) if jax.process_index() == 0 else contextlib.nullcontext()):
    run = assemble.prepare(config, workdir, mesh, allow_config_change, restore_unverified, trust_checkpoints)
    # This process's span, committed with the records (processes.jsonl): after each save, and at its end.
    span = workdir_lib.Span(workdir, t0, int(run.state.step), environment, writes=jax.process_index() == 0)
    writer = writers.create(workdir, jax.process_index(), config.budget.tensorboard)
    # The run's hyper-parameters for TensorBoard's HParams dashboard, beside the metrics it writes.
    writer.write_hparams(writers.hparams(run.recorded["config"]))
    try:
      return loop.train(run, writer, on_save=span.saved)
    finally:  # each step runs (the save in flight waited for); the first error is the one raised (rpr/failures.py)
      failures.clean_up(run.ckpt.close, writer.close, lambda: span.ended(run.records),
                        lambda: jax.process_index() == 0 and workdir_lib.set_aside_unresumable(workdir))
