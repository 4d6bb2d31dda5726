"""How much absolute position a trained translation model's states carry, read by a linear probe.

  python -m experiments.position_probe WORKDIR [WORKDIR ...] --out DIR [--metric test/bleu]

For every encoder and decoder layer of each run (its newest checkpoint), a
ridge regression from the layer's output at each real token to the token's
position, fitted on the ``validation`` split and scored on ``test`` (whole
books the probe never saw): R^2 and the mean absolute error in tokens. For the
encoder also the position counted from the sentence's end (the encoder sees
the whole source; the causal decoder cannot know where its sentence ends).

Shaw's relative terms give no token its absolute position. A model without
any position term has an encoder that is permutation-equivariant: its
outputs depend on the token and the bag of tokens only, so its R^2 is the
floor that content alone gives (a capitalised first word, a full stop last).
What a^K or a^V adds above that floor is position the model built from
relative terms, the kind an encoder-decoder's cross-attention can use to
align target and source, and a language model over arbitrary windows cannot.

Also, per decoder layer, how monotone the cross-attention is: the Pearson
correlation, within one sentence, between the target position and the
expected source position under the heads' mean attention, averaged over test
sentences of at least 5 target tokens.

Each run is named by the config keys that tell the runs apart, and set
beside its score (``--metric``, default ``test/bleu``, its last value in
``metrics.jsonl``). Outputs in ``--out``: ``position_probe.md`` (headed by
the command that regenerates it) and ``position_probe.png``, the score
against the last encoder layer's R^2, one dot per run.
"""

from __future__ import annotations

import os

import numpy as np
from absl import app
from absl import flags

from experiments import render
from experiments import runs as runs_lib

FLAGS = flags.FLAGS

DEFAULT_SCORE = "test/bleu"
RIDGE = 1e-3  # on standardised features; the probes fit ~100k tokens with 129 weights, so it barely binds
MIN_TARGET_TOKENS = 5


def _restore(workdir: str):
  """``(task, model, params)`` of the run in ``workdir`` (deterministic model, newest checkpoint)."""
  from rpr import data
  from rpr import model as model_lib
  from rpr import record

  config = record.load(workdir)
  task = data.get_task(config.data, workdir, 1)
  if getattr(task, "is_lm", False):
    raise ValueError(f"{workdir}: a decoder-only run; the probe reads an encoder-decoder model")
  model = model_lib.build(config.model.replace(vocab_size=task.vocab.size, deterministic=True))
  return task, model, runs_lib.load_params(workdir)


def layer_states(model):
  """A function ``(params, inputs, targets) -> (states, cross)``, jitted once for ``model``.

  ``states``: ``{"encoder/layer_i" | "decoder/layer_i": [b, L, d]}``, each block's output; ``cross``:
  ``{"decoder/layer_i": [b, heads, L_out, L_in]}``, the encoder-decoder attention weights.
  """
  import jax

  from rpr import blocks

  is_block = lambda m, method: method == "__call__" and isinstance(m, (blocks.EncoderBlock, blocks.DecoderBlock))

  @jax.jit
  def run(params, inputs, targets):
    _, state = model.apply({"params": params}, inputs, targets, capture_intermediates=is_block,
                           mutable=["intermediates"])
    return state["intermediates"]

  def states_and_cross(params, inputs, targets):
    tree = run(params, inputs, targets)
    states, cross = {}, {}
    for stack in ("encoder", "decoder"):
      for name, layer in tree[stack].items():
        if name.startswith("layer_"):
          states[f"{stack}/{name}"] = np.asarray(layer["__call__"][0])
          if stack == "decoder":
            cross[f"{stack}/{name}"] = np.asarray(layer["cross_attention"]["attention_weights"][0])
    return states, cross

  return states_and_cross


def collect(model, params, task, split: str) -> dict:
  """Per layer the states of every real token of ``split`` and their positions; the cross-attention monotonicity."""
  from rpr.tokens import PAD

  feats: dict[str, list] = {}
  pos = {"encoder": [], "encoder_from_end": [], "decoder": []}
  corr: dict[str, list] = {}
  states_and_cross = layer_states(model)
  for batch in task.eval_batches(split):
    x, y = batch["inputs"], batch["targets"]
    states, cross = states_and_cross(params, x, y)
    x_valid, y_valid = x != PAD, y != PAD
    x_len = x_valid.sum(1, keepdims=True)
    x_pos = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    y_pos = np.broadcast_to(np.arange(y.shape[1]), y.shape)
    pos["encoder"].append(x_pos[x_valid])
    pos["encoder_from_end"].append((x_len - 1 - x_pos)[x_valid])
    pos["decoder"].append(y_pos[y_valid])
    for name, s in states.items():
      feats.setdefault(name, []).append(s[x_valid if name.startswith("encoder") else y_valid])
    for name, w in cross.items():
      expected = (w.mean(1) * np.arange(x.shape[1])).sum(-1)  # [b, L_out]: heads' mean, expected source index
      for row in range(x.shape[0]):
        n = int(y_valid[row].sum())
        if n >= MIN_TARGET_TOKENS and np.std(expected[row, :n]) > 0:
          corr.setdefault(name, []).append(np.corrcoef(np.arange(n), expected[row, :n])[0, 1])
  return dict(features={k: np.concatenate(v) for k, v in feats.items()},
              positions={k: np.concatenate(v) for k, v in pos.items()},
              monotonicity={k: float(np.mean(v)) for k, v in corr.items()})


def fit(train_x: np.ndarray, train_y: np.ndarray):
  """Ridge regression on standardised features: a function ``x -> predicted y``."""
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  design = lambda x: np.concatenate([(x - mean) / std, np.ones((len(x), 1))], axis=1).astype(np.float64)
  z = design(train_x)
  reg = RIDGE * len(z) * np.eye(z.shape[1])
  reg[-1, -1] = 0.0  # the intercept is not shrunk
  w = np.linalg.solve(z.T @ z + reg, z.T @ train_y.astype(np.float64))
  return lambda x: design(x) @ w


def score(predicted: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
  """``(R^2, mean absolute error)``."""
  actual = actual.astype(np.float64)
  r2 = 1.0 - np.sum((predicted - actual) ** 2) / np.sum((actual - actual.mean()) ** 2)
  return float(r2), float(np.mean(np.abs(predicted - actual)))


def probe(workdir: str, fit_split: str = "validation", score_split: str = "test") -> dict:
  """``{"rows": [{layer, target, r2, mae}], "monotonicity": {decoder layer: mean correlation}}`` of one run.

  The probes are fitted on ``fit_split`` and scored (with the monotonicity) on ``score_split``.
  """
  task, model, params = _restore(workdir)
  train, test = collect(model, params, task, fit_split), collect(model, params, task, score_split)
  rows = []
  for name in train["features"]:
    stack = name.split("/")[0]
    for target in ([stack, "encoder_from_end"] if stack == "encoder" else [stack]):
      predict = fit(train["features"][name], train["positions"][target])
      r2, mae = score(predict(test["features"][name]), test["positions"][target])
      rows.append(dict(layer=name, target="from end" if target.endswith("end") else "from start", r2=r2, mae=mae))
  return dict(rows=rows, monotonicity=test["monotonicity"])


def markdown(results: dict[str, dict], names: dict[str, str], metric: dict[str, float], metric_name: str) -> str:
  """A row per run: its name and ``metric``, probe R^2 (MAE in tokens) per layer and position, the monotonicity."""
  first = next(iter(results.values()))
  keys = [(r["layer"], r["target"]) for r in first["rows"]]
  header = ["run", metric_name] + [f"{layer} {target}" for layer, target in keys]
  header += [f"{layer} monotonicity" for layer in first["monotonicity"]]
  rows = []
  for workdir, result in results.items():
    by_key = {(r["layer"], r["target"]): r for r in result["rows"]}
    cells = [names[workdir], f"{metric[workdir]:.2f}"]
    cells += [f"{by_key[k]['r2']:.2f} ({by_key[k]['mae']:.1f})" for k in keys]
    cells += [f"{result['monotonicity'][layer]:.3f}" for layer in first["monotonicity"]]
    rows.append(cells)
  return render.markdown_table(header, rows, ["---"] + [render.RIGHT] * (len(header) - 1)) + "\n"


def scheme_name(config: dict) -> str:
  """``"sinusoidal"``, ``"shaw, k=16"``, ``"shaw, k=16, a^K only + sinusoidal"``: a run's position scheme, from its
  flat config."""
  if config.get("position") != "shaw":
    return str(config.get("position"))
  terms = {(True, True): "", (True, False): ", a^K only", (False, True): ", a^V only", (False, False): ", neither term"}
  sinusoids = " + sinusoidal" if config.get("add_sinusoidal") else ""
  return (f"shaw, k={config.get('max_distance')}{terms[bool(config.get('use_keys')), bool(config.get('use_values'))]}"
          f"{sinusoids}")


def run_names(workdirs) -> tuple[dict[str, str], dict[str, runs_lib.RunRecord]]:
  """``({workdir: "shaw, k=16, a^K only, seed 1"}, {workdir: its record})``.

  Runs are named by their position scheme; when that does not tell two different configs apart, by the
  config keys that do (``experiments.runs.labels``).

  Raises:
    absl.app.UsageError: if a workdir has no metrics.jsonl.
  """
  runs = {r.workdir: r for r in runs_lib.load_runs(workdirs)}
  missing = [w for w in workdirs if w not in runs]
  if missing:
    raise app.UsageError(f"no metrics.jsonl in {missing}: the probe sets each run beside its score")
  configs = [runs_lib.shared_config(runs[w]) for w in workdirs]
  labels = [scheme_name(c) for c in configs]
  if len(set(labels)) < len(set(map(str, configs))):
    labels = runs_lib.labels(configs)
  return ({w: f"{label}, seed {runs[w].seed}" for w, label in zip(workdirs, labels)},
          {w: runs[w] for w in workdirs})


def plot(results: dict[str, dict], names: dict[str, str], metric: dict[str, float], metric_name: str,
         path: str) -> None:
  """The run's ``metric`` against its last encoder layer's position R^2 (from start), one labelled dot per run."""
  fig, ax = render.pyplot().subplots(figsize=(7.5, 5))
  lowest = 0.0
  for workdir, result in results.items():
    last = [r for r in result["rows"] if r["layer"].startswith("encoder/") and r["target"] == "from start"][-1]
    lowest = min(lowest, last["r2"])
    ax.scatter(last["r2"], metric[workdir], color="tab:blue")
    ax.annotate(names[workdir], (last["r2"], metric[workdir]), fontsize=6, xytext=(3, 2), textcoords="offset points")
  ax.set_xlim(lowest - 0.02, 1.0)  # R^2 = 1: the position read exactly
  ax.set_xlabel(f"position (from start) read linearly from the encoder's output: R^2 on test ({last['layer']})")
  ax.set_ylabel(metric_name)
  ax.grid(alpha=0.3)
  render.save(fig, path, dpi=110)


def define_flags() -> None:
  """The command line's flags (defined only when this module is the program: other commands have an ``--out``)."""
  flags.DEFINE_string("out", None, "Output directory of position_probe.md and position_probe.png.", required=True)
  flags.DEFINE_string("metric", DEFAULT_SCORE, "The run's score to set beside its probe (its last value).")


def main(argv: list[str]) -> None:
  workdirs = argv[1:]
  runs_lib.require_checkpoints(workdirs)
  out, score_name = FLAGS.out, FLAGS.metric
  command = " ".join(["python -m experiments.position_probe", *workdirs, f"--metric {score_name}", f"--out {out}"])
  names, runs = run_names(workdirs)
  score = {}
  for w, run in runs.items():
    last = run.last(score_name)
    if last is None:
      raise app.UsageError(f"{w}: its metrics.jsonl has no {score_name!r} (--metric)")
    score[w] = last[1]
  results = {w: probe(w) for w in workdirs}
  os.makedirs(out, exist_ok=True)
  text = (f"Generated by `{command}`.\n\nLinear probe of each token's position from each layer's output, fitted "
          "on `validation`, scored on `test`: R^2 (mean absolute error in tokens). Cross-attention monotonicity: "
          "mean over test sentences of corr(target position, expected source position).\n\n"
          + markdown(results, names, score, score_name))
  render.write_text(text, os.path.join(out, "position_probe.md"))
  plot(results, names, score, score_name, os.path.join(out, "position_probe.png"))


if __name__ == "__main__":
  define_flags()
  app.run(main)
