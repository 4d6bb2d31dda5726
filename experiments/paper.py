"""Shaw, Uszkoreit and Vaswani (2018), Tables 1-3: the published BLEU of each cell.

This module is the project's one copy of the paper's published numbers (the protocol's tables,
``experiments/tables.py``, set them beside their rows; ``configs/wmt14_ende.py`` holds the config variants that
reproduce each cell, and ``tests/paper_cells.py`` checks that each is the cell it names). Table 2 and 3 cells are
the base model with relative positions only.
"""

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
