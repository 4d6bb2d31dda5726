"""The per-seed tables of the results READMEs, typed by hand as runs land, are what the committed records say.

Each table is named by its header row; each row names a variant folder of the curves sweep, and each number is
that folder's run of one seed (in seed order), or, for a shorter-budget column, the committed run of the same
cell (:func:`_cell`) and seed at another budget; the baseline row is ``baselines.json``'s. A
number copied wrong, a seed left out, or a row for a run that is not committed fails here, naming the row and
column.
"""

import json
import pathlib
import re
import statistics


from experiments import runs as runs_lib
from rpr import config as rpr_config
from rpr import plateau
from rpr import records as records_lib
from rpr.records import read_jsonl

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
BASELINES = json.loads((RESULTS / "baselines" / "baselines.json").read_text())
# The keys that say how long and how a cell was trained and evaluated, not what it trains: one cell at any budget.
BUDGET_KEYS = ("seed", "num_train_steps", "eval_every_steps", "eval_splits", "final_eval_splits", "decode_method",
               "final_decode_method", "checkpoint_every_steps", "keep_checkpoints", "log_every_steps", "tensorboard",
               *rpr_config.PLATEAU_KEYS)


def _cell(config: dict) -> str:
  """What a flat run config trains, without its budget: equal for one cell at any budget."""
  return json.dumps({k: v for k, v in config.items() if k not in BUDGET_KEYS}, sort_keys=True)


def _table(readme: pathlib.Path, header: str) -> list[list[str]]:
  """The body rows of the Markdown table whose header row starts with ``header``, as lists of cells."""
  lines = readme.read_text().splitlines()
  start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
  assert start is not None, f"{readme}: no table headed {header!r}"
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    rows.append([c.strip() for c in line.strip("|").split("|")])
  return rows


def _runs(committed_workdirs, folder: pathlib.Path) -> list[runs_lib.RunRecord]:
  """The committed runs under ``folder``, in seed order."""
  found = [str(w) for w in committed_workdirs if folder in w.parents]
  return sorted(runs_lib.load_runs(found), key=lambda r: r.seed)


def _pool(committed_workdirs, sweeps: list[str]) -> list[runs_lib.RunRecord]:
  """The committed runs of the shorter-budget ``sweeps`` folders, loaded once per table."""
  return runs_lib.load_runs([str(w) for w in committed_workdirs if any(RESULTS / s in w.parents for s in sweeps)])


def _shorter(pool: list[runs_lib.RunRecord], run: runs_lib.RunRecord) -> runs_lib.RunRecord:
  """The run of ``pool`` with ``run``'s cell and seed (exactly one)."""
  twins = [r for r in pool if _cell(r.config) == _cell(run.config) and r.seed == run.seed]
  assert len(twins) == 1, (run.workdir, [t.workdir for t in twins])
  return twins[0]


def _evaluations(path: pathlib.Path, metric: str) -> dict[int, float]:
  """``metric`` at each evaluation a metrics file records, by step: the evaluations, not the final test record."""
  return {r["step"]: r[metric] for r in read_jsonl(path) if metric in r and "test/loss" not in r}


def _capped(run: runs_lib.RunRecord) -> bool:
  """Whether ``run`` has a plateau rule and reached its cap without the rule stopping it."""
  cap = run.config.get("num_train_steps")
  return (bool(run.config.get("plateau_metric")) and records_lib.plateau_step(run.records) is None
          and cap is not None and any(r["step"] >= cap for r in run.records))


def _last(run: runs_lib.RunRecord, metric: str) -> float:
  found = run.last(metric)
  assert found is not None, (run.workdir, metric)
  return found[1]


LM_CELLS = {"k = 2": "k=2", "k = 8": "k=8", "k = 16": "k=16", "k = 64": "k=64", "k = 256": "k=256",
            "RoPE": "rope", "ALiBi": "alibi", "sinusoidal": "sinusoidal"}
LM_COLUMNS = [("test/perplexity", True), ("test/perplexity", False), ("test_x8/perplexity", True),
              ("test_x8/perplexity", False)]  # (metric, at the shorter budget), in the table's column order


def test_the_lm_curves_table_is_the_committed_runs(committed_workdirs):
  rows = _table(RESULTS / "lm" / "README.md", "| cell | 1x, 2,000 steps | 1x, 8,000 steps |")
  cells = [r for r in rows if not r[0].startswith("*")]
  assert [r[0] for r in cells] == list(LM_CELLS), [r[0] for r in cells]
  order = BASELINES["lm"]["chosen_order"]
  ngram = BASELINES["lm"]["orders"][order]["splits"]
  expected = [f"*Kneser-Ney {order}-gram*"] + [f"{ngram[m.split('/')[0]]['perplexity']:.2f}" for m, _ in LM_COLUMNS]
  assert [r for r in rows if r[0].startswith("*")] == [expected]  # one baseline row: the same at both budgets
  pool = _pool(committed_workdirs, ["lm/clipping", "lm/length"])
  for row in cells:
    runs = _runs(committed_workdirs, RESULTS / "lm" / "curves" / LM_CELLS[row[0]])
    assert runs, row[0]
    # every seed of the cell at 2,000 steps, not only those already trained for 8,000
    twin = _shorter(pool, runs[0])
    shorter = _runs(committed_workdirs, pathlib.Path(twin.workdir).parent)
    for text, (metric, short) in zip(row[1:], LM_COLUMNS):
      expected = ", ".join(f"{_last(r, metric):.2f}" for r in (shorter if short else runs))
      assert text == expected, (row[0], metric, "2,000 steps" if short else "8,000 steps", text, expected)


def _gain(run: runs_lib.RunRecord) -> float:
  """What the run's plateau rule measured at its last evaluation (rpr.plateau)."""
  keys = {k: v for k, v in run.config.items() if k.startswith("plateau_")}  # run.config is flat: model.* too
  rule = rpr_config.Budget(**keys).plateau_rule()
  curve = plateau.curve(run.records, rule.metric)
  return rule.gain(curve, max(step for step, _ in curve))


TRANSLATION_CELLS = {"Shaw (k = 16)": "shaw", "sinusoidal": "sinusoidal", "RoPE": "rope", "T5 bias": "t5",
                     "ALiBi (directional)": "alibi_directional", "a^K alone + sinusoids": "ak+sinusoidal",
                     "k = 0": "k=0", "k = 1": "k=1", "k = 2": "k=2", "k = 64": "k=64", "a^K alone": "av=off,ak=on",
                     "a^V alone": "av=on,ak=off"}


def test_the_translation_curves_table_is_the_committed_runs(committed_workdirs):
  rows = _table(RESULTS / "translation" / "README.md", "| cell | seed | steps | plateau rule |")
  cells = [r for r in rows if not r[0].startswith("*")]
  assert cells, "no run in the table"
  retrieval = BASELINES["translation"]["retrieval"]
  assert [r for r in rows if r[0].startswith("*")] == [[
      "*retrieval baseline*", "-", "-", "-", f"{retrieval['validation']['bleu']:.2f}",
      f"{retrieval['test']['bleu']:.2f}", f"{retrieval['test']['chrf']:.2f}", "-", "-"]]
  pool = _pool(committed_workdirs, ["translation/table1", "translation/table2", "translation/table3",
                                    "translation/absolute"])
  listed = set()
  for name, seed, steps, rule, validation, test, chrf, short, _ in cells:
    assert name in TRANSLATION_CELLS, f"{name!r}: add its curves folder to TRANSLATION_CELLS"
    run = next((r for r in _runs(committed_workdirs, RESULTS / "translation" / "curves" / TRANSLATION_CELLS[name])
                if str(r.seed) == seed), None)
    assert run is not None, f"{name} seed {seed} is in the table but not committed"
    listed.add(run.workdir)
    assert steps == f"{run.records[-1]['step']:,}", (name, seed, steps)
    assert rule.startswith("not met by the cap" if _capped(run) else "met"), (name, seed, rule)
    # the gain is the run's own rule's, at its last evaluation (RoPE seed 0's was typed as +0.81; it is +0.42)
    gain = _gain(run)
    assert re.search(r": ([+-]\d+\.\d\d)\b", rule).group(1) == f"{gain:+.2f}", (name, seed, rule, gain)
    twin = _shorter(pool, run)
    for text, value in [(validation, _last(run, "validation/bleu")), (test, _last(run, "test/bleu")),
                        (chrf, _last(run, "test/chrf")), (short, _last(twin, "test/bleu"))]:
      assert text == f"{value:.2f}", (name, seed, text, value)
  committed = {str(w) for w in committed_workdirs if RESULTS / "translation" / "curves" in w.parents}
  assert listed == committed, f"committed curve runs missing from the table: {sorted(committed - listed)}"


def test_a_table_ends_at_its_first_line_that_is_not_a_row(tmp_path):
  (tmp_path / "README.md").write_text("intro\n| a | b |\n| --- | --- |\n| 1 | 2 |\nprose\n| other | table |\n")
  assert _table(tmp_path / "README.md", "| a |") == [["1", "2"]]


def test_the_translation_curves_along_the_way_are_the_committed_records():
  """The translation README's "along the way" numbers: Shaw (k = 16) against sinusoidal, seeds 0 and 1, at each
  validation evaluation from 10,000 to 20,000 steps, beside the seed 0 of each against its retrain on two devices."""
  def curve(folder, metric):
    return _evaluations(RESULTS / folder / "metrics.jsonl", metric)

  curves = "translation/curves/"
  text = " ".join((RESULTS / "translation" / "README.md").read_text().split())
  for metric, d, name, said in [("validation/loss", 3, "loss", "under sinusoidal's in validation loss by"),
                                 ("validation/bleu", 2, "BLEU", "above them in validation BLEU by")]:
    shaw = [curve(f"{curves}shaw/seed{s}", metric) for s in (0, 1)]
    sinusoidal = [curve(f"{curves}sinusoidal/seed{s}", metric) for s in (0, 1)]
    retrains = [(cell[0], curve(f"noise/translation_curves_{c}/devices2/seed0", metric))
                for cell, c in ((shaw, "shaw"), (sinusoidal, "sinusoidal"))]
    steps = [s for s in sorted(retrains[0][1]) if 10_000 <= s <= 20_000]
    assert len(steps) == 21 and steps[-1] == 20_000
    sign = -1 if name == "loss" else 1  # Shaw's range under sinusoidal's in loss, above it in BLEU
    gaps = sorted(min(sign * (a[s] - b[s]) for a in shaw for b in sinusoidal) for s in steps)
    assert f"{said} {gaps[0]:.{d}f} or more (median {gaps[10]:.{d}f})" in text, (name, gaps[0], gaps[10])
    spread = "at most " if name == "loss" else "and "
    for committed, retrain in retrains:
      order = sorted(abs(committed[s] - retrain[s]) for s in steps)
      assert f"{spread}{order[-1]:.{d}f} in {name} (median {order[10]:.{d}f})" in text, (name, order[-1], order[10])
    if name == "loss":
      early = [abs(committed[2_500] - retrain[2_500]) for committed, retrain in retrains]
      assert f"at 2,500 steps Shaw's pair is {early[0]:.3f} apart in validation loss, sinusoidal's {early[1]:.3f}" \
          in text, early


def test_the_unplanned_twins_table_is_the_committed_attempts_and_restarts():
  """The noise README's restarts after a lost checkpoint: each row's attempt (its committed
  ``metrics.orphaned-*.jsonl``) against its restart (``metrics.jsonl``), at every validation evaluation both made."""
  rows = _table(RESULTS / "noise" / "README.md", "| run | attempt, restart (CPU) |")
  assert len(rows) == 4, rows
  cpus = {"AMD EPYC (avx2)": "AVX2", "AMD EPYC (avx512f)": "AVX-512", None: "not recorded"}
  for name, cpu, evaluations, bleu, loss in rows:
    run = RESULTS / name.strip("`")
    attempts = sorted(run.glob("metrics.orphaned-*.jsonl"))
    assert len(attempts) == 1, (name, attempts)
    spans = list(read_jsonl(run / "processes.jsonl"))
    restart = max(i for i, s in enumerate(spans) if s["from_step"] == 0)  # the last start from step 0
    pair = [cpus[spans[i].get("cpu")] for i in (restart - 1, restart)]  # the attempt's last span, the restart's
    assert cpu == ("not recorded" if pair == ["not recorded"] * 2 else ", ".join(pair)), (name, cpu, pair)
    for text, metric, d in [(bleu, "validation/bleu", 2), (loss, "validation/loss", 3)]:
      a, b = _evaluations(attempts[0], metric), _evaluations(run / "metrics.jsonl", metric)
      steps = sorted(set(a) & set(b))
      assert evaluations == f"{len(steps)}, to {steps[-1]:,}", (name, evaluations, len(steps), steps[-1])
      diffs = [abs(a[s] - b[s]) for s in steps]
      expected = "0 (0)" if max(diffs) == 0 else f"{max(diffs):.{d}f} ({statistics.median(diffs):.{d}f})"
      assert text == expected, (name, metric, text, expected)


def test_the_machine_check_is_its_records_and_the_committed_attempt_and_restart():
  """The noise README's check of the machine: directional ALiBi seed 1's first 200 steps rerun here give its
  restart's training loss bit for bit, its attempt's (another CPU) not, under any of the ISA caps tried."""
  run = RESULTS / "translation" / "curves" / "alibi_directional" / "seed1"

  def losses(records):
    return [repr(r["train/loss"]) for r in records if "train/loss" in r and r["step"] in (100, 200)]

  restart = losses(read_jsonl(run / "metrics.jsonl"))
  attempt = losses(read_jsonl(next(run.glob("metrics.orphaned-*.jsonl"))))
  lines = list(read_jsonl(RESULTS / "noise" / "machine_check.jsonl"))
  base = "--xla_cpu_multi_thread_eigen=false"
  assert [line["env"] for line in lines] == [
      {"XLA_FLAGS": base}, {"XLA_FLAGS": f"--xla_cpu_max_isa=AVX2 {base}"},
      {"XLA_FLAGS": f"--xla_cpu_max_isa=AVX2 {base}", "ONEDNN_MAX_CPU_ISA": "AVX2"}]
  assert {line["cpu"] for line in lines} == {"AMD EPYC (avx512f)"}, [line["cpu"] for line in lines]
  checks = [losses(line["records"]) for line in lines]
  assert all(len(c) == 2 for c in checks), checks
  assert checks[0] == restart and attempt != restart and all(c[0] != attempt[0] for c in checks)
  text = " ".join((RESULTS / "noise" / "README.md").read_text().split())
  said = (f"bit for bit: {restart[0]} at step 100 and {restart[1]} at step 200. Its attempt, on an AVX2 machine, "
          f"recorded {attempt[0]} and {attempt[1]}.")
  assert said in text, said
  assert f"gives {checks[1][0]}, and capping oneDNN's too (`ONEDNN_MAX_CPU_ISA=AVX2`) {checks[2][0]}:" in text
