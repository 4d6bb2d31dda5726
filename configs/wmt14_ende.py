"""Shaw et al. (2018) on WMT14 EN-DE: Tables 1-3 as variants of one config.

Setup (the paper's, Section 4 of Shaw et al. 2018): TFDS
``wmt14_translate/de-en``, English source and German target; one shared
SentencePiece vocabulary of 32,768 pieces trained on the first 1M training
pairs and kept in the workdir (``spm.model``); token-budget batches of
``tokens_per_device`` x devices tokens per side, padding included (8 devices:
25,000, Shaw's "about 25k source + 25k target tokens"); Adam (0.9, 0.98, 1e-9)
with the Vaswani schedule (4,000 warm-up steps, eq. 3); label smoothing 0.1;
base 100k steps, big 300k steps. Evaluation: beam search (beam 4, alpha 0.6)
and sacrebleu BLEU (13a, detokenised) against the raw references of
newstest2013 (``validation``; Tables 2-3) and newstest2014 (``test``; Table 1).

Variants: comma-separated words after the file name.

* ``model=base|big`` (default base): ``rpr.model_config.PRESETS`` (big: d_model
  1024, 16 heads, d_ff 4096, dropout 0.3, k = 8, tables shared across heads).
* ``pe=relative|absolute`` (default relative): Shaw attention without absolute
  encodings, or sinusoidal encodings and plain attention.
* ``k=<int>``: clipping distance (default: the preset's; base: Shaw's default, big 8).
* ``ak=on|off``, ``av=on|off``: the a^K and a^V terms (default on).
* ``table1``, ``table2``, ``table3``: a cell of that table (evaluated on its
  split; tables 2-3 require the base relative model).
* ``tiny``: a few steps of a tiny model on TFDS mock data
  (``mock_examples = 64``: offline, never a download of WMT; about a
  minute); composes with the rest.

Every cell (``CELLS`` below: its table, variant and evaluated split; the
paper's BLEU, EN-DE, is in experiments/paper.py) runs as::

  .venv/bin/python run.py --config=configs/wmt14_ende.py:<variant> --workdir=workdirs/wmt14/<name>

with ``<name>`` the variant's words joined by ``_`` (``table2,k=4`` ->
``table2_k4``; ``Cell.command``); ``python -m experiments sweep wmt_table1
--print`` prints a table's commands.

The metric is ``<split>/bleu`` at the last step in ``<workdir>/metrics.jsonl``;
``python -m experiments sweep wmt_table1`` (``wmt_table2``, ``wmt_table3``)
runs or prints a whole table, to be tabulated beside these numbers as
``experiments/protocol.py`` declares tables. Not run here (a base cell is 100k steps on 8 accelerators).

Expected result: the paper's numbers, minus what differs here. Shaw report
tensor2tensor's BLEU on tokenised text, which is typically higher than
sacrebleu's detokenised BLEU for the same output; and on fewer than 8 devices
a step holds fewer tokens (raise ``tokens_per_device`` if memory allows). As
in the paper, the final evaluation also scores the mean of the last 5 (base)
or 20 (big) checkpoints (``average_last``: ``test_avg/bleu`` beside the final
state's ``test/bleu``).
What should reproduce is the shape: relative >= absolute in Table 1, k = 0
far below every k >= 1 and flat from k = 2 on in Table 2, and in Table 3 a^K
mattering more than a^V.
"""

import dataclasses

import ml_collections
from ml_collections import config_dict

from configs import base
from rpr import model_config


@dataclasses.dataclass(frozen=True)
class Cell:
  table: int  # Shaw et al.'s table
  variant: str  # the config variant of this file
  split: str  # evaluation split whose BLEU the table reports

  @property
  def workdir(self) -> str:
    parts = []
    for word in self.variant.split(","):
      key, _, value = word.partition("=")
      if not value:  # a flag: table1
        parts.append(key)
      elif key in ("model", "pe"):  # base, relative
        parts.append(value)
      else:  # k4, av_on
        parts.append(f"k{value}" if key == "k" else f"{key}_{value}")
    return "workdirs/wmt14/" + "_".join(parts)

  @property
  def command(self) -> str:
    return (f".venv/bin/python run.py --config=configs/wmt14_ende.py:{self.variant} "
            f"--workdir={self.workdir}")


# Shaw et al.'s cells of Tables 1-3 (their published BLEU: experiments/paper.py, the project's one copy).
_ON_OFF = {True: "on", False: "off"}
CELLS = (
    *(Cell(1, f"table1,model={size},pe={pe}", "test") for size in ("base", "big") for pe in ("absolute", "relative")),
    *(Cell(2, f"table2,k={k}", "validation") for k in (0, 1, 2, 4, 16, 64, 256)),
    *(Cell(3, f"table3,av={_ON_OFF[av]},ak={_ON_OFF[ak]}", "validation")
      for av, ak in ((True, True), (False, True), (True, False), (False, False))),
)

_SWITCH = {"on": True, "off": False}


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  where = "configs/wmt14_ende.py"
  flags, settings = base.parse_variant(
      variant, where, flags=("table1", "table2", "table3", "tiny"),
      keys={"model": base.choice(("base", "big")), "pe": base.choice(("relative", "absolute")),
            "k": base.integer(0), "ak": base.choice(_SWITCH), "av": base.choice(_SWITCH)})
  _check_variant(variant, flags, settings)
  model, pe = settings.get("model", "base"), settings.get("pe", "relative")

  c = base.get_config()
  for key in ("min_length", "long_max_length", "num_eval_examples"):  # copy/reverse keys
    del c[key]
  del c["batch_size"]  # batches hold tokens_per_device x devices tokens, not a number of rows
  c.batch_size = config_dict.placeholder(int)

  # Data: rpr.data.wmt.WmtTask's keys (see its docstring) and two of rpr.data's wmt14 factory.
  c.dataset = "wmt14"
  c.data_dir = config_dict.placeholder(str)  # TFDS data directory; None: TFDS's default
  c.cache_dir = config_dict.placeholder(str)  # vocabulary + tokenised training data; None: the workdir
  c.mock_examples = config_dict.placeholder(int)  # N random pairs per split of TFDS mock data (offline); None: WMT
  c.language_pair = ("de", "en")  # TFDS config wmt14_translate/de-en
  c.source_lang = "en"  # EN -> DE
  c.vocab_size = 32_768  # shared SentencePiece pieces (Shaw: 32,768 word pieces)
  c.spm_train_pairs = 1_000_000  # leading training pairs (both sides) that train the vocabulary
  c.spm_byte_fallback = True  # byte pieces instead of UNK
  c.spm_hard_vocab_limit = True  # exactly vocab_size pieces
  c.train_split = "train"  # TFDS split (slicing allowed: "train[:10%]")
  c.tokens_per_device = 3_125  # token budget per side per device; 8 devices: 25,000 per step
  c.max_length = 256  # longest training example (pieces + EOS, either side); longer ones are left out
  c.bucket_boundaries = config_dict.placeholder(tuple)  # bucket lengths; None: rpr.data.text.default_bucket_boundaries
  c.eval_batch_size = 64  # rows per evaluation batch (global); divisible by the device count
  c.eval_splits = ("validation",)  # validation: newstest2013; test: newstest2014

  # Model: the preset (base: Shaw's default k; big: k = 8 and tables shared across heads), relative (Shaw) or
  # absolute (sinusoidal) positions; encoder-decoder attention stays plain (Shaw et al.).
  preset = model_config.PRESETS[model]
  for key, value in preset.items():
    if key == "position_options":
      c.model.shaw.update(value)
    else:
      c.model[key] = value
  c.model.position = "shaw" if pe == "relative" else "sinusoidal"
  c.model.cross_position = "none"
  c.model.attention_dropout_rate = 0.0  # as in the papers (only residual and embedding dropout)
  c.model.max_length = 512  # decode cache bound: eval sentences are never filtered by length
  if "k" in settings:
    base.set_k(c, settings["k"])
  c.model.shaw.use_keys = _SWITCH[settings.get("ak", "on")]  # a^K
  c.model.shaw.use_values = _SWITCH[settings.get("av", "on")]  # a^V

  # Optimisation (Vaswani et al. / Shaw et al.).
  c.optimizer = "adam"
  c.adam_b1, c.adam_b2, c.adam_eps = 0.9, 0.98, 1e-9
  c.grad_clip_norm = None  # no clipping
  c.schedule = "vaswani"  # lr = d_model^-0.5 min(s^-0.5, s warmup^-1.5)
  c.learning_rate = 1.0  # eq. 3's multiplier
  c.warmup_steps = 4_000
  c.label_smoothing = 0.1
  c.num_train_steps = 300_000 if model == "big" else 100_000

  # Evaluation and bookkeeping.
  if "table1" in flags:
    c.eval_splits = ("validation", "test")  # Table 1 reports test; validation tracks the run
  c.eval_every_steps = 10_000
  c.decode_method = "beam"
  c.beam_size = 4
  c.beam_alpha = 0.6
  c.log_every_steps = 100
  # Vaswani et al. evaluate the mean of the last 5 (base) or 20 (big) checkpoints, written every 10 minutes:
  # about 1,400 steps of base (100,000 in 12 hours) and 600 of big (300,000 in 3.5 days) on their 8 P100s.
  c.average_last = 20 if model == "big" else 5
  c.checkpoint_every_steps = 600 if model == "big" else 1_400
  c.keep_checkpoints = c.average_last

  if "tiny" in flags:  # TFDS mock data: random strings, a 300-piece vocabulary, seconds on a CPU
    _tiny(c, settings)
  return c


def _check_variant(variant: str, flags: set, settings: dict) -> None:
  """The variant's keys together: one table, and each table's own model and keys."""
  where = "configs/wmt14_ende.py"
  tables = sorted(flags & {"table1", "table2", "table3"})
  if len(tables) > 1:
    raise ValueError(f"{where}: variant {variant!r}: one table at a time, got {tables}")
  model, pe = settings.get("model", "base"), settings.get("pe", "relative")
  if pe == "absolute" and settings.keys() & {"k", "ak", "av"}:
    raise ValueError(f"{where}: variant {variant!r}: k, ak and av set Shaw's relative attention; not with "
                     "pe=absolute")
  if tables and tables[0] in ("table2", "table3") and (model, pe) != ("base", "relative"):
    raise ValueError(f"{where}: variant {variant!r}: {tables[0]} is the base model with relative positions")
  if "table2" in flags and "k" not in settings:
    raise ValueError(f"{where}: variant {variant!r}: table2 needs k=<int> (the paper's: 0 1 2 4 16 64 256)")
  if "table3" in flags and not {"ak", "av"} <= settings.keys():
    raise ValueError(f"{where}: variant {variant!r}: table3 needs ak=on|off and av=on|off")


def _tiny(c: ml_collections.ConfigDict, settings: dict) -> None:
  """The tiny variant: TFDS mock data, a 300-piece vocabulary, 1+1 layers, 4 steps (offline, seconds)."""
  tiny = model_config.PRESETS["tiny"]
  for key in ("d_model", "num_heads", "d_ff", "dropout_rate"):
    c.model[key] = tiny[key]
  if "k" not in settings:
    c.model.shaw.update(tiny["position_options"])
  c.model.num_encoder_layers = c.model.num_decoder_layers = 1
  c.model.max_length = 64
  c.vocab_size = 300
  c.spm_train_pairs = 100
  c.spm_hard_vocab_limit = False  # a tiny corpus may give fewer pieces
  c.tokens_per_device = 128
  c.mock_examples = 64  # offline: TFDS mock data, never a download of WMT
  c.max_length = 16
  c.eval_batch_size = 8
  c.max_eval_batches = 1
  c.learning_rate = 0.2  # peak 0.2 x 32^-0.5 x 2^-0.5 = 0.025 at step 2
  c.warmup_steps = 2
  c.num_train_steps = 4
  c.eval_every_steps = 4
  c.log_every_steps = 2
  c.checkpoint_every_steps = 2
  c.average_last = c.keep_checkpoints = 2  # the final evaluation also scores the mean of steps 2 and 4


# ----------------------------------------------------------------------------
# The named sweeps of this config (configs/sweeps.py; run by `python -m experiments sweep <name>`): the paper's
# cells, one seed each; all share one vocabulary and tokenised training set in <root>/wmt14_cache.


def get_sweeps() -> dict:
  from configs.sweeps import run, sweep

  def name(variant: str) -> str:  # "table2,k=4" -> "k=4"; "table1,model=big,pe=relative" -> "big,relative"
    words = [w for w in variant.split(",") if not w.startswith("table")]
    return ",".join(w.split("=", 1)[1] if w.startswith(("model=", "pe=")) else w for w in words)

  return {f"wmt_table{table}": sweep(
      f"Table {table} on WMT14 EN-DE (Shaw's setup; accelerators needed), one seed",
      (run(name(c.variant), "configs/wmt14_ende.py", c.variant, (("cache_dir", "{root}/wmt14_cache"),))
       for c in CELLS if c.table == table))
      for table in (1, 2, 3)}
