"""Shaw, Uszkoreit and Vaswani (2018), Tables 1-3: the paper's BLEU for the cell a run config describes.

This module is the project's one copy of the paper's published numbers (the protocol's tables,
``experiments/tables.py``, set them beside their rows), and maps a run's flat config to the cell it is
(``configs/wmt14_ende.py`` holds the config variants that reproduce each cell). Table 2 and 3 cells are the base
model with relative positions only.
"""

from __future__ import annotations

from typing import Mapping, Optional


__all__ = ["BASE_K", "TABLE1", "TABLE2", "TABLE3", "TABLES", "lookup"]
TABLES = ("table1", "table2", "table3")
# Shaw et al. (2018), Tables 1-3: BLEU on WMT14 EN-DE (arXiv 1803.02155).
# Table 1: (model preset, position information) -> newstest2014.
TABLE1 = {("base", "absolute"): 26.5, ("base", "relative"): 26.8,
          ("big", "absolute"): 27.9, ("big", "relative"): 29.2}
# Table 2: clipping distance k -> newstest2013 (base, no absolute encodings).
TABLE2 = {0: 12.5, 1: 25.5, 2: 25.8, 4: 25.9, 16: 25.8, 64: 25.9, 256: 25.8}
# Table 3: (a^V used, a^K used) -> newstest2013 (base, k = 16).
TABLE3 = {(True, True): 25.8, (False, True): 25.8, (True, False): 25.3, (False, False): 12.5}
BASE_K = 16  # Shaw's base model clips at k = 16 (Table 3's setting)


def _on(config: Mapping, key: str) -> bool:
  return config.get(key) is not False  # None: the preset's, which is on


def lookup(table: str, config: Mapping) -> Optional[float]:
  """The paper's BLEU for the cell of ``table`` that the run config ``config`` is, or None.

  Args:
    table: one of :data:`TABLES`.
    config: a run config flat by leaf name (:func:`experiments.runs.flatten`): ``position``, ``d_model``, ...

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
