"""Damaged generated data and records end in one line naming the file and the remedy (issue 71): a SentencePiece
model cut short, a flipped byte in an array_record shard (rpr.data.corpus.reading), a damaged line of
processes.jsonl (kept and passed over with one warning: the other spans can be trusted). Damaged metrics.jsonl
and checkpoints: tests/test_failures.py, tests/test_checkpoint.py."""

import json
import logging
import shutil

import pytest

from rpr import data
from rpr import workdir
from rpr.data import arithmetic, corpus, sentencepiece_vocab
from tests.test_failures import warnings_of


def test_a_sentencepiece_model_cut_short_names_the_file_and_is_trained_again_once_deleted(tmp_path):
  sentences = lambda: [f"the {w} sat on the mat by the {v}" for w in ("cat", "dog", "hen") for v in ("door", "wall")]
  path = tmp_path / "spm40.model"
  kwargs = dict(hard_vocab_limit=False, byte_fallback=False)
  good = sentencepiece_vocab.load_or_train(path, sentences, 40, **kwargs)
  path.write_bytes(path.read_bytes()[:len(good.model_proto) // 2])
  with pytest.raises(data.DataError) as e:
    sentencepiece_vocab.load_or_train(path, sentences, 40, **kwargs)
  message = str(e.value)
  assert "\n" not in message and message.startswith(f"{path} is not a SentencePiece model that loads")
  assert message.endswith("delete it and the next run trains it again from the same data")
  path.unlink()
  assert sentencepiece_vocab.load_or_train(path, sentences, 40, **kwargs).model_proto == good.model_proto


@pytest.mark.parametrize("where", [0.5, 0.001])  # a block header, a chunk header
def test_a_flipped_byte_in_an_array_record_shard_names_the_folder_to_delete(tmp_path, where):
  builder = arithmetic.prepare("n10_addsub", tmp_path)
  folder = builder.data_dir
  [shard] = [p for p in (tmp_path / "rpr_arithmetic").rglob("*train.array_record*")]
  damaged = bytearray(shard.read_bytes())
  damaged[max(int(len(damaged) * where), 100)] ^= 0xFF
  shard.write_bytes(bytes(damaged))
  arithmetic._SPLIT_CACHE.clear()  # pylint: disable=protected-access
  for read in (lambda: arithmetic.ArithmeticTask("n10_addsub", tmp_path, batch_size=4),
               lambda: corpus.read_split(arithmetic.prepare("n10_addsub", tmp_path), "train")):
    with pytest.raises(data.DataError) as e:
      read()
    message = str(e.value)
    assert "\n" not in message and f"in {folder} does not read back (split 'train': Corrupted" in message
    assert message.endswith(f"delete {folder} and the next run generates it again")
  shutil.rmtree(folder)
  task = arithmetic.ArithmeticTask("n10_addsub", tmp_path, batch_size=4)  # generated again, the same data
  assert task.num_examples("train") > 0 and len(corpus.read_split(task.builder, "train")) == task.num_examples("train")


def test_a_damaged_line_of_processes_jsonl_is_kept_and_passed_over_with_one_warning(tmp_path, caplog):
  path = tmp_path / workdir.PROCESSES
  other = {"host": "h", "pid": 1, "start": 1.0, "from_step": 0, "to_step": 4}
  path.write_bytes(json.dumps(other).encode() + b"\n\xff\xfe garbage\n[3]\n{\"host\": \"h\", \"pi")
  with caplog.at_level(logging.WARNING):
    workdir.record_process(str(tmp_path), 2.0, (4, 8), running=True, environment={})
    workdir.record_process(str(tmp_path), 2.0, (4, 12), environment={})  # its own line replaced, once
  lines = path.read_bytes().splitlines()
  assert lines[:4] == [json.dumps(other).encode(), b"\xff\xfe garbage", b"[3]", b"{\"host\": \"h\", \"pi"]
  assert len(lines) == 5 and json.loads(lines[4])["to_step"] == 12
  warned = warnings_of(caplog, "is not a process's span")
  assert [w.split(" is not")[0] for w in warned] == [f"{path}, line {n}" for n in (2, 3, 4)]
  assert all("kept as it is and passed over; delete that line" in w for w in warned)
