"""Shaw, Uszkoreit and Vaswani (2018), Tables 1-3: BLEU on WMT14 EN-DE (arXiv 1803.02155).

``lookup(table, config)`` gives the paper's number for the cell a run config
describes (or None), so a report can print it beside the measured value.
Table 2 and 3 cells are the base model with relative positions only;
the CPU-scale sweeps reuse their numbers as the shape to compare against.
"""

from __future__ import annotations

from typing import Mapping, Optional

# (model preset, position information) -> BLEU on newstest2014.
TABLE1 = {("base", "absolute"): 26.5, ("base", "relative"): 26.8,
          ("big", "absolute"): 27.9, ("big", "relative"): 29.2}
# Clipping distance k -> BLEU on newstest2013 (base, no absolute encodings).
TABLE2 = {0: 12.5, 1: 25.5, 2: 25.8, 4: 25.9, 16: 25.8, 64: 25.9, 256: 25.8}
# (a^V used, a^K used) -> BLEU on newstest2013 (base, k = 16).
TABLE3 = {(True, True): 25.8, (False, True): 25.8, (True, False): 25.3, (False, False): 12.5}
TABLES = ("table1", "table2", "table3")
# Shaw's base model clips at k = 16 (Table 3's setting).
BASE_K = 16


def _on(config: Mapping, key: str) -> bool:
  return config.get(key) is not False  # None: the preset's, which is on


def lookup(table: str, config: Mapping) -> Optional[float]:
  """The paper's BLEU for the cell of ``table`` that the run config ``config`` is, or None.

  ``config`` is flat by leaf name (:func:`experiments.report.flatten`): ``position``, ``d_model``, ...
  """
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
  if table == "table3":
    return TABLE3[(_on(config, "use_values"), _on(config, "use_keys"))]
  raise ValueError(f"unknown paper table {table!r}; allowed: {list(TABLES)}")
