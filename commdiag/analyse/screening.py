"""Stage 1 of the verdict method: screening estimates from the interleaved sweep.  Pure, no I/O.

The sweep's trials (at least 3 launches per config, shuffled within each round)
give every config x size x mode, and every config x band x mode, an estimate:
ratio = exp(mean of the config's launch values - mean of default's), with the
launch values themselves beside it.  These are estimates, never verdicts: with 3
launches per config no test can certify anything whatever the noise looks like
(the exact rank test's floor is p = 0.05), and a t interval on 3 launches crowned
noise on CPU (an A/A twin "71% faster" when its launches happened to land in the
fast state three times).

What screening decides is which claims stage 2 (certify.py) tests on fresh
launches: per band in the primary mode, the eligible config with the lowest band
estimate at least 3% faster than default.  Eligible = no failed, timed-out or
incorrect launch and no wrong element anywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .stats import DEFAULT, MIN_EFFECT, NOISE_WARN, LaunchValue, exp, mean, pooled_sd


@dataclass(frozen=True)
class Estimate:
    """A config against default at one size (or one band) and mode, from stage-1 launches."""

    config: str
    mode: str
    size_bytes: int | None  # None for a band
    tokens: int | None
    band: str | None
    time_us: float  # geometric mean of the config's launch values (a band: over its sizes too)
    default_us: float | None
    ratio: float | None  # config / default: < 1 is faster
    launch_us: tuple[float, ...]  # the config's launch values, in launch order
    default_launch_us: tuple[float, ...]
    noise: float | None  # pooled between-launch sd of ln value at this size/band and mode
    eligible: bool

    @property
    def launches(self) -> int:
        return len(self.launch_us)

    @property
    def default_launches(self) -> int:
        return len(self.default_launch_us)

    @property
    def label(self) -> str:
        """Screening wording: an estimate, never "faster"/"slower"."""
        if self.ratio is None:
            return "no default to compare with"
        pct = (self.ratio - 1) * 100
        if abs(self.ratio - 1) < MIN_EFFECT:
            return f"estimate {pct:+.1f}% (within 3%)"
        return f"estimate {pct:+.1f}% ({'lower' if pct < 0 else 'higher'} time; screening, not certified)"

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(launches=self.launches, default_launches=self.default_launches, label=self.label)
        return d


@dataclass(frozen=True)
class Screening:
    modes: tuple[str, ...]
    configs: tuple[str, ...]
    bands: dict
    band_sizes: dict  # band -> sizes (bytes) whose tokens lie in it
    cells: tuple[Estimate, ...]
    band_cells: tuple[Estimate, ...]
    excluded: dict  # config -> why it can never win
    warnings: tuple[str, ...] = field(default=())

    @property
    def primary_mode(self) -> str | None:
        """The mode claims are made in: graph (what CUDA-graph serving runs) when measured."""
        return "graph" if "graph" in self.modes else (self.modes[0] if self.modes else None)

    def band_cell(self, config: str, band: str, mode: str) -> Estimate | None:
        return next((c for c in self.band_cells if c.config == config and c.band == band and c.mode == mode), None)

    def to_json(self) -> dict:
        return {"modes": list(self.modes), "bands": self.bands, "primary_mode": self.primary_mode,
                "excluded": self.excluded, "warnings": list(self.warnings),
                "cells": [c.to_json() for c in self.cells], "band_cells": [c.to_json() for c in self.band_cells]}


def band_text(rng: list) -> str:
    """[1, 64] -> "1-64 tokens", [256, None] -> "256+ tokens"."""
    lo, hi = rng
    if hi is None:
        return f"{lo or 0}+ tokens"
    return f"{lo or 0}-{hi} tokens"


def in_band(tokens: int | None, rng: list) -> bool:
    if tokens is None:
        return False
    lo, hi = rng
    return (lo is None or tokens >= lo) and (hi is None or tokens <= hi)


def band_values(values: list[LaunchValue], sizes: list[int], mode: str) -> dict[str, dict[int, float]]:
    """{config: {launch: band value}}: a launch's mean ln value over ``sizes`` (launches missing a size are left out)."""
    per: dict[str, dict[int, dict[int, float]]] = {}
    want = set(sizes)
    for v in values:
        if v.mode == mode and v.size_bytes in want:
            per.setdefault(v.config, {}).setdefault(v.launch, {})[v.size_bytes] = v.value
    return {c: {l: mean(list(by.values())) for l, by in launches.items() if len(by) == len(want)}
            for c, launches in per.items()}


def screen(values: list[LaunchValue], *, configs: list[str], modes: list[str], tokens_by_size: dict[int, int | None],
           bands: dict[str, list] | None = None, excluded: dict[str, str] | None = None) -> Screening:
    """Screening estimates for every config against default from stage-1 launch values."""
    values = [v for v in values if v.stage == 1]
    bands = dict(bands or {})
    excluded = dict(excluded or {})
    x: dict[tuple[str, int], dict[str, dict[int, float]]] = {}
    for v in values:
        x.setdefault((v.mode, v.size_bytes), {}).setdefault(v.config, {})[v.launch] = v.value
    others = [c for c in configs if c != DEFAULT]
    sizes = sorted({s for (_, s) in x})
    modes = [md for md in modes if any(k[0] == md for k in x)]
    warnings: list[str] = []
    if DEFAULT not in configs:
        warnings.append("no 'default' config in this run: nothing to compare against")

    def estimate(c, md, size, tokens, band, groups: dict[str, dict[int, float]], noise: float | None) -> Estimate:
        xs = [groups[c][l] for l in sorted(groups[c])]
        ys = [groups[DEFAULT][l] for l in sorted(groups[DEFAULT])] if DEFAULT in groups else []
        return Estimate(c, md, size, tokens, band, exp(mean(xs)), exp(mean(ys)) if ys else None,
                        exp(mean(xs) - mean(ys)) if ys else None,
                        tuple(round(exp(v), 4) for v in xs), tuple(round(exp(v), 4) for v in ys),
                        noise, c not in excluded)

    cells = []
    for md in modes:
        noisy = []
        for s in sizes:
            groups = x.get((md, s), {})
            sd = pooled_sd([list(g.values()) for g in groups.values()])
            if sd is not None and sd > NOISE_WARN:
                noisy.append(sd)
            cells += [estimate(c, md, s, tokens_by_size.get(s), None, groups, sd) for c in others if c in groups]
        if noisy:
            warnings.append(f"{md}: launch-to-launch noise {min(noisy) * 100:.0f}-{max(noisy) * 100:.0f}% (sd of ln "
                            f"time) at {len(noisy)} of {len(sizes)} sizes; certifying an effect there needs many "
                            "launches")
    band_sizes = {b: [s for s in sizes if in_band(tokens_by_size.get(s), rng)] for b, rng in bands.items()}
    band_cells = []
    for md in modes:
        for b, bs in band_sizes.items():
            if not bs:
                continue
            groups = {c: g for c, g in band_values(values, bs, md).items() if g}
            sd = pooled_sd([list(g.values()) for g in groups.values()])  # once per band, not per config (racing's simulation)
            band_cells += [estimate(c, md, None, None, b, groups, sd) for c in others if c in groups]
    return Screening(tuple(modes), tuple(configs), bands, band_sizes, tuple(cells), tuple(band_cells), excluded,
                     tuple(warnings))


def candidates(screening: Screening) -> dict[str, Estimate]:
    """Per band in the primary mode: the eligible config with the lowest band estimate at least
    MIN_EFFECT faster than default (band -> its estimate); bands without one are absent."""
    mode = screening.primary_mode
    out = {}
    for b in screening.bands:
        cands = [c for c in screening.band_cells if c.band == b and c.mode == mode and c.eligible
                 and c.ratio is not None and c.ratio <= 1 - MIN_EFFECT]
        if cands:
            out[b] = min(cands, key=lambda c: (c.ratio, c.config))
    return out
