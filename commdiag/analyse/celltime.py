"""The one time commdiag shows per config x size x mode: its definition, its name, its legend.  Pure.

The verdicts' unit is the launch value: one launch's 5%-trimmed geometric mean of its
iterations (stats.launch_values).  A cell's time is the **gmean**: the geometric mean
of its usable launches' values, shown with the lowest and highest launch value and the
number of launches.  The sweep table, the report's timings table and plots, ``compare``'s
A and B columns and the step table all show this number under this name, so the same
cell never reads two different times.  (summary.csv keeps its own, named column,
``median_us``, the median of the launches' medians: docs/formats.md.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .stats import LaunchValue

# The header word and the one-line legend every table that shows a gmean prints with it.
NAME = "gmean"
LEGEND = ("gmean: geometric mean over launches of each launch's value (the 5%-trimmed geometric mean of its "
          "iterations); min-max: the lowest and highest launch value")


@dataclass(frozen=True)
class CellTime:
    """A cell's gmean (us) with the range of its launch values and their count."""

    us: float
    lo_us: float
    hi_us: float
    launches: int


def gmean(logs) -> float:
    """The geometric mean of values given as natural logs (launch values are ln(us))."""
    logs = list(logs)
    return math.exp(min(sum(logs) / len(logs), 700.0))


def cell_times(values: list[LaunchValue]) -> dict[tuple[str, int, str], CellTime]:
    """(config, size_bytes, mode) -> CellTime over every launch value given (both stages)."""
    by: dict[tuple[str, int, str], list[float]] = {}
    for v in values:
        by.setdefault((v.config, v.size_bytes, v.mode), []).append(v.value)
    return {k: CellTime(gmean(xs), math.exp(min(xs)), math.exp(max(xs)), len(xs)) for k, xs in by.items()}
