"""Named sweeps: each expands into runs (config file, variant, overrides, seed), one workdir per run.

A run's workdir is ``<root>/<folder>/<run name>/seed<seed>``, the folder being
where the sweep's report goes. ``report`` is the sweep's report, a
:class:`~experiments.spec.ReportSpec` (its metric, x axis, the paper's table
to print beside it, ...); ``python -m experiments.sweep`` prints its command.

Registered:

* ``table2_cpu``: Table 2 at CPU scale on the arithmetic data set: Shaw
  relative positions only (no absolute encoding), k in 0, 1, 2, 4, 16, 64,
  256, 3 seeds; test exact match beside the paper's BLEU.
* ``table3_cpu``: Table 3 the same way: a^K and a^V each on or off (k = 16),
  3 seeds.
* ``wmt_table1``, ``wmt_table2``, ``wmt_table3``: the paper's cells on WMT14
  EN-DE (configs/wmt14_ende.py), one seed each; all share one vocabulary and
  tokenised training set in ``<root>/wmt14_cache``.
* ``length``: length generalisation on ``reverse`` (configs/length.py):
  every position scheme (ALiBi also directional, Shaw also with k = 4), trained
  on 1-12 digits, tested on 1-24; 3 seeds.
* ``length_tiny``: two schemes of the tiny length config (seconds; tests).
* ``arithmetic``, ``arithmetic_full``: seed 002's "12+1" comparison, every scheme.
* Real text: ``lm_clipping``, ``lm_length``, ``lm_table3`` (State of the Union LM) and
  ``translation_table1`` / ``2`` / ``3``, ``translation_short`` (Bible FR-EN), and
  ``translation_absolute``: Shaw's relative attention with the absolute sinusoids added back.
* Learning curves: ``lm_curves`` (4x the LM's steps) and ``translation_curves`` (to a plateau rule).
* The pilots of experiments/results/protocol.md: ``translation_pilot`` (the budget, with a cool-down) and
  ``lm_pilot`` (the LM's size).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from configs import translation
from experiments.spec import ReportSpec
from rpr import evaluation
from rpr.attention import positions

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Run:
  name: str  # the variant's directory under the sweep, e.g. "k=4"
  config: str  # config file, relative to the repository root
  variant: str = ""  # the config file's variant ("" for none)
  overrides: tuple[tuple[str, Any], ...] = ()  # (key, value): --config.<key>=<value>; "{root}" in strings is the root
  seed: int = 0
  # "<sweep>/<run name>": another sweep's run with the same config. This cell trains in (or is read from) that
  # run's workdir, so it is trained once and counted once; tests/experiments/test_sweep.py checks that the configs
  # agree.
  same_as: str = ""

  def workdir(self, root: str, folder: str) -> str:
    """``<root>/<folder>/<name>/seed<seed>``; for a ``same_as`` run, the other sweep's run's workdir."""
    if self.same_as:
      sweep, name = self.same_as.split("/")
      folder, other = get(sweep).folder, name
    else:
      other = self.name
    return str(pathlib.Path(root) / folder / other / f"seed{self.seed}")

  def settings(self, root: str) -> dict[str, Any]:
    """The config keys this run sets over its config file's variant: overrides, then the seed."""
    values = {k: v.format(root=root) if isinstance(v, str) else v for k, v in self.overrides}
    return {**values, "seed": self.seed}


@dataclasses.dataclass(frozen=True)
class Sweep:
  name: str
  description: str
  runs: tuple[Run, ...]
  report: ReportSpec  # the sweep's report (experiments.report's flags: ReportSpec.args)
  results: str = ""  # the sweep's folder under the root: its runs and its report ("" for the sweep's name)
  shorter: tuple[str, ...] = ()  # sweeps with the same cells at a shorter budget, set beside them in the report

  @property
  def folder(self) -> str:
    return self.results or self.name

  def workdir(self, run: Run, root: str) -> str:
    return run.workdir(root, self.folder)

  def shared(self) -> tuple[str, ...]:
    """The other sweeps' runs this one reads (``Run.same_as``), in order of first use."""
    return tuple(dict.fromkeys(r.same_as for r in self.runs if r.same_as))


SWEEPS: dict[str, Sweep] = {}


def register(sweep: Sweep) -> Sweep:
  if sweep.name in SWEEPS:
    raise ValueError(f"sweep {sweep.name!r} is already registered")
  names = [(r.name, r.seed) for r in sweep.runs]
  if len(set(names)) != len(names):
    raise ValueError(f"sweep {sweep.name!r} has two runs with the same name and seed")
  if sweep.report.judge and not sweep.shorter:
    raise ValueError(f"sweep {sweep.name!r} judges {list(sweep.report.judge)} but has no shorter sweeps; allowed: "
                     "judge with shorter")
  SWEEPS[sweep.name] = sweep
  return sweep


def get(name: str) -> Sweep:
  if name not in SWEEPS:
    raise ValueError(f"unknown sweep {name!r}; allowed: {sorted(SWEEPS)}")
  return SWEEPS[name]


def _seeded(runs, seeds=SEEDS, seed_major: bool = False) -> tuple[Run, ...]:
  """Every run once per seed; ``seed_major``: all runs of seed 0 first, so a partial sweep covers every run."""
  if seed_major:
    return tuple(dataclasses.replace(r, seed=s) for s in seeds for r in runs)
  return tuple(dataclasses.replace(r, seed=s) for r in runs for s in seeds)


def _bool(on: bool) -> str:
  return "on" if on else "off"


# Table 2 at CPU scale: relative positions only, every k of the paper. The 33
# runs of Tables 2 and 3 train CPU_TABLE_STEPS (4,000) steps each, fewer than
# the arithmetic comparison's 7,000.
TABLE2_K = (0, 1, 2, 4, 16, 64, 256)
CPU_TABLE_STEPS = 4000
register(Sweep(
    "table2_cpu", "Table 2 on arithmetic: k in 0 1 2 4 16 64 256, relative positions only, 3 seeds",
    _seeded(Run(f"k={k}", "configs/arithmetic.py", f"pe=shaw,k={k}", (("num_train_steps", CPU_TABLE_STEPS),))
            for k in TABLE2_K),
    report=ReportSpec(metric="test/exact_match", x="max_distance", paper="table2", bound=("bag",)),
    results="clipping/table2"))


def _table3_cells(config: str, overrides=(), both_on: str = "") -> list[Run]:
  """Shaw's Table 3 cells of ``config`` at k = 16: a^V and a^K each on or off, in the paper's row order.

  The terms are switched by the run-config keys ``model.shaw.use_values`` and ``use_keys``.

  ``both_on``: the other sweep's run that is the a^V-and-a^K cell (``Run.same_as``).
  """
  return [Run(f"av={_bool(av)},ak={_bool(ak)}", config, "pe=shaw,k=16",
              (*overrides, ("model.shaw.use_values", av), ("model.shaw.use_keys", ak)),
              same_as=both_on if av and ak else "")
          for av, ak in ((True, True), (False, True), (True, False), (False, False))]


# Table 3 at CPU scale: a^K and a^V switched through the engine's run-config keys.
register(Sweep(
    "table3_cpu", "Table 3 on arithmetic: a^V and a^K on/off (k = 16), 3 seeds",
    _seeded(_table3_cells("configs/arithmetic.py", (("num_train_steps", CPU_TABLE_STEPS),))),
    report=ReportSpec(metric="test/exact_match", paper="table3", bound=("bag",)),
    results="clipping/table3"))


def _wmt_cells():
  from configs import wmt14_ende

  return wmt14_ende.CELLS


def _wmt_name(variant: str) -> str:
  """``"table2,k=4"`` -> ``"k=4"``; ``"table1,model=big,pe=relative"`` -> ``"big,relative"``."""
  words = [w for w in variant.split(",") if not w.startswith("table")]
  return ",".join(w.split("=", 1)[1] if w.startswith(("model=", "pe=")) else w for w in words)


for _table, _metric, _x in ((1, "test/bleu", None), (2, "validation/bleu", "max_distance"),
                            (3, "validation/bleu", None)):
  register(Sweep(
      f"wmt_table{_table}", f"Table {_table} on WMT14 EN-DE (Shaw's setup; accelerators needed), one seed",
      tuple(Run(_wmt_name(c.variant), "configs/wmt14_ende.py", c.variant, (("cache_dir", "{root}/wmt14_cache"),))
            for c in _wmt_cells() if c.table == _table),
      report=ReportSpec(metric=_metric, x=_x, paper=f"table{_table}")))

register(Sweep(
    "length", "Length generalisation on reverse: every position scheme, train 1-12 digits, test 1-24, 3 seeds",
    _seeded([Run(s, "configs/length.py", f"pe={s}") for s in positions.SCHEMES]
            + [Run("shaw_k4", "configs/length.py", "pe=shaw,k=4")]),
    report=ReportSpec(by_length=True)))

register(Sweep(
    "length_tiny", "The tiny length config with two schemes and two seeds (seconds; for tests)",
    _seeded([Run(s, "configs/length.py", f"tiny,pe={s}") for s in ("shaw", "sinusoidal")], seeds=(0, 1)),
    report=ReportSpec(by_length=True)))

# The report holds position-blind groups to their ceilings and the others to 99%, with attention maps.
ARITHMETIC_REPORT = ReportSpec(metric="test/exact_match", bound=("bag", "reversal"), target=0.99, attention=True)
# Seed 002's comparison: every registered scheme, 3 seeds, on the quick set n300 and on the seed's own full set.
register(Sweep(
    "arithmetic", "Arithmetic n300 (seed 002): every position scheme, 7,000 steps, 3 seeds",
    _seeded([Run(s, "configs/arithmetic.py", f"pe={s}") for s in positions.SCHEMES], seed_major=True),
    report=ARITHMETIC_REPORT))
# The full set: 2,000,000 examples, 20,000 steps of 128 (1.3 epochs).
FULL_STEPS = 20_000
register(Sweep(
    "arithmetic_full", "Arithmetic n1000 (seed 002's 2,000,000 examples): every position scheme, 20,000 steps, 3 seeds",
    _seeded([Run(s, "configs/arithmetic.py", f"pe={s},config=n1000_addsub",
                 (("num_train_steps", FULL_STEPS), ("eval_every_steps", 5000))) for s in positions.SCHEMES],
            seed_major=True),
    report=ARITHMETIC_REPORT))

# Real text: language modelling on the State of the Union addresses (configs/lm.py), where the context (256
# tokens) is far longer than k, and translation of Bible verses (configs/translation.py). Seed-major, so a
# partial sweep already covers every cell once.
LM_K = (0, 1, 2, 4, 8, 16, 64, 256)
# Validation, then test in windows of 1x, 2x, 4x and 8x the training context: columns, and the test ones as a curve.
_LM_TEST = ("test/perplexity", "test_x2/perplexity", "test_x4/perplexity", "test_x8/perplexity")
LM_REPORT = ReportSpec(metric="test/perplexity", also=("validation/perplexity", *_LM_TEST[1:]), curve=_LM_TEST)
register(Sweep(
    "lm_clipping", "Shaw's clipping distance on real text: LM perplexity for k in 0 1 2 4 8 16 64 256, 3 seeds",
    _seeded([Run(f"k={k}", "configs/lm.py", f"pe=shaw,k={k}") for k in LM_K], seed_major=True),
    report=dataclasses.replace(LM_REPORT, x="max_distance"), results="lm/clipping"))
register(Sweep(
    "lm_length", "Train short, test long: every position scheme's LM perplexity at 1x, 2x, 4x, 8x its context",
    # Shaw's row is lm_clipping's k = 16 run (configs/lm.py's default k).
    _seeded([Run(s, "configs/lm.py", f"pe={s}", same_as="lm_clipping/k=16" if s == "shaw" else "")
             for s in positions.SCHEMES], seed_major=True),
    report=LM_REPORT, results="lm/length"))
# Table 3 in the language model: a^V and a^K each on or off (k = 16), as translation_table3 does for translation.
register(Sweep(
    "lm_table3", "Table 3 on real text: LM perplexity with a^V and a^K on/off (k = 16)",
    _seeded(_table3_cells("configs/lm.py", both_on="lm_clipping/k=16"), seed_major=True),
    report=dataclasses.replace(LM_REPORT, paper="table3"), results="lm/table3"))
# BLEU, chrF, then BLEU per source-length bucket (configs/translation.py's BUCKETS), as columns and as one curve
# per group.
_BUCKET_BLEU = tuple(f"test/bleu_by_length/{b}" for b in evaluation.bucket_names(translation.BUCKETS))
TRANSLATION_REPORT = ReportSpec(metric="test/bleu", also=("test/chrf", *_BUCKET_BLEU), curve=_BUCKET_BLEU)
register(Sweep(
    "translation_table1", "Table 1 on Bible FR-EN: Shaw vs sinusoidal, with T5, RoPE and ALiBi beside them",
    _seeded([Run(s, "configs/translation.py", f"pe={s}")
             for s in ("sinusoidal", "shaw", "t5", "rope", "alibi_directional")], seed_major=True),
    report=dataclasses.replace(TRANSLATION_REPORT, paper="table1"), results="translation/table1"))
# Table 2's k = 16 and Table 3's a^V, a^K both on are Table 1's Shaw run (configs/translation.py's default k).
_TABLE1_SHAW = "translation_table1/shaw"
register(Sweep(
    "translation_table2", "Table 2 on Bible FR-EN: k in 0 1 2 4 8 16 64, relative positions only",
    _seeded([Run(f"k={k}", "configs/translation.py", f"pe=shaw,k={k}", same_as=_TABLE1_SHAW if k == 16 else "")
             for k in (0, 1, 2, 4, 8, 16, 64)], seed_major=True),
    report=dataclasses.replace(TRANSLATION_REPORT, x="max_distance", paper="table2"), results="translation/table2"))
register(Sweep(
    "translation_table3", "Table 3 on Bible FR-EN: a^V and a^K on/off (k = 16)",
    _seeded(_table3_cells("configs/translation.py", both_on=_TABLE1_SHAW), seed_major=True),
    report=dataclasses.replace(TRANSLATION_REPORT, paper="table3"), results="translation/table3"))
# Train short, test long on translation: training keeps the verses of at most 30 French pieces (about half),
# test_long holds the test verses longer than that.
TRANSLATION_SHORT = 30
register(Sweep(
    "translation_short", f"Train short, test long on Bible FR-EN: train on <= {TRANSLATION_SHORT} source pieces, "
    "test on longer",
    _seeded([Run(s, "configs/translation.py", f"pe={s},short={TRANSLATION_SHORT}")
             for s in ("sinusoidal", "shaw", "t5", "rope", "alibi_directional")], seed_major=True),
    # The test buckets up to 30 pieces hold lengths seen in training.
    report=dataclasses.replace(TRANSLATION_REPORT, metric="test_long/bleu",
                               also=("test_long/chrf", "test/bleu", *_BUCKET_BLEU)),
    results="translation/short"))
# Shaw et al. drop the absolute sinusoids from their relative models ("no benefit"). This sweep adds them back, to
# both terms and to a^K alone (k = 16). The other cells are Table 1's and Table 3's runs.
_SINUSOIDS = (("model.shaw.add_sinusoidal", True),)
_AK_ALONE = (("model.shaw.use_values", False),)
register(Sweep(
    "translation_absolute", "Shaw's relative attention plus the absolute sinusoids on Bible FR-EN: both terms and "
    "a^K alone (k = 16), with and without",
    _seeded([Run("ak+sinusoidal", "configs/translation.py", "pe=shaw,k=16", _AK_ALONE + _SINUSOIDS),
             Run("shaw+sinusoidal", "configs/translation.py", "pe=shaw,k=16", _SINUSOIDS),
             Run("ak", "configs/translation.py", "pe=shaw,k=16", _AK_ALONE, same_as="translation_table3/av=off,ak=on"),
             Run("shaw", "configs/translation.py", "pe=shaw", same_as=_TABLE1_SHAW),
             Run("sinusoidal", "configs/translation.py", "pe=sinusoidal", same_as="translation_table1/sinusoidal")],
            seed_major=True),
    report=TRANSLATION_REPORT, results="translation/absolute"))

# Learning curves at 4x the 2,000-step budget of configs/lm.py. The LM's cosine schedule ends at num_train_steps,
# so a longer run is a new run, not an extension: 8,000 steps (7.1 epochs), validation perplexity every 500 steps
# as the curve, the test windows at 1x-8x once at the end.
LM_CURVE_STEPS = 8_000
_LM_CURVE = (("num_train_steps", LM_CURVE_STEPS), ("eval_every_steps", 500), ("eval_splits", ("validation",)),
             ("final_eval_splits", tuple(m.split("/")[0] for m in _LM_TEST)), ("checkpoint_every_steps", 500),
             ("keep_checkpoints", 2))
register(Sweep(
    "lm_curves", f"LM learning curves to {LM_CURVE_STEPS:,} steps (4x): Shaw's k in 2 8 16 64 256, RoPE, ALiBi, "
    "sinusoidal, 3 seeds",
    _seeded([Run(f"k={k}", "configs/lm.py", f"pe=shaw,k={k}", _LM_CURVE) for k in (2, 8, 16, 64, 256)]
            + [Run(s, "configs/lm.py", f"pe={s}", _LM_CURVE) for s in ("rope", "alibi", "sinusoidal")],
            seed_major=True),
    report=dataclasses.replace(LM_REPORT, steps=("validation/perplexity",)), results="lm/curves",
    shorter=("lm_clipping", "lm_length")))

# Translation learning curves to a plateau. The rule, fixed before the runs: evaluate validation BLEU (greedy)
# every 500 steps; at a step S >= 10,000 (4x the 2,500-step budget of Tables 1-3), stop when the mean of the last
# 3 evaluations gained less than 0.2 BLEU over the mean of the 3 at or before 0.75 S; else train on, to at most
# 30,000 steps. Test BLEU by beam search (4, alpha 0.6) at the step the run stops. The Vaswani schedule does not
# depend on num_train_steps, so the first 2,500 steps are those of the committed 2,500-step runs.
TRANSLATION_CURVE = (("num_train_steps", 30_000), ("eval_every_steps", 500), ("decode_method", "greedy"),
                     ("final_decode_method", "beam"), ("plateau_metric", "validation/bleu"),
                     ("plateau_min_steps", 10_000), ("plateau_window", 0.25), ("plateau_min_gain", 0.2),
                     ("plateau_smoothing", 3), ("checkpoint_every_steps", 1_000), ("keep_checkpoints", 2))
_CURVE_CELLS = (  # (name, variant, overrides, seeds): 3 seeds for Shaw, sinusoidal and RoPE, 2 for the rest
    ("shaw", "pe=shaw,k=16", (), 3), ("sinusoidal", "pe=sinusoidal", (), 3), ("rope", "pe=rope", (), 3),
    ("t5", "pe=t5", (), 2), ("alibi_directional", "pe=alibi_directional", (), 2),
    *((f"k={k}", f"pe=shaw,k={k}", (), 2) for k in (0, 1, 2, 64)),
    ("av=off,ak=on", "pe=shaw,k=16", _AK_ALONE, 2),
    ("av=on,ak=off", "pe=shaw,k=16", (("model.shaw.use_keys", False),), 2),
    ("ak+sinusoidal", "pe=shaw,k=16", _AK_ALONE + _SINUSOIDS, 2))
register(Sweep(
    "translation_curves", "Bible FR-EN learning curves to a plateau (validation BLEU every 500 steps, >= 10,000 "
    "steps): Table 1's schemes, k in 0 1 2 64, a^K alone, a^V alone, a^K alone + sinusoids",
    tuple(Run(name, "configs/translation.py", variant, overrides + TRANSLATION_CURVE, seed=s)
          for s in SEEDS for name, variant, overrides, n in _CURVE_CELLS if s < n),
    report=dataclasses.replace(TRANSLATION_REPORT, also=("test/loss", *TRANSLATION_REPORT.also),
                               steps=("validation/bleu", "validation/loss"), judge=("test/loss",)),
    results="translation/curves",
    shorter=("translation_table1", "translation_table2", "translation_table3", "translation_absolute")))

# The pilots of experiments/results/protocol.md, run before the five-seed tables: they fix the budget every cell
# then trains. Translation: Shaw (k = 16) and sinusoidal, 2 seeds, at 4,000, 8,000 and 16,000 steps, the Vaswani
# schedule cooled down linearly to 0 over the last 20%; validation BLEU (greedy) and loss at every eighth of the
# budget; at the end test BLEU by beam search (4, alpha 0.6) of the final state and of the mean of the last 5
# checkpoints (one every 2% of the budget).
PILOT_BUDGETS = (4_000, 8_000, 16_000)
COOLDOWN = 0.2


def ending(steps: int, evals: int = 8) -> tuple[tuple[str, Any], ...]:
  """The protocol's budget overrides: ``steps`` with a cool-down, ``evals`` curve points, the last 5 averaged."""
  return (("num_train_steps", steps), ("cooldown_fraction", COOLDOWN), ("eval_every_steps", steps // evals),
          ("checkpoint_every_steps", steps // 50), ("keep_checkpoints", 5), ("average_last", 5))


_GREEDY_CURVE = (("decode_method", "greedy"), ("final_decode_method", "beam"))
register(Sweep(
    "translation_pilot", "Protocol pilot: Shaw (k = 16) and sinusoidal on Bible FR-EN at 4,000, 8,000, 16,000 steps "
    "with a cool-down, 2 seeds",
    tuple(Run(f"{cell},steps={b}", "configs/translation.py", variant, ending(b) + _GREEDY_CURVE, seed=s)
          for b in PILOT_BUDGETS for s in (0, 1) for cell, variant in (("shaw", "pe=shaw,k=16"),
                                                                        ("sinusoidal", "pe=sinusoidal"))),
    report=dataclasses.replace(TRANSLATION_REPORT, also=("test/loss", "test_avg/bleu", *TRANSLATION_REPORT.also),
                               steps=("validation/bleu", "validation/loss")),
    results="pilot/translation"))
# The LM pilot: the model size that puts Shaw (k = 16) clearly ahead of the Kneser-Ney 6-gram (seed 0 of each size
# at 8,000 steps), then that size's budget (8,000 against 16,000 steps, 2 seeds). The cosine schedule ends by itself.
LM_SIZES = {"L2d128": (), "L4d128": (("model.num_decoder_layers", 4),),
            "L2d256": (("model.d_model", 256), ("model.num_heads", 8), ("model.d_ff", 1024))}
_LM_FINAL = (("eval_splits", ("validation",)), ("final_eval_splits", tuple(m.split("/")[0] for m in _LM_TEST)))


def _lm_budget(steps: int) -> tuple[tuple[str, Any], ...]:
  return (("num_train_steps", steps), ("eval_every_steps", steps // 16), ("checkpoint_every_steps", steps // 16),
          ("keep_checkpoints", 1)) + _LM_FINAL


register(Sweep(
    "lm_pilot", "Protocol pilot: LM model sizes (seed 0, 8,000 steps), then the budget of the chosen size",
    tuple(Run(f"shaw,{size},steps=8000", "configs/lm.py", "pe=shaw,k=16", LM_SIZES[size] + _lm_budget(8_000))
          for size in ("L4d128", "L2d256")),
    report=dataclasses.replace(LM_REPORT, steps=("validation/perplexity",)), results="pilot/lm"))
