"""The test suite's map from a run config to the cell of Shaw et al.'s Tables 1-3 it is (experiments/paper.py holds
the paper's numbers): the oracle that checks the WMT14 and CPU-scale sweeps train the paper's cells."""

from __future__ import annotations

from typing import Mapping, Optional

from experiments.paper import TABLE1, TABLE2, TABLE3, TABLES


def _on(config: Mapping, key: str) -> bool:
  return config.get(key) is not False  # None: the preset's, which is on


def lookup(table: str, config: Mapping) -> Optional[float]:
  """The paper's BLEU for the cell of ``table`` that the run config ``config`` is, or None.

  Args:
    table: one of :data:`TABLES`.
    config: a run config flat by leaf name (``experiments.runs.flatten``): ``position``, ``d_model``, ...

  Raises:
    ValueError: for a table the paper does not have.
  """
  if table not in TABLES:
    raise ValueError(f"unknown paper table {table!r}; allowed: {list(TABLES)}")
  relative = config.get("position") == "shaw"
  if table == "table1":
    pe = "relative" if relative else "absolute" if config.get("position") == "sinusoidal" else None
    # The paper's widths name their row; any other (CPU-scale) model is set beside the base row.
    size = {512: "base", 1024: "big"}.get(config.get("d_model"), config.get("preset") or "base")
    return TABLE1.get((size, pe))
  if not relative:
    return None
  if table == "table2":
    if not (_on(config, "use_keys") and _on(config, "use_values")):
      return None
    return TABLE2.get(config.get("max_distance"))
  return TABLE3[(_on(config, "use_values"), _on(config, "use_keys"))]
