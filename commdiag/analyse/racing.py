"""Racing: which configs screening stops launching, after a trial, because they clearly lose.  Pure, no I/O.

Screening (stage 1) launches every config once per trial.  A config that the trials so far already
show far slower than default in every band and every mode cannot become a stage-2 candidate (a
candidate is the lowest band estimate at least 3% *faster* than default, screening.candidates), so
its remaining screening launches measure nothing the verdicts use.  ``decide`` names those configs
with the reason; the sweep gives their remaining stage-1 launches the status ``dropped``.

Why this cannot make a false claim: certified claims come only from stage 2's fresh rounds
(certify.py), which racing never touches; dropping a config only removes a possible claim.  What it
can do is lose a winner: a config that would have been certified, dropped because its first launches
landed slow.  The rule is built so that this is rare, and the simulation (tests/test_racing.py, fast;
benchmarks/racing_simulation.py, full, numbers in benchmarks/README.md) bounds it at 1% of runs
under every launch-noise model the verdict simulations use:

- a config is dropped only when, in **every** band and every mode screened, ln(config / default)
  exceeds both ``Z`` standard errors and ln(1 + ``MIN_LOSS``); a config faster anywhere stays;
- the standard error is the launch noise x sqrt(1/n + 1/n_default).  From two launches per config on,
  the noise is screening's pooled between-launch sd of that band and mode.  After the first trial
  (one launch each) no within-config spread exists; the spread *between* configs stands in
  (the sd of every config's value, default included): it holds the launch noise plus every real
  effect, so it can only overstate the noise, which makes drops rarer;
- default and the spec's ``confirm.configs`` are never dropped (their claims are made regardless of
  screening), nor is a config with a band or mode that has no value yet (nothing to judge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .screening import Estimate, Screening
from .stats import DEFAULT

Z = 4.0  # standard errors a loss must exceed: 4 sd of a normal is 3e-5 one-sided, before the every-band rule
MIN_LOSS = 0.25  # and at least 25% slower: a loss of 10% is one rare slow launch (rare-slow model), never "clear"
MIN_CONFIGS_FOR_SPREAD = 5  # the between-config spread stands in for the noise only with this many configs


@dataclass(frozen=True)
class Drop:
    """A config screening stops launching: after which trial, and why (its weakest band/mode)."""

    config: str
    after_trial: int
    reason: str
    margin: float  # the smallest ln(config/default) / standard error over its bands and modes

    def to_json(self) -> dict:
        return {"config": self.config, "after_trial": self.after_trial, "reason": self.reason,
                "margin_se": round(self.margin, 2)}


def _spread_noise(cells: list[Estimate]) -> float | None:
    """After one launch each: the between-config spread (sd of ln value, default included) of one band/mode.
    Not a median absolute deviation: with two launch states (60% of 2x H200 eager launches 1.7x slower)
    most values sit in one state, the MAD comes out near 0 and a config in the other state looks like a
    loser (benchmarks/racing_simulation.py dropped the winner in 0.6% of runs that way)."""
    if len(cells) + 1 < MIN_CONFIGS_FOR_SPREAD or cells[0].default_us is None:
        return None
    vals = [math.log(c.time_us) for c in cells] + [math.log(cells[0].default_us)]
    mid = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mid) ** 2 for v in vals) / (len(vals) - 1))
    return sd if sd > 0 else None


def decide(scr: Screening, *, after_trial: int, protected=(), already=()) -> list[Drop]:
    """The configs to stop launching after ``after_trial`` trials of screening ``scr`` (screening.screen of
    the stage-1 launches so far).  ``protected``: never dropped (confirm.configs); ``already``: dropped
    earlier (not repeated)."""
    cells = list(scr.band_cells) or list(scr.cells)  # a spec without bands: every size is its own band
    if not cells:
        return []
    key = (lambda c: (c.band, c.mode)) if scr.band_cells else (lambda c: (c.size_bytes, c.mode))
    groups: dict[tuple, list[Estimate]] = {}
    for c in cells:
        groups.setdefault(key(c), []).append(c)
    spread = {k: _spread_noise(g) for k, g in groups.items()}
    skip = {DEFAULT, *protected, *already}
    drops = []
    for config in scr.configs:
        if config in skip:
            continue
        worst: tuple[float, str] | None = None
        for k, group in groups.items():
            cell = next((c for c in group if c.config == config), None)
            if cell is None or cell.ratio is None or cell.default_launches == 0:
                worst = None
                break
            within = cell.launches >= 2 and cell.default_launches >= 2 and cell.noise
            sd = cell.noise if within else spread[k]
            if not sd:
                worst = None
                break
            se = sd * math.sqrt(1 / cell.launches + 1 / cell.default_launches)
            loss = math.log(cell.ratio)
            if loss <= max(Z * se, math.log1p(MIN_LOSS)):
                worst = None
                break
            where = f"{cell.band or f'{cell.size_bytes} B'} {cell.mode}"
            if worst is None or loss / se < worst[0]:
                worst = (loss / se, f"{where} {cell.ratio:.2f}x default ({loss / se:.1f} se; noise sd "
                                    f"{sd:.3f} {'within configs' if within else 'between configs'})")
        if worst is not None:
            drops.append(Drop(config, after_trial, (
                f"dropped after screening trial {after_trial}: slower than default by more than {Z:g} standard "
                f"errors and {MIN_LOSS:.0%} in every band and mode (closest: {worst[1]}); it cannot become a "
                "stage-2 candidate"), worst[0]))
    return drops


def notes(run: dict) -> list[str]:
    """What the verdicts (CLI and report.html) say about racing: each dropped config, when and why, and
    the launches it saved; nothing for a run without it."""
    looks = (run.get("racing") or {}).get("looks") or []
    dropped = [d for lk in looks for d in lk.get("dropped", [])]
    if not dropped:
        return []
    saved = sum(1 for l in run.get("launches", []) if l.get("status") == "dropped")
    out = [f"racing: {len(dropped)} config(s) no longer launched in screening, {saved} launch(es) saved; "
           "certified claims come only from stage 2's fresh rounds, so this changes no claim's test"]
    out += [f"  {d['config']}: {d['reason']}" for d in dropped]
    return out
