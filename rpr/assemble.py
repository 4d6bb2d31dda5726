"""What a run needs before step 1, built in one place from its typed config: the task, the model, the optimizer,
the restored (or initialised) state, the compiled steps and decoders, and the records it continues.

Each piece is made from the section of :class:`rpr.config.RunConfig` that
describes it: the task from :class:`~rpr.config.Data`, the model from
:class:`~rpr.model_config.ModelConfig`, the optimizer from :class:`~rpr.config.Optim`,
the checkpoints and the loop's schedule from :class:`~rpr.config.Budget`, the
evaluation and its decoders from :class:`~rpr.config.Eval`. :class:`Run`
hands the loop (:mod:`rpr.loop`) the pieces, built: the compiled steps, the
plateau rule, the evaluation (:class:`rpr.evaluation.Evaluation`).

The run's ``config.json`` is read and written here too: the workdir's history
is checked against the config before anything is built
(:func:`rpr.record.check_resume`, which hands back the config as recorded),
and that record is written once the state has restored.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Optional

import jax
from absl import logging
from jax.sharding import Mesh

from rpr import checkpoint
from rpr import data
from rpr import evaluation
from rpr import plateau
from rpr import record
from rpr import records
from rpr import sharding
from rpr import steps
from rpr.config import Budget, ConfigError, RunConfig
from rpr.model_config import ModelConfig
from rpr.steps import TrainState


@dataclasses.dataclass
class Run:
  """What the loop needs, built before step 1: the task, the model, the restored state, the compiled steps."""
  workdir: str
  budget: Budget  # how long to train, how often to log, evaluate and save
  rule: Optional[plateau.Rule]  # the plateau rule (None: train to num_train_steps)
  recorded: dict  # what config.json holds: the config as written (recorded["config"]), the model as built
  task: Any
  model_config: ModelConfig
  state: TrainState
  ckpt: checkpoint.Checkpoints
  step_fn: Callable
  batch: Callable  # the global batch of a step, from this process's rows (rpr.sharding.host_batch)
  evaluation: evaluation.Evaluation  # what each evaluation scores, with which decoders
  records: list  # metrics.jsonl up to the restored step, then what this run writes (process 0; [] elsewhere)


def prepare(config: RunConfig, workdir: str, mesh: Mesh, allow_config_change=(), restore_unverified: bool = False,
            trust_checkpoints: bool = False) -> Run:
  """Checks the workdir's history against ``config`` before anything is built (:func:`rpr.record.check_resume`,
  with ``allow_config_change`` and ``trust_checkpoints``), builds the task and model, restores the newest checkpoint
  that restores (or initialises; ``restore_unverified``: see :class:`rpr.checkpoint.Checkpoints`), and writes
  ``config.json`` after the restore (a workdir that does not restore stays as it was)."""
  # The config as config.json records it: the one checked here, written below once the run has restored.
  as_recorded = record.check_resume(config, workdir, allow_config_change, trust_checkpoints=trust_checkpoints)
  rule = config.budget.plateau_rule()
  task = data.get_task_once(config.data, workdir, mesh.size)
  # The run's model and its evaluation variant (no dropout), both derived from the typed config.
  model_config = config.model.replace(vocab_size=task.vocab.size)
  eval_config = model_config.replace(deterministic=True)
  if (model_config.num_encoder_layers == 0) != getattr(task, "is_lm", False):
    raise ConfigError(
        f"config.model.num_encoder_layers = {model_config.num_encoder_layers} does not fit data set "
        f"{config.data.dataset!r}: a decoder-only model (0 encoder layers) needs a language-model data set and "
        "an encoder-decoder model (>= 1) a data set with inputs")
  os.makedirs(workdir, exist_ok=True)
  first = task.train_batch(0, slice(0, 1))  # its lengths
  decoding = (config.eval.decode_method, config.eval.final_decode_method or config.eval.decode_method,
              config.eval.beam_size, config.eval.beam_alpha)
  made = steps.programs(model_config, eval_config, config.optim, config.budget.num_train_steps,
                        (first["inputs"].shape[1], first["targets"].shape[1]), decoding, mesh)
  rng = jax.random.PRNGKey(config.data.seed)
  abstract = jax.eval_shape(made.init, rng)  # the state's shapes, dtypes and shardings, which a restore fills
  ckpt = checkpoint.Checkpoints(os.path.join(workdir, "checkpoints"), every=config.budget.checkpoint_every_steps,
                                keep=config.budget.keep_checkpoints, allow_unverified=restore_unverified)
  if ckpt.latest_step() is not None:
    state = ckpt.restore(abstract)  # the newest that restores; CheckpointError if none does
    logging.info("Resumed from the checkpoint of step %d in %s.", int(state.step), workdir)
  else:
    state = made.init(rng)
    n = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    logging.info("Initialised %s parameters on %d device(s).", f"{n:,}", mesh.size)
  recorded = record.write(workdir, {"config": as_recorded, "model_config": model_config.to_dict()})
  evaluator = evaluation.Evaluation(config.eval, workdir, task, mesh, made.eval, made.predict, made.final_predict,
                                    model_config.max_length, ckpt, abstract)
  kept = records.continued(os.path.join(workdir, "metrics.jsonl"), int(state.step))
  batch = functools.partial(sharding.host_batch, task, mesh=mesh)
  return Run(workdir, config.budget, rule, recorded, task, model_config, state, ckpt, made.step, batch, evaluator,
             kept)
