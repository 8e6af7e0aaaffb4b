"""commdiag step's table: per config, tokens and mode, the step time and the all-reduces' share of it.

Why a share and not only a time: a certified 20% faster all-reduce is worth 20% x share
of a step.  The share is measured, not modelled: ``1 - t(step-compute) / t(step)``,
both from the same launch (the step with its all-reduces removed, against the whole
step), then summarised over launches with its spread.  ``t(step-comm) / t(step)`` (the
all-reduces alone) is shown beside it: when it is larger than the share, part of the
communication overlaps compute or waits less inside the step than it does alone.

Every number comes from per-launch values (the trimmed geometric mean of the launch's
samples, stats.launch_values).  Times are summarised as the gmean over launches, the same
number the sweep table, the report and ``compare`` show for that cell (celltime.py);
shares, a ratio per launch, as the median over launches.  Each with the range and the
launch count.  Which config changes the step time beyond the noise is decided by the
verdicts (stage 2, certify.py), never by this table.

Format history of the JSON table (``commdiag-step-table``):
    1  each number ``{median, lo, hi, launches}``, times and shares alike the median over launches.
    2  each number ``{value, stat, lo, hi, launches}``: ``stat`` "gmean" for times (as every other
       table), "median" for the shares.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from . import celltime, stats
from .report import _fit

STEP_TABLE_VERSION = 2


@dataclass(frozen=True)
class Spread:
    value: float  # the gmean (times) or the median (shares) over launches: ``stat``
    lo: float
    hi: float
    launches: int
    stat: str = "median"

    def text(self, fmt: str = "{:.1f}", scale: float = 1.0) -> str:
        # " to " between the ends: a hyphen reads as a minus beside negative shares ([-49.2% to 26.6%])
        return (fmt.format(self.value * scale) + " [" + fmt.format(self.lo * scale) + " to "
                + fmt.format(self.hi * scale) + f"] n={self.launches}")


@dataclass(frozen=True)
class StepRow:
    config: str
    tokens: int | None
    size_bytes: int
    mode: str
    step_us: Spread
    compute_us: Spread | None
    comm_us: Spread | None
    comm_share: Spread | None     # 1 - compute/step, per launch
    comm_alone: Spread | None     # comm/step, per launch
    tokens_per_s: float | None    # tokens / the step's gmean

    def to_json(self) -> dict:
        return asdict(self)


def _spread(xs: list[float]) -> Spread | None:
    """A share over launches: its median."""
    if not xs:
        return None
    return Spread(stats.median(xs), min(xs), max(xs), len(xs))


def _times(logs: list[float]) -> Spread | None:
    """A time over launches (launch values, ln us): its gmean, as every table shows a time."""
    if not logs:
        return None
    return Spread(celltime.gmean(logs), math.exp(min(logs)), math.exp(max(logs)), len(logs), "gmean")


def step_rows(values: list[stats.LaunchValue], run: dict) -> list[StepRow]:
    """The table from a run's launch values (verdict.run_values)."""
    tokens = {s["bytes"]: s.get("tokens") for s in run["spec"]["sizes"]}
    modes = run["spec"]["modes"]
    by = {(v.config, v.size_bytes, v.mode, v.launch): v.value for v in values}
    launches: dict[tuple, list[int]] = {}
    for v in values:
        launches.setdefault((v.config, v.size_bytes, v.mode), []).append(v.launch)
    rows = []
    configs = [c["name"] for c in run["configs"]]
    for mode in modes:
        for size in sorted(tokens):
            for c in configs:
                ls = sorted(set(launches.get((c, size, mode), ())))
                if not ls:
                    continue
                full = {l: by[(c, size, mode, l)] for l in ls}
                comp = {l: by[k] for l in ls if (k := (c, size, f"{mode}-compute", l)) in by}
                comm = {l: by[k] for l in ls if (k := (c, size, f"{mode}-comm", l)) in by}
                s = _times(list(full.values()))
                tps = tokens[size] / (s.value * 1e-6) if tokens[size] and s.value > 0 else None
                rows.append(StepRow(
                    c, tokens[size], size, mode, s, _times(list(comp.values())), _times(list(comm.values())),
                    _spread([1.0 - math.exp(v - full[l]) for l, v in comp.items()]),
                    _spread([math.exp(v - full[l]) for l, v in comm.items()]), tps))
    return rows


def to_json(rows: list[StepRow]) -> dict:
    return {"format": "commdiag-step-table", "version": STEP_TABLE_VERSION, "rows": [r.to_json() for r in rows]}


def render(rows: list[StepRow], names=str) -> str:
    """The console table, under 100 columns: per row the step's gmean, then the share and what the
    all-reduces alone mean beside it."""
    if not rows:
        return "step: no measured steps yet"
    out = ["step time and the all-reduces' share",
           "  step: gmean [min to max] over n launches; comm share: 1 - compute-only / step per launch, median"]
    width = max(len(r.step_us.text()) for r in rows)
    for mode in dict.fromkeys(r.mode for r in rows):
        out.append(f"  {mode} mode")
        out.append(f"  {'tokens':>6}  {'config':<20} {'step gmean (us)':<{width}} {'tokens/s':>10}")
        for r in (r for r in rows if r.mode == mode):
            tps = f"{r.tokens_per_s:10.0f}" if r.tokens_per_s else f"{'-':>10}"
            out.append(f"  {r.tokens if r.tokens is not None else '-':>6}  {_fit(names(r.config), 20):<20} "
                       f"{r.step_us.text():<{width}} {tps}")
            parts = []
            if r.comm_share:
                parts.append("comm share " + r.comm_share.text("{:.1f}%", 100.0).replace(f" n={r.comm_share.launches}", ""))
            if r.compute_us:
                parts.append(f"compute-only {r.compute_us.value:.1f} us")
            if parts:
                out.append("          " + "; ".join(parts))
            if r.comm_alone:
                out.append(f"          all-reduces alone {r.comm_alone.value * 100:.1f}% of the step"
                           + _alone_meaning(r.comm_alone.value, r.comm_share.value if r.comm_share else None))
    return "\n".join(out)


def _alone_meaning(alone: float, share: float | None) -> str:
    """One line's meaning of the all-reduces alone against the share (docs/step.md)."""
    if share is None or share <= 0:
        return ""
    if abs(alone / share - 1) <= 0.1:
        return ": about what they add: nothing overlaps them"
    if alone > share:
        return ": more than they add: compute hides part of them"
    return ": less than they add: inside the step they run slower"
