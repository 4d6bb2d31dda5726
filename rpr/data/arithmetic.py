"""The arithmetic data set of seed 002 as a TFDS builder, and a Task over it.

Every ``i+j`` and ``i-j`` for ``i, j`` in ``[0, max_operand)``, answered with
the integer result (negative results keep their sign), character level: the
encoder reads ``"21+211"`` and the decoder writes ``"232"``. The seed's full
set is ``max_operand=1000`` with ``"+-"``: 2,000,000 examples.

The data is a real TFDS data set (``ArithmeticBuilder``), generated locally
(nothing is downloaded) and written as ``array_record`` so that
``builder.as_data_source(split)`` gives random access by index; that is what
lets ``ArithmeticTask.train_batch(step)`` be a pure function of
``(seed, step)`` without replaying an input pipeline.

Splits. ``test`` holds ``min(10_000, total // 10)`` examples: 10,000 for the
full set, but never more than 10% of a small set, so a tiny operand range still
leaves most of its examples for training. The examples chosen are those with
the smallest salted BLAKE2b hash of their input text (``_TEST_SALT``); this
depends only on the example itself, not on enumeration order, NumPy's random
streams or the machine, so generating twice anywhere gives the same split.
``train`` gets every other example; the two are disjoint by construction.
Both splits are stored in enumeration order (``i``, then ``j``, then operator
in config order; shuffling is disabled), so the stored order is meaningful and
fixed; training order comes from ``ArithmeticTask``'s per-epoch permutation.

Adding a setting is one line in ``BUILDER_CONFIGS``: ``make_config(max_operand,
ops)`` derives the name (``n1000_addsub``) from its parameters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from rpr.data import corpus
from rpr.data.task import EOS, PAD, CharVocab

tfds.display_progress_bar(False)  # no TFDS progress bars in a run's log

# Operators the builder knows: the character written in the input, the word
# used in config names, and the integer function. Every character here is in
# VOCAB_CHARS so all configs share one vocabulary (and one model's embedding).
_OPS = {
    "+": ("add", lambda a, b: a + b),
    "-": ("sub", lambda a, b: a - b),
}
VOCAB_CHARS = "0123456789+-"

# Changing the salt changes which examples are held out: that would be a new
# data set, so it must come with a new builder VERSION.
_TEST_SALT = b"rpr-arithmetic-test-split-v1"
TEST_SIZE_CAP = 10_000


@dataclasses.dataclass(eq=False)
class ArithmeticConfig(tfds.core.BuilderConfig):
  """One setting of the data set: operands in ``[0, max_operand)``, operators ``ops``."""

  max_operand: int = 1000
  ops: str = "+-"

  @property
  def num_examples(self) -> int:
    return len(self.ops) * self.max_operand**2

  @property
  def test_size(self) -> int:
    """10,000 examples, or 10% of the set if that is smaller (tiny ranges)."""
    return min(TEST_SIZE_CAP, self.num_examples // 10)

  @property
  def max_input_length(self) -> int:
    """Longest input: both operands at their largest (most digits)."""
    return 2 * len(str(self.max_operand - 1)) + 1

  @property
  def max_target_length(self) -> int:
    """Longest answer, without EOS; the extremes of each operator decide it."""
    top = self.max_operand - 1
    return max(len(str(f(a, b))) for op in self.ops
               for f in [_OPS[op][1]] for a in (0, top) for b in (0, top))


def make_config(max_operand: int, ops: str = "+-", description: str | None = None) -> ArithmeticConfig:
  """A config whose name encodes its parameters, e.g. ``n1000_addsub``."""
  if max_operand < 1:
    raise ValueError(f"max_operand must be positive, got {max_operand}")
  if not ops or len(set(ops)) != len(ops) or any(o not in _OPS for o in ops):
    raise ValueError(f"ops must be distinct characters from {''.join(_OPS)!r}, got {ops!r}")
  name = f"n{max_operand}_" + "".join(_OPS[o][0] for o in ops)
  n = len(ops) * max_operand**2
  return ArithmeticConfig(
      name=name, max_operand=max_operand, ops=ops,
      description=description or f"operators {ops!r}, operands in [0, {max_operand}): {n:,} examples")


def enumerate_examples(config: ArithmeticConfig) -> tuple[list[str], list[str]]:
  """All (input, target) texts of a config in enumeration order: i, then j, then operator."""
  inputs, targets = [], []
  fns = [(o, _OPS[o][1]) for o in config.ops]
  for i in range(config.max_operand):
    for j in range(config.max_operand):
      for o, f in fns:
        inputs.append(f"{i}{o}{j}")
        targets.append(str(f(i, j)))
  return inputs, targets


def held_out_mask(inputs: Sequence[str], test_size: int) -> np.ndarray:
  """Boolean mask over ``inputs``: True for the ``test_size`` smallest salted hashes.

  Hashing the text (not the index) keeps the held-out set a property of the
  examples themselves; ties (astronomically unlikely with 64 bits) go to the
  earlier index so the choice is total and deterministic.
  """
  h = np.fromiter(
      (int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8, key=_TEST_SALT).digest(), "big")
       for s in inputs), dtype=np.uint64, count=len(inputs))
  order = np.lexsort((np.arange(len(inputs)), h))  # primary key: hash
  mask = np.zeros(len(inputs), bool)
  mask[order[:test_size]] = True
  return mask


def split_examples(config: ArithmeticConfig) -> dict[str, tuple[list[str], list[str]]]:
  """The ``train`` and ``test`` splits as text lists, exactly as the builder writes them.

  Lets code that only needs the texts (e.g. ``rpr.data.bounds``) skip TFDS.
  """
  inputs, targets = enumerate_examples(config)
  mask = held_out_mask(inputs, config.test_size)
  out = {}
  for split, keep in (("train", ~mask), ("test", mask)):
    idx = np.flatnonzero(keep)
    out[split] = ([inputs[k] for k in idx], [targets[k] for k in idx])
  return out


class ArithmeticBuilder(tfds.core.GeneratorBasedBuilder):
  """TFDS builder for the arithmetic data set (see the module docstring).

  Plain (beam-less) generation; its cost is in experiments/README.md.
  """

  name = "rpr_arithmetic"  # prefixed so it cannot clash with a TFDS catalogue name
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Seed 002 arithmetic; hashed 10k/10% test split."}
  BUILDER_CONFIGS = [
      make_config(1000, "+-", "Seed 002's full set: i+j and i-j for i, j in [0, 1000), 2,000,000 examples."),
      make_config(300, "+-", "CPU-sized: i+j and i-j for i, j in [0, 300), 180,000 examples."),
      make_config(100, "+-", "Small, for fast tests: i+j and i-j for i, j in [0, 100), 20,000 examples."),
      make_config(10, "+-", "Tiny, for unit tests: single digits, 200 examples."),
  ]
  DEFAULT_BUILDER_CONFIG_NAME = "n1000_addsub"

  def __init__(self, *, file_format: str | None = "array_record", **kwargs):
    # array_record by default: the Task relies on random access.
    super().__init__(file_format=file_format, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "inputs": tfds.features.Text(),
            "targets": tfds.features.Text(),
        }),
        supervised_keys=("inputs", "targets"),
        # Stored order = enumeration order, so eval order is meaningful and
        # training order is entirely the Task's permutation.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    config = self.builder_config
    inputs, targets = enumerate_examples(config)
    mask = held_out_mask(inputs, config.test_size)
    return {
        "train": self._generate_examples(inputs, targets, ~mask),
        "test": self._generate_examples(inputs, targets, mask),
    }

  def _generate_examples(self, inputs, targets, keep):
    # The key is the enumeration index: unique, deterministic, and with
    # shuffling disabled it is what orders the stored examples.
    for k in np.flatnonzero(keep).tolist():
      yield k, {"inputs": inputs[k], "targets": targets[k]}


def config_by_name(name: str) -> ArithmeticConfig:
  for c in ArithmeticBuilder.BUILDER_CONFIGS:
    if c.name == name:
      return c
  raise ValueError(f"unknown arithmetic config {name!r}; known: "
                   f"{[c.name for c in ArithmeticBuilder.BUILDER_CONFIGS]}")


def prepare(config_name: str, data_dir: str | os.PathLike) -> ArithmeticBuilder:
  """The builder for ``config_name`` under ``data_dir``, generating the data if absent."""
  builder = ArithmeticBuilder(config=config_name, data_dir=os.fspath(data_dir))
  corpus.generate(builder, file_format="array_record")  # the 2M-example configs take minutes
  return builder


# (data_dir of the builder, split) -> tokenised (inputs, targets); see ArithmeticTask.split_arrays.
_SPLIT_CACHE: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}


class ArithmeticTask:
  """The arithmetic data set as a ``rpr.data.task.Task``.

  Training order: global example position ``p = step * batch_size + r`` falls
  in epoch ``p // n_train`` at offset ``p % n_train``, and the example used is
  ``perm[epoch][offset]``, an index into the stored ``train`` split, with
  ``perm[epoch]`` a permutation drawn from ``(seed, epoch)``. So a batch
  depends on nothing but ``(seed, step)``: a resumed run sees exactly the
  batches of a straight run, each example is seen once per epoch, and a batch
  may straddle two epochs.

  Reading. With ``preload=True`` (default) the split is read once and
  tokenised into arrays, and ``train_batch`` gathers rows; with
  ``preload=False`` each batch is a random-access read of its rows from the
  array_record data source. The batches are identical either way; what each
  costs is in experiments/README.md.

  ``eval_batches(split)`` walks the split in stored (enumeration) order; the
  split is tokenised on first use and cached.

  Every batch has the same shape: inputs padded to the config's longest input,
  targets to its longest answer + 1 for EOS, so a jitted step never retraces.
  """

  is_text = False

  def __init__(self, config_name: str, data_dir: str | os.PathLike, batch_size: int, seed: int = 0,
               eval_batch_size: int | None = None, preload: bool = True):
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    self.config = config_by_name(config_name)
    self.builder = prepare(config_name, data_dir)
    self.vocab = CharVocab(VOCAB_CHARS)
    self.batch_size = batch_size
    self.eval_batch_size = eval_batch_size or batch_size
    self.seed = seed
    self.input_length = self.config.max_input_length
    self.target_length = self.config.max_target_length + 1  # + EOS
    # Byte -> id table for vectorised tokenisation; 0 (PAD) marks bytes
    # outside the vocabulary, which _tokenise rejects.
    self._lut = np.zeros(256, np.int32)
    for c in VOCAB_CHARS:
      self._lut[ord(c)] = self.vocab.encode(c)[0]
    self._sources = {}
    self._perms: dict[int, np.ndarray] = {}
    self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if preload:
      self.split_arrays("train")

  def source(self, split: str):
    """The split's random-access data source; records are the stored bytes.

    Records are serialised ``tf.train.Example`` protos and are parsed here
    with TFDS's own copy of the proto (``tensorflow_datasets.proto``) rather
    than through ``as_data_source``'s deserialisers: TFDS's per-record decode
    into dicts of numpy bytes is slower in bulk, and its "no decode" option
    imports TensorFlow. Nothing here, generation included, imports TensorFlow.
    """
    if split not in self._sources:
      self._sources[split] = self.builder.as_data_source(
          split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    return self._sources[split]

  def num_examples(self, split: str) -> int:
    return self.builder.info.splits[split].num_examples

  def read_texts(self, split: str, keys: Sequence[int]) -> tuple[list[bytes], list[bytes]]:
    """``(inputs, targets)`` as bytes for the given indices of the stored split."""
    parse = tf_example_pb2.Example.FromString
    with corpus.reading(self.builder, split):  # damaged data: one line naming the folder to delete
      feats = [parse(r).features.feature for r in self.source(split).__getitems__(list(keys))]
    return ([f["inputs"].bytes_list.value[0] for f in feats],
            [f["targets"].bytes_list.value[0] for f in feats])

  def _tokenise(self, texts: list[bytes], length: int, eos: bool) -> np.ndarray:
    """Right-padded ids ``[len(texts), length]``, EOS after each text if asked (vectorised)."""
    n = len(texts)
    lens = np.fromiter(map(len, texts), np.int64, count=n)
    if n and lens.max() + eos > length:
      raise ValueError(f"text of length {lens.max()} (+EOS: {eos}) does not fit the padded length {length}")
    ids = self._lut[np.frombuffer(b"".join(texts), np.uint8)]
    if (ids == PAD).any():
      raise ValueError("text holds a character outside the vocabulary")
    starts = np.cumsum(lens) - lens
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(len(ids)) - np.repeat(starts, lens)
    out = np.zeros((n, length), np.int32)
    out[rows, cols] = ids
    if eos:
      out[np.arange(n), lens] = EOS
    return out

  def _batch(self, inputs: list[bytes], targets: list[bytes]) -> dict[str, np.ndarray]:
    return {"inputs": self._tokenise(inputs, self.input_length, eos=False),
            "targets": self._tokenise(targets, self.target_length, eos=True)}

  def split_arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The whole split tokenised, ``(inputs, targets)``, in stored order (cached).

    Also cached per process (keyed by the split's files): a sweep running many
    trainings in one process reads and tokenises each split once.
    """
    key = (os.fspath(self.builder.data_dir), split)
    if split not in self._arrays and key in _SPLIT_CACHE:
      self._arrays[split] = _SPLIT_CACHE[key]
    if split not in self._arrays:
      # In chunks, so that memory holds one chunk's parsed protos rather than the whole split's; each
      # chunk is one read of the data source.
      n, chunk = self.num_examples(split), 1 << 16
      parts = [self._batch(*self.read_texts(split, range(a, min(a + chunk, n)))) for a in range(0, n, chunk)]
      self._arrays[split] = tuple(
          np.concatenate([p[k] for p in parts]) if parts else np.zeros((0, length), np.int32)
          for k, length in (("inputs", self.input_length), ("targets", self.target_length)))
      for a in self._arrays[split]:
        a.setflags(write=False)  # shared through _SPLIT_CACHE
      _SPLIT_CACHE[key] = self._arrays[split]
    return self._arrays[split]

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      # Keep only the last two epochs: steps move forward and a batch
      # straddles at most one boundary (unless the split is smaller than a
      # batch; then older epochs are just recomputed).
      if len(self._perms) >= 2:
        del self._perms[min(self._perms)]
      rng = np.random.default_rng([self.seed, epoch])
      self._perms[epoch] = rng.permutation(self.num_examples("train"))
    return self._perms[epoch]

  def train_indices(self, step: int) -> np.ndarray:
    """Indices into the stored ``train`` split of the examples of batch ``step``."""
    if step < 0:
      raise ValueError(f"step must be non-negative, got {step}")
    n = self.num_examples("train")
    epoch, offset = np.divmod(step * self.batch_size + np.arange(self.batch_size, dtype=np.int64), n)
    idx = np.empty(self.batch_size, np.int64)
    for e in np.unique(epoch).tolist():
      sel = epoch == e
      idx[sel] = self._permutation(e)[offset[sel]]
    return idx

  def train_rows(self, step: int) -> int:
    return self.batch_size

  def train_batch(self, step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    idx = self.train_indices(step)[rows]
    if "train" in self._arrays:
      inputs, targets = self._arrays["train"]
      return {"inputs": inputs[idx], "targets": targets[idx]}
    return self._batch(*self.read_texts("train", idx.tolist()))

  def eval_batches(self, split: str = "test") -> Iterator[dict[str, np.ndarray]]:
    inputs, targets = self.split_arrays(split)
    bs = self.eval_batch_size
    for start in range(0, len(inputs), bs):
      x, y = inputs[start:start + bs], targets[start:start + bs]
      if len(x) < bs:  # all-PAD rows keep the shape fixed; PAD targets mark them
        x = np.concatenate([x, np.zeros((bs - len(x), x.shape[1]), np.int32)])
        y = np.concatenate([y, np.zeros((bs - len(y), y.shape[1]), np.int32)])
      yield {"inputs": x, "targets": y}


DEFAULT_DATA_DIR = "~/tensorflow_datasets"


def from_config(config) -> ArithmeticTask:
  """The Task of a run config (``rpr.data`` registers it as ``arithmetic``).

  Reads ``arithmetic_config`` (builder config name, default ``n1000_addsub``:
  the seed's 2,000,000 examples), ``data_dir`` (where TFDS data is generated on
  first use; None: ``~/tensorflow_datasets``), ``batch_size``,
  ``eval_batch_size`` and ``seed``. The training split is preloaded.
  """
  name = config.get("arithmetic_config") or ArithmeticBuilder.DEFAULT_BUILDER_CONFIG_NAME
  data_dir = os.path.expanduser(config.get("data_dir") or DEFAULT_DATA_DIR)
  return ArithmeticTask(name, data_dir, batch_size=config.batch_size, seed=config.seed,
                        eval_batch_size=config.eval_batch_size)
