"""configs/wmt14_ende.py: every Table 1-3 cell validates, and the tiny variant runs end to end on TFDS mock data.

The end-to-end run goes through ``train.train_and_evaluate`` and the
registered ``wmt14`` data set: SentencePiece training into the workdir,
token-budget batches, a few training steps, beam-search decoding and
sacrebleu BLEU against the raw references.
"""

import dataclasses
import json
import logging
import pathlib
import re

import pytest

from experiments import paper
from experiments import runs as runs_lib
from rpr import data
from rpr import decode
from rpr import metrics
from rpr import steps
from rpr.records import read_jsonl

ROOT = pathlib.Path(__file__).resolve().parents[1]


from configs import wmt14_ende as WMT  # noqa: E402  (after ROOT, which other tests here use)
from tests import paper_cells
from tests.test_train import validate, parse


def _paper(cell) -> float:
  return paper_cells.lookup(f"table{cell.table}", runs_lib.flatten(WMT.get_config(cell.variant).to_dict()))


def test_cells_are_tables_1_to_3_with_the_papers_numbers():
  cells = {(c.table, c.variant): _paper(c) for c in WMT.CELLS}
  assert len(cells) == len(WMT.CELLS) == 4 + 7 + 4
  assert sorted(_paper(c) for c in WMT.CELLS if c.table == 1) == sorted(paper.TABLE1.values())
  assert [_paper(c) for c in WMT.CELLS if c.table == 2] == list(paper.TABLE2.values())
  assert sorted(_paper(c) for c in WMT.CELLS if c.table == 3) == sorted(paper.TABLE3.values())
  assert len({c.workdir for c in WMT.CELLS}) == len(WMT.CELLS)


@pytest.mark.parametrize("cell", WMT.CELLS, ids=[c.variant for c in WMT.CELLS])
def test_every_cell_validates_and_is_the_papers_setting(cell):
  config = WMT.get_config(cell.variant)
  for devices in (1, 8):
    validate(config, num_devices=devices)
  form = ".venv/bin/python run.py --config=configs/wmt14_ende.py:<variant> --workdir=workdirs/wmt14/<name>"
  assert form in " ".join(WMT.__doc__.split())  # the documented form, which each cell's command takes
  pattern = re.escape(form).replace(re.escape("<variant>"), re.escape(cell.variant))
  assert re.fullmatch(pattern.replace(re.escape("<name>"), r"\w+"), cell.command), cell.command
  assert cell.split in config.eval_splits and config.dataset == "wmt14"
  assert (config.decode_method, config.beam_size, config.beam_alpha) == ("beam", 4, 0.6)
  assert (config.vocab_size, config.tokens_per_device * 8) == (32_768, 25_000)
  assert config.source_lang == "en" and tuple(config.language_pair) == ("de", "en")
  model = parse(config).model.replace(vocab_size=config.vocab_size)
  assert model.position == config.model.position
  assert model.cross_position == "none"  # Shaw: encoder-decoder attention stays plain
  # The config is the cell the paper's number belongs to.
  assert _paper(cell) is not None
  if cell.table in (2, 3):
    assert (config.model.position, model.d_model, model.num_encoder_layers) == ("shaw", 512, 6)
  if cell.table == 3:
    assert model.position_options.max_distance == paper.BASE_K
  if config.model.d_model == 1024:
    assert (model.d_model, model.num_heads, model.d_ff, model.dropout_rate) == (1024, 16, 4096, 0.3)
    assert config.num_train_steps == 300_000
  else:
    assert config.num_train_steps == 100_000


@pytest.mark.parametrize("variant, message", [
    ("table2", "table2 needs k"),
    ("table2,k=4,model=big", "base model with relative"),
    ("table3,ak=off", "table3 needs ak"),
    ("pe=absolute,k=4", "not with pe=absolute"),
    ("table1,table2,k=4", "one table at a time"),
    ("k=-1", "an int >= 0"),
    ("model=huge", r"allowed: one of \['base', 'big'\]"),
    ("tiny,k=1,k=2", "unknown or repeated word 'k=2'"),
])
def test_bad_variants_fail_naming_what_is_allowed(variant, message):
  with pytest.raises(ValueError, match=message):
    WMT.get_config(variant)


@pytest.mark.slow
def test_the_documented_tiny_command_trains_decodes_with_beam_search_and_scores_bleu_offline(tmp_path, monkeypatch,
                                                                                            run_py_here, caplog):
  """`run.py --config=configs/wmt14_ende.py:tiny` trains and evaluates on TFDS mock data without a download (it used
  to hang), spied on: SentencePiece trained into the workdir, token-budget batches, beam search, and sacrebleu BLEU
  against the raw references.

  The mock also reads the evaluation splits before training, so orbax's background saves never run under it.
  """
  config = WMT.get_config("tiny")
  validate(config, num_devices=1)
  workdir = tmp_path / "run"

  tasks, scored, beams = [], [], []
  factory, bleu, beam_search = data.REGISTRY["wmt14"].factory, metrics.bleu, decode.beam_search

  def spying_factory(config, workdir, num_devices):
    task = factory(config, workdir, num_devices)
    # Mock data's as_dataset patches epath process-wide (tfds MockFs) while it
    # runs; read the eval splits now so that it never overlaps an asynchronous
    # checkpoint write. Real TFDS does not need this.
    for split in ("validation", "test"):  # every split the tiny variant evaluates
      task.references(split)
    tasks.append(task)
    return task

  def spying_bleu(hypotheses, references):
    scored.append((list(hypotheses), list(references)))
    return bleu(hypotheses, references)

  def spying_beam_search(*args, **kwargs):
    beams.append(kwargs)
    return beam_search(*args, **kwargs)

  monkeypatch.setitem(data.REGISTRY, "wmt14", dataclasses.replace(data.REGISTRY["wmt14"], factory=spying_factory))
  monkeypatch.setattr(metrics, "bleu", spying_bleu)
  monkeypatch.setattr(decode, "beam_search", spying_beam_search)
  steps.programs.cache_clear()  # the spy sees the decoder only as it is traced: built anew, not reused
  caplog.set_level(logging.WARNING, logger="absl")  # run.py's warnings, in this process
  proc = run_py_here(["--config=configs/wmt14_ende.py:tiny", f"--workdir={workdir}"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  said = caplog.text + proc.stderr
  assert "mock_examples = 64: WMT is replaced by TFDS mock data" in said
  assert "statmt.org" not in said  # nothing tried the network

  # Vocabulary trained from the training split and kept in the workdir.
  (task,) = tasks
  assert (workdir / "spm.model").read_bytes() == task.vocab.model_proto
  assert 200 < task.vocab.size <= config.vocab_size
  # Token-budget batches: at most tokens_per_device x devices positions per side, one shape per bucket.
  assert len(task.batches.shapes) >= 1
  for B, L in task.batches.shapes:
    assert B * L <= config.tokens_per_device and L <= config.max_length
  # A few training steps, logged and checkpointed.
  records = read_jsonl(workdir / "metrics.jsonl")
  assert [r["step"] for r in records if "train/loss" in r] == [2, 4]
  assert (workdir / "checkpoints" / "4" / "SHA256SUMS").exists()
  assert json.loads((workdir / "config.json").read_text())["config"]["dataset"] == "wmt14"
  results = {k: v for r in records if r["step"] == 4 for k, v in r.items()}
  # Beam search (beam 4, alpha 0.6) decoded the validation batch ...
  assert beams and all(b["beam_size"] == 4 and b["alpha"] == 0.6 for b in beams)
  # ... and BLEU scored its hypotheses against the raw reference texts, in eval order: the final state's, then
  # those of the mean of the last 2 checkpoints (average_last).
  (hyps, refs), (avg_hyps, avg_refs) = scored
  assert avg_refs == refs and results["validation_avg/bleu"] == pytest.approx(bleu(avg_hyps, refs))
  assert len(hyps) == config.eval_batch_size  # max_eval_batches = 1
  assert refs == task.references("validation")[:len(hyps)]
  assert results["validation/bleu"] == pytest.approx(bleu(hyps, refs))
  assert 0.0 <= results["validation/bleu"] <= 100.0
  assert {"validation/loss", "validation/accuracy", "validation/exact_match"} <= results.keys()
