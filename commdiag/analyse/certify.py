"""Stage 2 of the verdict method: confirm the screening's candidates on fresh launches.  Pure, no I/O.

Claims.  Per band in the primary mode, the screening candidate (the eligible
config with the lowest band estimate at least 3% faster than default) is one
claim, tested one-sided ("faster").  Every config the spec names under
``confirm.configs`` is a claim in every band, tested two-sided (faster or
slower: the seed story gets a certified answer either way).  M = the number of
claims, the run's whole family.

Rounds.  k2 fresh rounds; each runs default and every claimed config once, in a
shuffled order.  Stage-1 launches are never reused: they chose the candidates,
and reusing them raised the false rate to 2.4-3.7% in simulation.
k2 = max(6, the fewest launches per arm at which the exact test can reach
ALPHA/M at all).

Test.  The exact Wilcoxon-Mann-Whitney test on the band values of the claimed
config against default's.  Certified faster when p <= ALPHA/M and the
Hodges-Lehmann ratio is <= 0.97; certified slower (two-sided claims) when
p <= ALPHA/M and the ratio is >= 1.03.  Bonferroni over the M claims keeps the
chance of any false certification in a run at or below ALPHA (1%) whatever the
launch noise looks like, because the test is exact for exchangeable launches.

Looks.  ``commdiag confirm --rounds K`` on a confirmed run adds K rounds and
tests again on all stage-2 launches: a second look at data already seen.  Look L
tests at ALPHA/M / 2^(L-1), so however often a run is extended the family-wise
rate stays below 2 x ALPHA; a run confirmed once (the default) keeps ALPHA.

Drift guard.  If default's own stage-2 launches trend with the round index
(Spearman p < 0.05 over at least 5 launches), launches are no longer
exchangeable across rounds: the claim is then judged by the exact within-round
sign-flip test on paired differences instead (it needs 8 rounds to reach 0.005,
i.e. M <= 2), and the line says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from . import stats
from .screening import Estimate, Screening, band_values, candidates
from .stats import ALPHA, DEFAULT, LESS, MIN_EFFECT, MIN_ROUNDS, TWO_SIDED

CONFIRMATION_VERSION = 1
DRIFT_P = 0.05
SANE_LAUNCHES = 30  # beyond this many launches per arm, say plainly that it cannot be certified at a sane cost
FASTER, SLOWER, NOT_CERTIFIED = "faster", "slower", "not certified"


@dataclass(frozen=True)
class Claim:
    """One thing stage 2 tests: ``config`` against default in ``band`` (or at one size) and ``mode``."""

    config: str
    mode: str
    band: str | None
    size_bytes: int | None
    alternative: str  # less (faster only) | two-sided
    reason: str  # screening | confirm.configs | screening, confirm.configs | certify-sizes
    screening_ratio: float | None

    @property
    def where(self) -> str:
        return f"band {self.band}" if self.band is not None else f"{self.size_bytes} B"

    def to_json(self) -> dict:
        return asdict(self)


def plan_claims(screening: Screening, confirm_configs: tuple[str, ...] | list[str] = ()) -> list[Claim]:
    """The stage-2 claims of a screened run (module docstring)."""
    mode = screening.primary_mode
    if mode is None or DEFAULT not in screening.configs:
        return []
    picked = candidates(screening)
    claims = []
    for b in screening.bands:
        cand: Estimate | None = picked.get(b)
        named = [c for c in confirm_configs if screening.band_cell(c, b, mode) is not None]
        if cand is not None and cand.config not in named:
            claims.append(Claim(cand.config, mode, b, None, LESS, "screening", cand.ratio))
        for c in named:
            est = screening.band_cell(c, b, mode)
            reason = "screening, confirm.configs" if cand is not None and cand.config == c else "confirm.configs"
            claims.append(Claim(c, mode, b, None, TWO_SIDED, reason, est.ratio if est else None))
    return claims


def threshold(alpha: float, family: int, look: int = 1) -> float:
    """The p a claim must reach: ALPHA / M at the first look, halved at each later look."""
    return alpha / max(family, 1) / 2 ** (max(look, 1) - 1)


def rounds_needed(claims: list[Claim], alpha: float = ALPHA) -> int:
    """k2 = max(MIN_ROUNDS, the fewest launches per arm at which every claim can reach ALPHA/M)."""
    if not claims:
        return 0
    alt = TWO_SIDED if any(c.alternative == TWO_SIDED for c in claims) else LESS
    return max(MIN_ROUNDS, stats.launches_to_reach(threshold(alpha, len(claims)), alt))


def confirmation_plan(claims: list[Claim], rounds: int | None, screening_launches: int, created: str,
                      alpha: float = ALPHA) -> dict:
    """What run.json records as ``confirmation`` before stage 2 starts."""
    k2 = rounds or rounds_needed(claims, alpha)
    configs = [DEFAULT] + list(dict.fromkeys(c.config for c in claims))
    return {"version": CONFIRMATION_VERSION, "alpha": alpha, "min_effect": MIN_EFFECT,
            "mode": claims[0].mode if claims else None, "claims": [c.to_json() for c in claims],
            "family_size": len(claims), "configs": configs if claims else [],
            "looks": [{"look": 1, "rounds": k2 if claims else 0, "threshold": threshold(alpha, len(claims)),
                       "created_utc": created}],
            "screening_launches": screening_launches}


def add_look(plan: dict, rounds: int, created: str) -> dict:
    """``commdiag confirm --rounds K`` on a confirmed run: K more rounds, tested at a halved threshold."""
    look = len(plan["looks"]) + 1
    plan["looks"].append({"look": look, "rounds": rounds,
                          "threshold": threshold(plan["alpha"], plan["family_size"], look), "created_utc": created})
    return plan


def claims_of(plan: dict) -> list[Claim]:
    return [Claim(**c) for c in plan.get("claims", [])]


# ---------------------------------------------------------------- the test

@dataclass(frozen=True)
class Certification:
    """The stage-2 answer to one claim."""

    claim: Claim
    look: int
    threshold: float
    config_us: tuple[float, ...]  # the claimed config's stage-2 launch values (band: geometric mean over sizes)
    default_us: tuple[float, ...]
    p: float | None
    p_floor: float  # the smallest p attainable with these launch counts
    ratio: float | None  # Hodges-Lehmann: config / default, < 1 faster
    result: str  # faster | slower | not certified
    test: str  # rank (Wilcoxon-Mann-Whitney) | sign-flip (drift)
    noise: float | None  # sd of ln launch value, pooled over the two arms
    states: tuple[float, float] | None  # two launch states, us (default's level)
    launches_needed: int | None  # per arm, for 80% power at this noise
    drift: tuple[float, float] | None  # default's Spearman (rho, p) across rounds
    eligible: bool
    note: str = ""

    @property
    def certified(self) -> bool:
        return self.result in (FASTER, SLOWER)

    @property
    def text(self) -> str:
        c = self.claim
        k = f"{len(self.config_us)} vs {len(self.default_us)} launches"
        if self.p is None:
            return f"not certified: {self.note or 'no stage-2 launches of both configs'}"
        if self.certified:
            pct = abs(self.ratio - 1) * 100
            how = "faster" if self.result == FASTER else "slower"
            tail = "" if self.eligible else " (never a winner: a launch failed or gave wrong sums)"
            return (f"certified {how}: {pct:.1f}% {how} (ratio {self.ratio:.3f}, Hodges-Lehmann), "
                    f"p = {self.p:.2g} <= {self.threshold:.2g} ({self.test} test, {k}){tail}")
        noise = ("launches fall into two states, about {:.4g} and {:.4g} us".format(*self.states) if self.states
                 else f"launch noise {self.noise * 100:.1f}%" if self.noise is not None else "launch noise unknown")
        if self.p <= self.threshold:
            way = "slower" if self.ratio > 1 else "faster"
            return (f"not certified - keep NCCL defaults: {abs(self.ratio - 1) * 100:.1f}% {way} is real "
                    f"(p = {self.p:.2g}) but below the {MIN_EFFECT * 100:.0f}% worth a change ({k})")
        n = len(min(self.config_us, self.default_us, key=len))
        line = (f"not certified - keep NCCL defaults: p = {self.p:.2g} with {n} launches per arm "
                f"(smallest attainable p = {self.p_floor:.2g}, needed <= {self.threshold:.2g}); {noise}")
        if self.launches_needed is not None:
            screened = abs(math.log(c.screening_ratio)) if c.screening_ratio else 0.0
            line += (f"; if the true effect were {max(screened, math.log1p(MIN_EFFECT)) * 100:.0f}% (the screening "
                     f"estimate, at least 3%), about {self.launches_needed} launches per arm would give 80% power "
                     "at this noise")
            if self.launches_needed > SANE_LAUNCHES:
                line += ": an effect this small cannot be certified at a sane cost on this machine"
        if self.note:
            line += f"; {self.note}"
        return line

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(certified=self.certified, text=self.text)
        return d


def test_claim(claim: Claim, xs: dict[int, float], ys: dict[int, float], round_of: dict[int, int], *,
               thr: float, look: int, eligible: bool) -> Certification:
    """One claim from stage-2 launch values (launch -> ln value) of the config (xs) and default (ys)."""
    x = [xs[l] for l in sorted(xs)]
    y = [ys[l] for l in sorted(ys)]
    floor = stats.smallest_p(len(x), len(y), claim.alternative)
    us = lambda vals: tuple(round(math.exp(v), 4) for v in vals)  # noqa: E731
    if not x or not y:
        return Certification(claim, look, thr, us(x), us(y), None, floor, None, NOT_CERTIFIED, "rank", None, None,
                             None, None, eligible, "no usable stage-2 launch of " + ("default" if x else claim.config))
    p = stats.rank_test(x, y, claim.alternative)
    hl = stats.hodges_lehmann(x, y)
    ratio = math.exp(hl)
    test = "rank"
    note = ""
    trend = stats.drift([(round_of[l], v) for l, v in ys.items() if l in round_of]) if round_of else None
    if trend is not None and trend[1] < DRIFT_P:
        by_round_x = {round_of[l]: v for l, v in xs.items() if l in round_of}
        by_round_y = {round_of[l]: v for l, v in ys.items() if l in round_of}
        pairs = [by_round_x[r] - by_round_y[r] for r in sorted(set(by_round_x) & set(by_round_y))]
        p = stats.signflip_test(pairs, claim.alternative)
        floor = (2.0 if claim.alternative == TWO_SIDED else 1.0) / 2 ** len(pairs) if pairs else 1.0
        test = "sign-flip"
        factor = 2.0 if claim.alternative == TWO_SIDED else 1.0
        need = next(n for n in range(1, 64) if factor / 2 ** n <= thr)
        note = (f"default drifted across rounds (Spearman rho {trend[0]:+.2f}, p = {trend[1]:.2g}): judged by the "
                f"exact within-round sign-flip test, which needs {need} or more paired rounds in all at this "
                f"threshold (this run has {len(pairs)}); confirm.rounds: {need} in the spec gets them in one look")
    sd = stats.pooled_sd([x, y])
    mx, my = stats.median(x), stats.median(y)
    states = stats.two_states([v - mx for v in x] + [v - my for v in y])
    # the effect to power for: screening's estimate (independent of these launches), at least the 3% minimum
    screened = abs(math.log(claim.screening_ratio)) if claim.screening_ratio else 0.0
    effect = max(screened, math.log1p(MIN_EFFECT))
    needed = stats.launches_for_power(sd or 0.0, effect, thr, claim.alternative)
    result = NOT_CERTIFIED
    if p <= thr:
        if ratio <= 1 - MIN_EFFECT:
            result = FASTER
        elif ratio >= 1 + MIN_EFFECT and claim.alternative == TWO_SIDED:
            result = SLOWER
    return Certification(claim, look, thr, us(x), us(y), p, floor, ratio, result, test, sd,
                         tuple(round(math.exp(my + s), 4) for s in states) if states else None,
                         None if result != NOT_CERTIFIED else needed, trend, eligible, note)


def certify(plan: dict, values: list[stats.LaunchValue], band_sizes: dict[str, list[int]],
            round_of: dict[int, int], excluded: dict[str, str]) -> list[Certification]:
    """Every claim of ``plan`` tested on the stage-2 launch values (all rounds of all looks so far)."""
    values = [v for v in values if v.stage == 2]
    look = len(plan.get("looks", [])) or 1
    thr = threshold(plan.get("alpha", ALPHA), plan.get("family_size", 0), look)
    out = []
    cache: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    for claim in claims_of(plan):
        if claim.band is not None:
            key = (claim.mode, claim.band)
            if key not in cache:
                cache[key] = band_values(values, band_sizes.get(claim.band, []), claim.mode)
            groups = cache[key]
        else:
            groups = {}
            for v in values:
                if v.mode == claim.mode and v.size_bytes == claim.size_bytes:
                    groups.setdefault(v.config, {})[v.launch] = v.value
        out.append(test_claim(claim, groups.get(claim.config, {}), groups.get(DEFAULT, {}), round_of, thr=thr,
                              look=look, eligible=claim.config not in excluded))
    return out


def band_ratio(values: list[stats.LaunchValue], config: str, mode: str, sizes: list[int]) -> float | None:
    """Hodges-Lehmann ratio of ``config`` against default over ``sizes`` from stage-2 launches."""
    groups = band_values([v for v in values if v.stage == 2], sizes, mode)
    x, y = list(groups.get(config, {}).values()), list(groups.get(DEFAULT, {}).values())
    return math.exp(stats.hodges_lehmann(x, y)) if x and y else None


# ---------------------------------------------------------------- per-size certification (one stage)

def size_claims_needed(configs: int, sizes: int, alpha: float = ALPHA) -> tuple[int, int]:
    """(family size, launches per config) for one-stage per-size certification of every config x size."""
    m = max(1, configs * sizes)
    return m, stats.launches_to_reach(alpha / m, TWO_SIDED, 3)


def certify_sizes(screening: Screening, values: list[stats.LaunchValue], alpha: float = ALPHA / 2
                  ) -> list[Certification]:
    """``--certify-sizes``: every config x size in the primary mode tested two-sided on all stage-1
    launches at once (no screening selection, so no fresh launches needed), Bonferroni over them all.
    The run's 1% is split: half for this family, half for stage 2's band claims (sweep._plan_stage2),
    so that any false certification in the run stays at or below 1%."""
    mode = screening.primary_mode
    values = [v for v in values if v.stage == 1 and v.mode == mode]
    by: dict[int, dict[str, dict[int, float]]] = {}
    for v in values:
        by.setdefault(v.size_bytes, {}).setdefault(v.config, {})[v.launch] = v.value
    cells = [(s, c) for s in sorted(by) for c in screening.configs if c != DEFAULT and c in by[s]]
    thr = alpha / max(len(cells), 1)
    out = []
    for s, c in cells:
        est = next((e for e in screening.cells if e.config == c and e.size_bytes == s and e.mode == mode), None)
        claim = Claim(c, mode, None, s, TWO_SIDED, "certify-sizes", est.ratio if est else None)
        out.append(test_claim(claim, by[s][c], by[s].get(DEFAULT, {}), {}, thr=thr, look=1,
                              eligible=c not in screening.excluded))
    return out
