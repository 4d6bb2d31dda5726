"""Arithmetic (seed 002): which position schemes let a Transformer tell "12+1" from "21+1"?

The data set is every ``i+j`` and ``i-j``, character level: the encoder
reads ``"21+211"``, the decoder writes ``"232"``; 10,000 examples are held out
as ``test``. Seed 002 takes ``i, j`` in ``[0, 1000)`` (2,000,000 examples,
builder config ``n1000_addsub``, variant ``config=n1000_addsub``). This config
defaults to ``[0, 300)`` (``n300_addsub``, 180,000 examples, inputs of the same
1-7 characters), sized so that the whole comparison trains on a CPU. The data
is generated as a TFDS data set into ``data_dir`` on first use.

Command (from the repository root), one run per position scheme::

  .venv/bin/python run.py --config=configs/arithmetic.py:pe=sinusoidal --workdir=workdirs/arith_sinusoidal
  .venv/bin/python run.py --config=configs/arithmetic.py:pe=none --workdir=workdirs/arith_none
  .venv/bin/python run.py --config=configs/arithmetic.py:pe=shaw,k=16 --workdir=workdirs/arith_shaw
  .venv/bin/python run.py --config=configs/arithmetic.py:pe=alibi,directional=1 --workdir=workdirs/arith_alibi_dir

Variant keys (comma separated): ``pe`` = a scheme of rpr.attention.SCHEMES
(default sinusoidal); ``k`` = Shaw's clipping distance (pe=shaw only);
``directional=1`` = ALiBi with a halved slope to the right (the same as
``pe=alibi_directional``); ``seed``; ``config`` = the data set's builder
config (e.g. ``n1000_addsub``); the flag ``quick`` is ``python run.py``'s
default length. The whole comparison (every scheme, 3 seeds, report and
attention maps) is ``python -m experiments sweep arithmetic``.

Results, with their seeds and the bounds beside them: experiments/results/arithmetic/report.md.
"""

import ml_collections

from configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  where = "configs/arithmetic.py"
  flags, settings = base.parse_variant(
      variant, where, flags=("quick",),
      keys={**base.SCHEME_KEYS, "seed": base.integer(0), "config": str})
  c = base.get_config()

  # Data.
  c.dataset = "arithmetic"  # rpr.data name: seed 002's i+j / i-j
  c.arithmetic_config = settings.get("config", "n300_addsub")  # TFDS builder config: operands in [0, 300)
  c.data_dir = "~/tensorflow_datasets"  # where the TFDS data is generated on first use
  c.seed = settings.get("seed", 0)  # seeds the batch order, the parameter init and dropout
  c.batch_size = 128  # per example, 64 and 128 learn alike
  c.eval_batch_size = 2000  # the 10k test split in 5 batches
  c.eval_splits = ("test",)  # the held-out 10,000 examples

  # Model.
  c.model.position = "sinusoidal"  # variant pe=...
  c.model.d_model = 64  # 128 learns no faster per example and costs 3x per step
  c.model.num_heads = 8  # heads of 8: more heads learn the digit alignment faster than 4
  c.model.d_ff = 256  # feed-forward inner width
  c.model.pre_layer_norm = True  # stable at a high learning rate without long warm-up
  c.model.share_embeddings = False  # separate tables: tied ones slow absolute encodings ~5x
  c.model.max_length = 16  # inputs have <= 7 characters, answers <= 4 + EOS
  # Shaw's default clipping distance: inputs are <= 7 long, so any k >= 6 never clips.
  base.set_scheme(c, settings, where, variant)

  # Optimisation.
  c.learning_rate = 3e-3  # peak rate
  c.schedule = "cosine"  # linear warm-up, then cosine decay to 0 at num_train_steps
  c.warmup_steps = 100  # warm-up steps
  c.grad_clip_norm = 1.0  # clip the global gradient norm
  c.label_smoothing = 0.0  # exact answers: no smoothing
  c.num_train_steps = 3000 if "quick" in flags else 7000  # 7,000 x 128 = 896,000 examples, 5.3 epochs of n300

  # Evaluation and bookkeeping.
  c.eval_every_steps = 100_000  # more than num_train_steps: evaluate only at the end (greedy, whole test split)
  c.log_every_steps = 500  # progress log and train/* metrics
  c.checkpoint_every_steps = 1000  # a killed run resumes from here (and the attention maps read the last one)
  c.keep_checkpoints = 1  # keep the final checkpoint only
  return c


# ----------------------------------------------------------------------------
# The named sweeps of this config (configs/sweeps.py; run by `python -m experiments sweep <name>`).

CPU_TABLE_STEPS = 4000  # Tables 2 and 3 at CPU scale: 33 runs of 4,000 steps, fewer than the comparison's 7,000
FULL_STEPS = 20_000  # the full set: 2,000,000 examples, 20,000 steps of 128 (1.3 epochs)


def get_sweeps() -> dict:
  from configs.sweeps import run, seeded, sweep, table3_cells
  from rpr.attention import positions

  here, table = "configs/arithmetic.py", (("num_train_steps", CPU_TABLE_STEPS),)
  return {
      "table2_cpu": sweep(
          "Table 2 on arithmetic: k in 0 1 2 4 16 64 256, relative positions only, 3 seeds",
          seeded(run(f"k={k}", here, f"pe=shaw,k={k}", table) for k in (0, 1, 2, 4, 16, 64, 256)),
          "clipping/table2"),
      "table3_cpu": sweep(
          "Table 3 on arithmetic: a^V and a^K on/off (k = 16), 3 seeds", seeded(table3_cells(here, table)),
          "clipping/table3"),
      # Seed 002's comparison: every registered scheme, 3 seeds, on the quick set n300 and on the seed's full set.
      "arithmetic": sweep(
          "Arithmetic n300 (seed 002): every position scheme, 7,000 steps, 3 seeds",
          seeded((run(s, here, f"pe={s}") for s in positions.SCHEMES), seed_major=True)),
      "arithmetic_full": sweep(
          "Arithmetic n1000 (seed 002's 2,000,000 examples): every position scheme, 20,000 steps, 3 seeds",
          seeded((run(s, here, f"pe={s},config=n1000_addsub", (("num_train_steps", FULL_STEPS),
                                                                 ("eval_every_steps", 5000)))
                  for s in positions.SCHEMES), seed_major=True)),
  }
