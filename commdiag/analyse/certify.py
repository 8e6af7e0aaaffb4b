"""Stage 2 of the verdict method: confirm the screening's candidates on fresh launches.  Pure, no I/O.

Claims.  Per band in the primary mode, the screening candidate (the eligible
config with the lowest band estimate at least 3% faster than default) is one
claim, tested one-sided ("faster").  Every config the spec names under
``confirm.configs`` is a claim in every band, tested two-sided (faster or
slower: the seed story gets a certified answer either way).  M = the number of
claims, the run's whole family.

Rounds.  k2 fresh rounds; each runs default and every claimed config once, in a
shuffled order (measure/sweep.py ``_add_rounds``).  Stage-1 launches are never
reused: they chose the candidates, and reusing them raised the false rate to
2.4-3.7% in simulation.  The floor is the fewest rounds at which every claim's test
can reach the first look's ALPHA/2/M at all (paired.rounds_to_reach: 2^-k <=
ALPHA/2/M one-sided, 2 x 2^-k two-sided); k2 = the floor + SPARE_ROUNDS.  A fixed ``confirm.rounds`` (or ``confirm
--rounds``) below that cannot certify: the claims it cannot reach are "not
certifiable with this plan" and their configs are not launched at all.

Test.  The one the randomization supports (paired.py): per complete round,
d = ln(config's band value) - ln(default's), the exact Wilcoxon signed-rank test
on the d's, and the Hodges-Lehmann estimate of the d's (with its exact interval)
as the ratio, from the same rounds.  Certified faster when p <= the look's threshold
(ALPHA/2/M at the first) and the ratio is <= 0.97; certified slower (two-sided
claims) when p <= it and the ratio is >= 1.03.  A round missing either launch (failed, timed out, wrong sums)
is left out and counted.  Bonferroni over the M claims keeps the chance of any
false certification in a run at or below ALPHA (1%): under no effect each d is
symmetric about 0 because the order inside its round was a fair shuffle, whatever
the machine did between rounds or at a position inside a round.

Looks.  ``commdiag confirm --rounds K`` on a confirmed run adds K rounds and
tests again on all stage-2 rounds: a further look at data already seen.  The
looks spend alpha/2, alpha/4, ...: the first look that can certify tests each
claim at ALPHA/2/M, every later one at half of what is left (next_threshold),
so the chance of any false certification over any number of looks is at most
ALPHA/2 + ALPHA/4 + ... < ALPHA.  A look whose rounds could not reach its
threshold at all spent nothing.  run.json records each look's threshold and
``alpha_spent`` (threshold x M).  Plans of confirmation version 2 spent all of
ALPHA at their first look: a further look is refused.

Spare rounds.  k2 = the floor + SPARE_ROUNDS (2): at the floor only every
round complete and of one sign certifies.

Failures.  A launch that failed, timed out or gave wrong sums is evidence against
its config: it stands in as twice the worst value either arm reached
(paired.with_failures), so a config whose slow launches time out is not judged on
its good ones.  Only a round where both failed is left out.

Typical launch and tails.  The test compares the typical launch (within-round
log-ratios: a rare 3x slower launch is one round of one sign).  A config certified
faster that way is still not certified when its arithmetic mean time over the same
rounds is not below default's: its launches show a tail default's do not (the
rare slow launch is the one a serving box feels).  This check only withholds
certifications, so it costs the 1% nothing; its price is power, measured in
docs/verdicts.md.

Format.  The plan is run.json's ``confirmation`` block, version 2 with
``test: paired-signed-rank``.  Version 1 plans (the unpaired rank test) carry
rounds too and are judged again the paired way (verdict.py says so).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import asdict, dataclass
from functools import cached_property

from . import paired, stats
from .screening import Estimate, Screening, band_values, candidates
from .stats import ALPHA, DEFAULT, LESS, MIN_EFFECT, TWO_SIDED

# 2: the paired test; 3: looks spend alpha/2, alpha/4, ... (each look's ``alpha_spent``, the plan's
# ``alpha_spending``) and the rounds are the floor plus SPARE_ROUNDS
CONFIRMATION_VERSION = 3
SPARE_ROUNDS = 2  # stage-2 rounds planned beyond the floor (rounds_needed)
SPENDING = "alpha/2 at the first look that can certify, alpha/4 at the next, ...: any number of looks within alpha"
PAIRED_TEST = "paired-signed-rank"  # the confirmation block's ``test`` (version 1 had none: unpaired rank test)
PAIRED = "paired signed-rank"  # Certification.test
SANE_LAUNCHES = 30  # beyond this many launches per arm, say plainly that it cannot be certified at a sane cost
FASTER, SLOWER, NOT_CERTIFIED = "faster", "slower", "not certified"
SIZES_REASON = "certify-sizes"  # Claim.reason of --certify-sizes' per-size claims (stage 1, paired by trial)
# Trials --certify-sizes plans beyond the paired test's floor.  Stage 1 is never extended, and at the
# floor only every trial complete and of one sign reaches the threshold: one failed default launch
# would leave every per-size claim of the run unreachable.  Two spare trials take a lost trial and a
# small one of the other sign (or two lost), and the power grows with them.
SIZES_SPARE_TRIALS = 2
WIDTH = 100  # every printed line fits this


@dataclass(frozen=True)
class Claim:
    """One thing stage 2 tests: ``config`` against default in ``band`` (or at one size) and ``mode``."""

    config: str
    mode: str
    band: str | None
    size_bytes: int | None
    alternative: str  # less (faster only) | two-sided
    reason: str  # screening | confirm.configs | screening, confirm.configs | certify-sizes (SIZES_REASON)
    screening_ratio: float | None

    @property
    def where(self) -> str:
        return f"band {self.band}" if self.band is not None else f"{self.size_bytes} B"

    @property
    def label(self) -> str:
        """How a console line names the claim: "seed vs default, decode band (graph)"."""
        where = f"{self.band} band" if self.band is not None else f"at {self.size_bytes} B"
        return f"{self.config} vs default, {where} ({self.mode})"

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
    """The p a claim must reach at the ``look``-th look that spends: alpha / 2^look / M (module
    docstring: alpha/2, alpha/4, ... sum to alpha however many looks there are)."""
    return alpha / max(family, 1) / 2 ** max(look, 1)


def reachable(claim: Claim, rounds: int, thr: float) -> bool:
    """Can ``rounds`` rounds of the paired test reach ``thr`` for this claim at all?"""
    return paired.smallest_p(rounds, claim.alternative) <= thr


def rounds_floor(claims: list[Claim], alpha: float = ALPHA) -> int:
    """The fewest rounds at which every claim's paired test can reach the first look's threshold."""
    if not claims:
        return 0
    thr = threshold(alpha, len(claims))
    return max(paired.rounds_to_reach(thr, c.alternative) for c in claims)


def rounds_needed(claims: list[Claim], alpha: float = ALPHA) -> int:
    """k2 = the floor (``rounds_floor``) plus SPARE_ROUNDS: at the floor only every round complete and of
    one sign certifies, so one lost launch or one small round of the other sign left the claim unreachable."""
    floor = rounds_floor(claims, alpha)
    return floor + SPARE_ROUNDS if floor else 0


def confirmation_plan(claims: list[Claim], rounds: int | None, screening_launches: int, created: str,
                      alpha: float = ALPHA) -> dict:
    """What run.json records as ``confirmation`` before stage 2 starts.  ``rounds``: a fixed number
    (confirm.rounds, confirm --rounds), else k2; claims it cannot reach get no launches."""
    needed = rounds_needed(claims, alpha)
    k2 = rounds or needed
    thr = threshold(alpha, len(claims))
    can = [c for c in claims if reachable(c, k2, thr)]
    configs = [DEFAULT] + list(dict.fromkeys(c.config for c in can)) if can else []
    return {"version": CONFIRMATION_VERSION, "test": PAIRED_TEST, "alpha": alpha, "min_effect": MIN_EFFECT,
            "alpha_spending": SPENDING,
            "mode": claims[0].mode if claims else None, "claims": [c.to_json() for c in claims],
            "family_size": len(claims), "configs": configs, "rounds_needed": needed,
            "rounds_requested": rounds,
            "looks": [{"look": 1, "rounds": k2 if can else 0, "threshold": thr, "created_utc": created,
                       "alpha_spent": thr * len(claims) if can else 0.0}],
            "screening_launches": screening_launches}


def total_rounds(plan: dict, looks: int | None = None) -> int:
    """Rounds planned over the first ``looks`` looks (all by default)."""
    return sum(lk["rounds"] for lk in plan.get("looks", [])[:looks])


def look_spent(plan: dict, look: int) -> bool:
    """Could look ``look`` (1-based) certify anything: did its rounds in all reach its threshold?"""
    lk = plan["looks"][look - 1]
    rounds = total_rounds(plan, look)
    return any(reachable(c, rounds, lk["threshold"]) for c in claims_of(plan))


def alpha_spent(plan: dict) -> float:
    """The family-wise error the plan's looks have spent: threshold x M for every look that could
    certify (a look that could not reach its threshold spent nothing)."""
    m = max(plan.get("family_size", 0), 1)
    return sum(lk["threshold"] * m for i, lk in enumerate(plan.get("looks", [])) if look_spent(plan, i + 1))


def next_threshold(plan: dict) -> float:
    """The threshold of the next look: half of what is left of alpha, over the M claims (module docstring).
    A plan of confirmation version 2 spent all of alpha at its first look (the rule was alpha/M, then
    halves): what is left is 0, and a further look is refused (sweep._check_further_look)."""
    left = max(plan.get("alpha", ALPHA) - alpha_spent(plan), 0.0)
    return left / 2 / max(plan.get("family_size", 0), 1)


def add_look(plan: dict, rounds: int, created: str) -> dict:
    """``commdiag confirm --rounds K`` on a confirmed run: K more rounds, tested at ``next_threshold``; the
    configs launched are those of the claims the rounds in all can reach."""
    thr = next_threshold(plan)
    plan["looks"].append({"look": len(plan["looks"]) + 1, "rounds": rounds, "threshold": thr,
                          "created_utc": created})
    total = total_rounds(plan)
    can = [c for c in claims_of(plan) if reachable(c, total, thr)]
    plan["looks"][-1]["alpha_spent"] = thr * max(plan.get("family_size", 0), 1) if can else 0.0
    plan["alpha_spending"] = plan.get("alpha_spending", SPENDING)
    plan["configs"] = [DEFAULT] + list(dict.fromkeys(c.config for c in can)) if can else []
    return plan


def claims_of(plan: dict) -> list[Claim]:
    return [Claim(**c) for c in plan.get("claims", [])]


def unreachable(plan: dict) -> list[Claim]:
    """The claims the plan's rounds in all cannot certify at its current threshold."""
    looks = plan.get("looks", [])
    if not looks:
        return claims_of(plan)
    total, thr = total_rounds(plan), looks[-1]["threshold"]
    return [c for c in claims_of(plan) if not reachable(c, total, thr)]


# ---------------------------------------------------------------- the test

def decide(p: float, ratio: float, thr: float, alternative: str) -> str:
    """Faster, slower or not certified: p <= thr and the ratio beyond the 3% rule (slower: two-sided only)."""
    if p <= thr:
        if ratio <= 1 - MIN_EFFECT:
            return FASTER
        if ratio >= 1 + MIN_EFFECT and alternative == TWO_SIDED:
            return SLOWER
    return NOT_CERTIFIED


@dataclass(frozen=True)
class Certification:
    """The answer to one claim: stage 2's, paired by round; ``--certify-sizes``' per-size claims, from
    stage 1, paired by trial (``rounds`` are then trials).  ``test`` unpaired: only in verdicts written
    before either was paired."""

    claim: Claim
    look: int
    threshold: float
    config_us: tuple[float, ...]  # the config's values used (paired: its complete rounds, in round order; band:
    default_us: tuple[float, ...]  # geometric mean over sizes), and default's from the same rounds
    p: float | None
    p_floor: float  # the smallest p attainable with these rounds (launch counts)
    ratio: float | None  # Hodges-Lehmann: config / default, < 1 faster
    result: str  # faster | slower | not certified
    test: str  # paired signed-rank
    noise: float | None  # sd of the round (trial) log-ratios
    states: tuple[float, float] | None  # two launch states, us (default's level)
    drift: tuple[float, float] | None  # default's Spearman (rho, p) across rounds: reported, never a switch
    eligible: bool
    note: str = ""
    rounds: int | None = None  # paired: complete rounds (both launches usable)
    dropped: int = 0  # paired: planned rounds left out (a launch missing, failed or unusable)
    zeros: int = 0  # paired: complete rounds whose log-ratio is 0 (no sign; left out of p)
    ratio_ci: tuple[float, float] | None = None  # exact interval of the ratio at ``ci_level``
    ci_level: float | None = None
    plan_reaches: bool = True  # the plan's rounds can reach ``threshold`` at all ("not certifiable with this plan")
    rounds_to_certify: int | None = None  # complete rounds that could reach the threshold (of a further look)
    next_threshold: float | None = None
    failed: int = 0  # paired: rounds whose config launch failed (counted as its worst value: paired.with_failures)
    default_failed: int = 0  # paired: rounds whose default launch failed (likewise, the other way)
    mean_ratio: float | None = None  # the config's arithmetic mean time over the rounds / default's
    tail: bool = False  # faster on the typical launch, but a tail made its mean time no lower: not crowned

    @property
    def certified(self) -> bool:
        return self.result in (FASTER, SLOWER)

    @property
    def reachable(self) -> bool:
        return self.plan_reaches

    @cached_property
    def launches_needed(self) -> int | None:
        """Not certified: launches per arm (rounds) for 80% power if the true effect were the screening
        estimate (computed on demand: a simulation for few rounds).  None: no noise measured, or the
        estimate is within the 3% rule, where no number of rounds gets 80%."""
        if self.certified or self.noise is None or self.p is None:
            return None
        effect = self._screened
        if effect <= paired.FASTER_EDGE:
            return None
        return paired.rounds_for_power(self.noise, effect, self.threshold, self.claim.alternative)

    @property
    def _unit(self) -> str:
        """What was paired: stage 2's rounds, or stage 1's trials (--certify-sizes)."""
        return "trial" if self.claim.reason == SIZES_REASON else "round"

    @property
    def _screened(self) -> float:
        r = self.claim.screening_ratio
        return abs(math.log(r)) if r else 0.0

    @property
    def headline(self) -> str:
        """The answer in plain words."""
        tail = "" if self.eligible else " (never a winner: a launch failed or gave wrong sums)"
        if self.certified:
            return f"certified {abs(self.ratio - 1) * 100:.1f}% {self.result}{tail}"
        if self.result == NOT_CERTIFIED and self.failed > self.default_failed and self.p is not None \
                and self.p <= self.threshold and self.ratio <= 1 - MIN_EFFECT:
            return (f"not certified, keep NCCL defaults: faster on its good launches, but it failed more often "
                    f"than default ({self.failed} against {self.default_failed})")
        if self.tail:
            return (f"not certified, keep NCCL defaults: {abs(self.ratio - 1) * 100:.1f}% faster on the typical "
                    f"launch, but its mean time is {(self.mean_ratio - 1) * 100:+.1f}% (rare slow launches)")
        if self.p is not None and self.p <= self.threshold:
            way = "slower" if self.ratio > 1 else "faster"
            return (f"not certified, keep NCCL defaults: {abs(self.ratio - 1) * 100:.1f}% {way} is real but below "
                    f"the {MIN_EFFECT * 100:.0f}% worth a change")
        if not self.reachable:
            return "not certifiable with this plan, keep NCCL defaults"
        return "not certified, keep NCCL defaults"

    @property
    def details(self) -> list[str]:
        """The statistics behind the headline, one phrase each."""
        if self.p is None:
            out = [self.note or "no complete round of both configs"]
            return out if self.reachable else out + [self._unreachable()]
        out = [self._evidence()]
        if not self.certified and not self.reachable:
            out.append(self._unreachable())
        elif not self.certified and self.p > self.threshold:
            if self.p_floor > self.threshold:
                out.append(f"too few complete {self._unit}s left to reach p <= {self.threshold:.2g}")
            out.append(self._noise())
            out += self._power()
        if self.failed or self.default_failed:
            out.append(f"failed launches counted as twice the worst value seen: {self.failed} of "
                       f"{self.claim.config}, {self.default_failed} of default")
        if self.dropped:
            out.append(f"{self.dropped} incomplete {self._unit}{'s' if self.dropped != 1 else ''} left out")
        if self.zeros:
            out.append(f"{self.zeros} {self._unit}{'s' if self.zeros != 1 else ''} with no difference (no sign) "
                       "left out of p")
        if self.note:
            out.append(self.note)
        return out

    def _evidence(self) -> str:
        ci = ""
        if self.ratio_ci is not None:
            ci = f", {self.ci_level:.1%} interval {self.ratio_ci[0]:.3f}-{self.ratio_ci[1]:.3f}"
        return (f"ratio {self.ratio:.3f} (Hodges-Lehmann{ci}), p = {self.p:.2g} (needed <= {self.threshold:.2g}; "
                f"smallest attainable {self.p_floor:.2g}), paired signed-rank test over {self.rounds} "
                f"{self._unit}{'s' if self.rounds != 1 else ''}")

    def _unreachable(self) -> str:
        if self.rounds_to_certify is None:
            return f"no p at or below {self.threshold:.2g} exists with these launches"
        if self.claim.reason == SIZES_REASON:  # stage 1 is not extended: a new run plans enough trials
            return (f"{self.rounds or 0} complete trials cannot reach p <= {self.threshold:.2g} at all; "
                    f"{self.rounds_to_certify} can (a new --certify-sizes run plans them)")
        if not self.rounds:
            return (f"it needs {self.rounds_to_certify} rounds: commdiag confirm RUN_DIR --rounds "
                    f"{self.rounds_to_certify}")
        more = max(1, self.rounds_to_certify - (self.rounds or 0) + self.zeros)
        return (f"{self.rounds} rounds cannot reach p <= {self.threshold:.2g} at all; "
                f"{self.rounds_to_certify} rounds can: commdiag confirm RUN_DIR --rounds {more}"
                + (f" (that look is tested at {self.next_threshold:.2g})"
                   if self.next_threshold is not None and self.next_threshold < self.threshold else ""))

    def _noise(self) -> str:
        if self.states:
            return "launches fall into two states, about {:.4g} and {:.4g} us".format(*self.states)
        if self.noise is None:
            return "launch noise unknown"
        return f"within-{self._unit} noise {self.noise * 100:.1f}% (sd of the {self._unit}s' log-ratios)"

    def _power(self) -> list[str]:
        effect = self._screened
        if self.noise is None or not effect:
            return []
        r = self.claim.screening_ratio
        said = f"{abs(r - 1) * 100:.1f}% {'faster' if r < 1 else 'slower'}"
        if effect <= paired.FASTER_EDGE:
            return [f"the screening estimate ({said}) is within the {MIN_EFFECT * 100:.0f}% worth a change: "
                    f"more {self._unit}s would not make it a claim"]
        n = self.launches_needed
        if n is None:
            return [f"an effect of {said} cannot be certified at this noise at any cost"]
        out = [f"if the true effect were the screening estimate's {said}"
               + f", about {n} launches per arm would give 80% power at this noise"]
        if n > SANE_LAUNCHES:
            out.append("an effect this small cannot be certified at a sane cost on this machine")
        return out

    @property
    def text(self) -> str:
        """One line (JSON, HTML): the headline, then the statistics."""
        return f"{self.headline}: " + "; ".join(self.details)

    def lines(self, indent: str = "  ", width: int = WIDTH) -> list[str]:
        """The console form: "<claim>: <headline>", then the statistics wrapped and indented under it."""
        wrap = dict(width=width, break_on_hyphens=False, break_long_words=True)
        out = textwrap.wrap(f"{self.claim.label}: {self.headline}", initial_indent=indent,
                            subsequent_indent=indent + "    ", **wrap)
        return out + textwrap.wrap("; ".join(self.details), initial_indent=indent + "    ",
                                   subsequent_indent=indent + "    ", **wrap)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(certified=self.certified, reachable=self.reachable, launches_needed=self.launches_needed,
                 headline=self.headline, text=self.text)
        return d


def _us(vals) -> tuple[float, ...]:
    return tuple(round(math.exp(v), 4) for v in vals)


def _sd(vals) -> float | None:
    if len(vals) < 2:
        return None
    m = stats.mean(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


def test_claim(claim: Claim, xs: dict[int, float | None], ys: dict[int, float | None], *, thr: float, look: int,
               eligible: bool, planned: int = 0, next_thr: float | None = None) -> Certification:
    """One claim from stage-2 values by round (round -> ln value; None: that launch failed) of the config
    (xs) and default (ys): the paired signed-rank test over the rounds with both launches, a failed one
    counted as twice the worst value seen (paired.with_failures: a failure is evidence against its
    config); a faster typical launch whose mean time is no lower is not certified (a tail: module
    docstring).  ``planned``: the rounds the plan ran (those missing a launch are counted as left out);
    ``next_thr``: the threshold of a further look (for the "not certifiable with this plan" hint)."""
    rounds, d, _ = paired.with_failures(xs, ys, +1)
    worst = None if not rounds else max(v for v in list(xs.values()) + list(ys.values()) if v is not None) \
        + math.log(paired.FAILED_FACTOR)
    x = [worst if xs[r] is None else xs[r] for r in rounds]
    y = [worst if ys[r] is None else ys[r] for r in rounds]
    failed = dict(failed=sum(xs[r] is None for r in rounds), default_failed=sum(ys[r] is None for r in rounds))
    dropped = max(planned, len(set(xs) | set(ys))) - len(rounds)
    signed = paired.nonzero_rounds(d)
    floor = paired.smallest_p(signed, claim.alternative)
    need_thr = next_thr if next_thr is not None else thr
    to_certify = paired.rounds_to_reach(need_thr, claim.alternative)
    common = dict(rounds=len(rounds), dropped=dropped, zeros=len(rounds) - signed,
                  plan_reaches=reachable(claim, max(planned, len(rounds)), thr),
                  rounds_to_certify=to_certify, next_threshold=next_thr)
    if not rounds:
        note = (f"{claim.config} was not launched: the plan's rounds cannot reach p <= {thr:.2g}"
                if not common["plan_reaches"] else f"no complete stage-2 round of {claim.config} and default")
        return Certification(claim, look, thr, _us(x), _us(y), None, floor, None, NOT_CERTIFIED, PAIRED, None, None,
                             None, eligible, note, **failed, **common)
    p = paired.signed_rank_p(d, claim.alternative)
    ratio = math.exp(paired.hodges_lehmann(d))
    tail = thr / 2 if claim.alternative == TWO_SIDED else thr
    ci = paired.interval(d, tail)
    trend = stats.drift([(r, ys[r]) for r in rounds])
    my = stats.median(y)
    states = stats.two_states([v - stats.median(x) for v in x] + [v - my for v in y])
    result = decide(p, ratio, thr, claim.alternative)
    mean_ratio = sum(math.exp(v) for v in x) / sum(math.exp(v) for v in y)
    tailed = result == FASTER and mean_ratio >= 1.0  # the typical launch is faster, the mean time is not
    if result == FASTER and failed["failed"] > failed["default_failed"]:  # never faster while it fails more
        result = NOT_CERTIFIED
    return Certification(claim, look, thr, _us(x), _us(y), p, floor, ratio,
                         NOT_CERTIFIED if tailed else result, PAIRED, _sd(d),
                         tuple(round(math.exp(my + s), 4) for s in states) if states else None, trend, eligible,
                         ratio_ci=(math.exp(ci[0]), math.exp(ci[1])) if ci else None,
                         ci_level=1 - 2 * tail if ci else None, mean_ratio=mean_ratio, tail=tailed,
                         **failed, **common)


def _groups(values: list[stats.LaunchValue], claim: Claim, band_sizes: dict[str, list[int]],
            cache: dict) -> dict[str, dict[int, float]]:
    """{config: {launch: value}} of the claim's band (or size) and mode."""
    if claim.band is not None:
        key = (claim.mode, claim.band)
        if key not in cache:
            cache[key] = band_values(values, band_sizes.get(claim.band, []), claim.mode)
        return cache[key]
    groups: dict[str, dict[int, float]] = {}
    for v in values:
        if v.mode == claim.mode and v.size_bytes == claim.size_bytes:
            groups.setdefault(v.config, {})[v.launch] = v.value
    return groups


def by_round(launch_values: dict[int, float], round_of: dict[int, int]) -> dict[int, float]:
    """launch -> value as round -> value (launches without a round are left out)."""
    return {round_of[l]: v for l, v in launch_values.items() if l in round_of}


def certify(plan: dict, values: list[stats.LaunchValue], band_sizes: dict[str, list[int]],
            round_of: dict[int, int], excluded: dict[str, str],
            failed: dict[int, str] | None = None) -> list[Certification]:
    """Every claim of ``plan`` tested on the stage-2 values (all rounds of all looks so far);
    ``round_of``: stage-2 launch -> its round; ``failed``: stage-2 launch -> config of every launch that
    failed, timed out or gave wrong sums (counted as its config's worst value, not left out)."""
    failed_rounds: dict[str, set[int]] = {}
    for launch, config in (failed or {}).items():
        if launch in round_of:
            failed_rounds.setdefault(config, set()).add(round_of[launch])

    def with_failed(config: str, got: dict[int, float]) -> dict[int, float | None]:
        return {**{r: None for r in failed_rounds.get(config, ())}, **got}

    values = [v for v in values if v.stage == 2]
    looks = plan.get("looks", [])
    look = len(looks) or 1
    thr = looks[-1]["threshold"] if looks else threshold(plan.get("alpha", ALPHA), plan.get("family_size", 0))
    planned = total_rounds(plan)
    nxt = next_threshold(plan) if looks else None
    out = []
    cache: dict = {}
    for claim in claims_of(plan):
        groups = _groups(values, claim, band_sizes, cache)
        out.append(test_claim(claim, with_failed(claim.config, by_round(groups.get(claim.config, {}), round_of)),
                              with_failed(DEFAULT, by_round(groups.get(DEFAULT, {}), round_of)), thr=thr, look=look,
                              eligible=claim.config not in excluded, planned=planned,
                              next_thr=None if nxt is None or reachable(claim, planned, thr) else nxt))
    return out


def band_ratio(values: list[stats.LaunchValue], config: str, mode: str, sizes: list[int],
               round_of: dict[int, int]) -> float | None:
    """Paired Hodges-Lehmann ratio of ``config`` against default over ``sizes`` from stage-2 rounds."""
    groups = band_values([v for v in values if v.stage == 2], sizes, mode)
    xs, ys = by_round(groups.get(config, {}), round_of), by_round(groups.get(DEFAULT, {}), round_of)
    d = [xs[r] - ys[r] for r in sorted(set(xs) & set(ys))]
    return math.exp(paired.hodges_lehmann(d)) if d else None


# ---------------------------------------------------------------- per-size certification (one stage)

def size_claims_needed(configs: int, sizes: int, alpha: float = ALPHA) -> tuple[int, int]:
    """(family size, trials per config) for one-stage per-size certification of every config x size:
    the fewest trials (paired rounds) at which the two-sided paired test can reach alpha / M."""
    m = max(1, configs * sizes)
    return m, paired.rounds_to_reach(alpha / m, TWO_SIDED)


def certify_sizes(screening: Screening, values: list[stats.LaunchValue], trial_of: dict[int, int],
                  alpha: float = ALPHA / 2, trials: int = 0) -> list[Certification]:
    """``--certify-sizes``: every config x size in the primary mode tested two-sided on the stage-1
    launches (no screening selection, so no fresh launches needed), Bonferroni over them all.

    Paired by trial, as stage 2 is by round: stage 1 shuffles the configs within each trial
    (formats.spec.launch_order), so the test that matches that randomization is the paired
    signed-rank test on each trial's log-ratio (config vs default in the same trial); an unpaired
    test over all launches is exposed to position effects inside a trial.  ``trial_of``: stage-1
    launch -> its trial; ``trials``: the trials the run planned (missing ones are counted as left
    out).  The run's 1% is split: half for this family, half for stage 2's band claims
    (stages.plan_stage2), so that any false certification in the run stays at or below 1%."""
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
        claim = Claim(c, mode, None, s, TWO_SIDED, SIZES_REASON, est.ratio if est else None)
        out.append(test_claim(claim, by_round(by[s][c], trial_of), by_round(by[s].get(DEFAULT, {}), trial_of),
                              thr=thr, look=1, eligible=c not in screening.excluded, planned=trials))
    return out


