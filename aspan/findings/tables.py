"""The names of the summary.json tables by which the findings recognise a study's run directory; the studies write
their tables under these names (so a study imports them from here, and the findings import nothing of the studies)."""
from __future__ import annotations

ABC_TABLE = "exact accuracy, mean over seeds [95 % interval], held-out test sets"  # `aspan study abc` (aligned)
ABC_TABLE_SD = "exact accuracy (mean ± sd over seeds), held-out test sets"  # its name in runs written before intervals
ABC_PAPER_TABLE = "exact accuracy, mean over seeds [pooled Wilson 95 %] (paper)"  # `aspan study abc --protocol paper`
