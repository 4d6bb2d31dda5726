"""Named sweeps: the Run and Sweep types, and the registry of the sweeps each task's config file declares.

A sweep lives beside the config it varies: ``configs/<task>.py``'s ``get_sweeps()`` returns its named sweeps
as plain dicts (built with ``configs/sweeps.py``), and :data:`SWEEPS` reads them from every file of
:data:`TASKS`. Adding a sweep is an edit to one config file. A run's workdir is
``<root>/<folder>/<run name>/seed<seed>``; ``python -m experiments sweep --list`` lists them.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = ("arithmetic", "length", "lm", "translation", "wmt14_ende")  # the config files that declare sweeps


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
  folder: str  # the sweep's folder under the root: its runs (and, once, the retired report writer's README)

  def workdir(self, run: Run, root: str) -> str:
    return run.workdir(root, self.folder)


def _load() -> dict[str, Sweep]:
  """Every sweep the config files of :data:`TASKS` declare.

  Raises:
    ValueError: for a sweep name declared twice, or two runs of one sweep with the same name and seed.
  """
  out: dict[str, Sweep] = {}
  for task in TASKS:
    for name, s in importlib.import_module(f"configs.{task}").get_sweeps().items():
      if name in out:
        raise ValueError(f"sweep {name!r} of configs/{task}.py is already declared; allowed: one sweep per name")
      runs = tuple(Run(**r) for r in s["runs"])
      if len({(r.name, r.seed) for r in runs}) != len(runs):
        raise ValueError(f"sweep {name!r} has two runs with the same name and seed")
      out[name] = Sweep(name, s["description"], runs, s["folder"] or name)
  return out


SWEEPS: dict[str, Sweep] = _load()


def get(name: str) -> Sweep:
  if name not in SWEEPS:
    raise ValueError(f"unknown sweep {name!r}; allowed: {sorted(SWEEPS)}")
  return SWEEPS[name]
