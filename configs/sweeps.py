"""Building blocks of the named sweeps that each task's config file declares beside its config (``get_sweeps()``).

A config file's ``get_sweeps()`` returns ``{name: sweep(...)}``: plain dicts, so that configs/ imports nothing of
experiments/, which reads them (``experiments/sweeps.py``: the Run and Sweep types and the registry). A run is a
config file, a variant of it, config keys set over it (``--config.<key>=<value>``; ``"{root}"`` in a string is the
sweeps' root) and a seed; its workdir is ``<root>/<folder>/<run name>/seed<seed>``, or, with ``same_as``
(``"<sweep>/<run name>"``), that other sweep's run's, so a shared cell trains once. What a sweep's runs
mean is read by ``python -m experiments tables`` (``experiments/protocol.py``), not declared here.
"""

from __future__ import annotations

from typing import Any, Iterable

SEEDS = (0, 1, 2)


def run(name: str, config: str, variant: str = "", overrides: Iterable[tuple[str, Any]] = (), seed: int = 0,
        same_as: str = "") -> dict:
  """One run: its name (the variant's folder, e.g. ``k=4``), config file, variant, overrides, seed, ``same_as``."""
  return {"name": name, "config": config, "variant": variant, "overrides": tuple(overrides), "seed": seed,
          "same_as": same_as}


def sweep(description: str, runs: Iterable[dict], folder: str = "") -> dict:
  """A named sweep: its description, its runs and its folder under the root ("" for its name)."""
  return {"description": description, "runs": tuple(runs), "folder": folder}


def seeded(runs: Iterable[dict], seeds=SEEDS, seed_major: bool = False) -> tuple[dict, ...]:
  """Every run once per seed; ``seed_major``: all runs of seed 0 first, so a partial sweep covers every run."""
  runs = list(runs)
  if seed_major:
    return tuple({**r, "seed": s} for s in seeds for r in runs)
  return tuple({**r, "seed": s} for r in runs for s in seeds)


def table3_cells(config: str, overrides=(), both_on: str = "") -> list[dict]:
  """Shaw's Table 3 cells of ``config`` at k = 16: a^V and a^K each on or off (``model.shaw.use_values`` and
  ``use_keys``), in the paper's row order; ``both_on``: the other sweep's run that is the both-on cell."""
  on = {True: "on", False: "off"}
  return [run(f"av={on[av]},ak={on[ak]}", config, "pe=shaw,k=16",
              (*overrides, ("model.shaw.use_values", av), ("model.shaw.use_keys", ak)),
              same_as=both_on if av and ak else "")
          for av, ak in ((True, True), (False, True), (True, False), (False, False))]


def ending(steps: int, cooldown: float = 0.2, evals: int = 8) -> tuple[tuple[str, Any], ...]:
  """The protocol's budget (experiments/results/protocol.md): ``steps`` with a cool-down over the last
  ``cooldown``, ``evals`` curve points, a checkpoint every 2% of the budget and the last 5 averaged."""
  return (("num_train_steps", steps), ("cooldown_fraction", cooldown), ("eval_every_steps", steps // evals),
          ("checkpoint_every_steps", steps // 50), ("keep_checkpoints", 5), ("average_last", 5))
