"""``commdiag trace --sweep reports/RUN``: what the run's certified winner of each size band would save of
the traced step, at most.

A setting that makes the all-reduce of a band (1 - ratio) faster shortens the step by at most
(1 - ratio) x the share of the step spent in all-reduces of that band's sizes: only NCCL kernel time
shrinks, and of it only what was exposed (not overlapped with compute) shortens the step, so the
bound uses all of it and is an upper bound.  The ratio is the winner's certified stage-2
Hodges-Lehmann ratio (config time / default time, analyse/verdict.py), in the run's primary mode.
A trace size belongs to a band when it lies within the sizes the sweep measured in that band (bytes);
sizes outside every band are named, not guessed.  A band without a certified winner saves nothing:
keep NCCL's defaults.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from .result import Saving, TraceReport


@dataclass(frozen=True)
class SweepBands:
    """What --sweep reads of a run folder: per band its measured sizes and its certified winner."""

    path: str
    mode: str | None
    band_sizes: dict  # band -> sorted sizes (bytes) measured in it
    winners: dict  # band -> verdict.Winner
    status: str


def load(run_dir: str | Path) -> SweepBands:
    """The run's verdicts (results.load_run + verdict.evaluate_run); CommdiagError for a bad folder."""
    from ..analyse import verdict
    from ..formats import results

    data = results.load_run(run_dir)
    v = verdict.evaluate_run(data)
    mode = v.primary_mode
    return SweepBands(str(run_dir), mode, {b: sorted(s) for b, s in v.screening.band_sizes.items()},
                      {w.band: w for w in v.band_winners if w.mode == mode}, v.status)


def savings(rep: TraceReport, sweep: SweepBands) -> list[Saving]:
    out = []
    placed: set = set()
    for band, sizes in sweep.band_sizes.items():
        if not sizes:
            continue
        lo, hi = sizes[0], sizes[-1]
        shares, in_band, unknown = [], set(), 0.0
        for r in rep.ranks:
            total = sum(s.split.step_us for s in r.steps)
            ar = [z for z in r.sizes if z.collective == "AllReduce"]
            band_us = sum(z.total_us for z in ar if z.bytes is not None and lo <= z.bytes <= hi)
            unknown = max(unknown, sum(z.total_us for z in ar if z.bytes is None) / total if total else 0.0)
            in_band |= {z.bytes for z in ar if z.bytes is not None and lo <= z.bytes <= hi}
            shares.append(band_us / total if total else 0.0)
        placed |= in_band
        share = statistics.fmean(shares) if shares else 0.0
        w = sweep.winners.get(band)
        note = ""
        if unknown > 0:
            note = (f"{unknown:.0%} of the step is all-reduce of unknown size (graph replays): if all of it were "
                    f"in this band, at most {(1 - w.ratio) * unknown:.1%} more" if w and w.config else
                    f"{unknown:.0%} of the step is all-reduce of unknown size (graph replays)")
        if w is None or w.config is None or w.ratio is None:
            out.append(Saving(band, sweep.mode or "?", None, None, tuple(sorted(in_band)), share, 0.0,
                              note or "no certified winner in this band: keep NCCL defaults"))
        else:
            out.append(Saving(band, sweep.mode or "?", w.config, w.ratio, tuple(sorted(in_band)), share,
                              max(0.0, 1 - w.ratio) * share, note))
    return out


def outside(rep: TraceReport, sweep: SweepBands) -> list[int]:
    """The trace's all-reduce sizes (bytes) that no band of the sweep measured."""
    bands = [(s[0], s[-1]) for s in sweep.band_sizes.values() if s]
    sizes = {z.bytes for r in rep.ranks for z in r.sizes if z.collective == "AllReduce" and z.bytes is not None}
    return sorted(b for b in sizes if not any(lo <= b <= hi for lo, hi in bands))
